"""deploy/audit-dependencies audits every lock file of the repository: a new one, of any kind,
cannot be left out of the release audit unnoticed. And the tools the release and CI scripts
install (pip-audit, pip-tools, cargo-audit, Node) are pinned and checked like every dependency:
an install that could fetch something unpinned fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.repository.files import locked

ROOT = Path(__file__).resolve().parents[2]
# Names package managers give their lock files; any of them in the repository must be audited.
LOCK_FILE_NAMES = (
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "Cargo.lock",
    "poetry.lock",
    "Pipfile.lock",
    "uv.lock",
    "go.sum",
    "Gemfile.lock",
    "composer.lock",
)


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()


def test_the_audit_lists_every_lock_file_of_the_repository() -> None:
    listed = subprocess.run(
        [str(ROOT / "deploy" / "audit-dependencies"), "--list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    lock_files = [
        path
        for path in _tracked()
        if Path(path).name in LOCK_FILE_NAMES or (Path(path).name.startswith("requirements") and path.endswith(".lock"))
    ]
    assert sorted(listed) == sorted(lock_files)
    assert {"requirements.lock", "requirements-dev.lock", "console/package-lock.json", "clients/rust/Cargo.lock"} <= set(listed)


# -- the tools the release and CI scripts install are pinned with hashes, like every dependency --

SCRIPTS = ("deploy", ".ci")
# Installs of the project itself (its dependencies are in place from a lock by then): after the
# hash-checked install, and the README's quick-start command, which CI runs to prove it works.
PROJECT_INSTALLS = ("pip install -q --no-deps --no-build-isolation -e .", "pip install -e '.[dev]'")
# `pip install`, also as `"$TOOL/venv/bin/pip" install` and `python3 -m pip install`.
_PIP_INSTALL = re.compile(r"\bpip3?[\"']?\s+install\b")
_INTEGRITY = re.compile(r"^  \[(x64|arm64)\]=(sha512-[A-Za-z0-9+/]{86}==)$", re.MULTILINE)


def _commands(path: str) -> list[str]:
    """The script's lines, continuations joined, comments left out."""
    text = (ROOT / path).read_text(errors="replace").replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _script_lines() -> list[tuple[str, str]]:
    scripts = [p for p in _tracked() if p.split("/")[0] in SCRIPTS and not p.endswith((".md", ".yaml", ".in", ".lock"))]
    return [(path, line) for path in scripts for line in _commands(path)]


def test_every_pip_install_of_a_script_is_hash_checked() -> None:
    unpinned = [
        f"{path}: {line}"
        for path, line in _script_lines()
        if _PIP_INSTALL.search(line) and "--require-hashes" not in line and not any(allowed in line for allowed in PROJECT_INSTALLS)
    ]
    assert unpinned == []


@pytest.mark.parametrize(
    ("lock", "requirements"),
    [("deploy/requirements-audit.lock", "deploy/audit-tools.in"), ("deploy/requirements-pip-tools.lock", "deploy/pip-tools.in")],
)
def test_the_tool_locks_pin_their_tool_and_everything_it_needs_with_hashes(lock: str, requirements: str) -> None:
    pins = locked(lock)
    assert pins and all(hashes > 0 for _, hashes in pins.values()), f"{lock}: a pin without hashes"
    for line in _commands(requirements):
        name, _, version = line.partition("==")
        assert pins[canonicalize_name(name)][0] == version, f"{lock} does not pin {line}"
    assert "pip" in pins  # the tool's venv installs nothing beside the lock
    script = {
        "deploy/requirements-audit.lock": "deploy/audit-dependencies",
        "deploy/requirements-pip-tools.lock": "deploy/lock-dependencies",
    }[lock]
    installs = [line for path, line in _script_lines() if path == script and _PIP_INSTALL.search(line)]
    assert installs and all("--require-hashes --no-deps -r" in line for line in installs), installs
    assert lock in (ROOT / script).read_text() and lock in (ROOT / "deploy" / "lock-dependencies").read_text()


def test_cargo_audit_is_installed_at_its_pinned_version_with_its_lock_file() -> None:
    script = (ROOT / "deploy" / "audit-dependencies").read_text()
    version = re.search(r"^CARGO_AUDIT_VERSION=(\d+\.\d+\.\d+)$", script, re.MULTILINE)
    assert version, "deploy/audit-dependencies pins no CARGO_AUDIT_VERSION"
    installs = [f"{path}: {line}" for path, line in _script_lines() if "cargo install" in line]
    assert installs
    unpinned = [line for line in installs if "--locked" not in line or '--version "=$CARGO_AUDIT_VERSION"' not in line]
    assert unpinned == []


def test_ci_takes_node_only_from_a_tarball_checked_against_its_recorded_integrity() -> None:
    lines = _script_lines()
    assert not [f"{path}: {line}" for path, line in lines if "node-linux-" in line and path != ".ci/install-node"]
    assert any(path == ".ci/run" and ".ci/install-node" in line for path, line in lines)
    installer = (ROOT / ".ci" / "install-node").read_text()
    assert {arch for arch, _ in _INTEGRITY.findall(installer)} == {"x64", "arm64"}
    assert 'if [ "$actual" != "$expected" ]' in installer and installer.index("$actual") < installer.index("tar -xzf")
    assert "npm install" not in installer  # npm pack fetches the tarball; nothing is installed unchecked
