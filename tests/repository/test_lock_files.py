"""The hash-locked dependency files stay true to pyproject.toml, and CI and the image install from
them: every dependency (runtime in requirements.lock, runtime and `dev` in requirements-dev.lock)
is pinned at a version its range allows, with hashes; the two files agree on what they share;
pip and the build backend are locked too; no machine's index or paths leak into them.
After a change to pyproject.toml's dependencies, `deploy/lock-dependencies` makes these pass."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.repository.files import MACHINE_PATH, locked

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKS = ("requirements.lock", "requirements-dev.lock")


def _check_pinned(requirements: list[str], lock: str) -> list[str]:
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name not in locked(lock):
            problems.append(f"{lock}: {requirement.name} is not locked (run deploy/lock-dependencies)")
            continue
        version, hashes = locked(lock)[name]
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{lock}: {requirement.name}=={version} is outside pyproject.toml's {requirement.specifier}")
        if hashes == 0:
            problems.append(f"{lock}: {requirement.name} has no hash")
    return problems


def test_every_dependency_is_locked_with_hashes_at_a_version_pyproject_allows() -> None:
    runtime = PYPROJECT["project"]["dependencies"]
    dev = PYPROJECT["project"]["optional-dependencies"]["dev"]
    tools = PYPROJECT["build-system"]["requires"] + ["pip"]
    problems = _check_pinned(runtime + tools, "requirements.lock") + _check_pinned(runtime + dev + tools, "requirements-dev.lock")
    assert problems == []
    for lock in LOCKS:
        assert all(hashes > 0 for _, hashes in locked(lock).values()), f"{lock}: a pin without hashes"


def test_the_dev_lock_runs_the_versions_the_image_ships() -> None:
    runtime, dev = locked("requirements.lock"), locked("requirements-dev.lock")
    different = {name: (version, dev[name][0]) for name, (version, _) in runtime.items() if dev.get(name, (version,))[0] != version}
    assert different == {}
    assert set(runtime) <= set(dev)


@pytest.mark.parametrize("lock", [*LOCKS, "deploy/requirements-audit.lock", "deploy/requirements-pip-tools.lock"])
def test_a_lock_file_names_no_index_and_no_path_of_a_machine(lock: str) -> None:
    text = (ROOT / lock).read_text()
    assert not re.search(r"^\s*-(-index-url|-extra-index-url|-find-links|-trusted-host|i |f )", text, re.MULTILINE)
    assert not re.search(r"(https?://|/tmp/)", text) and not MACHINE_PATH.search(text)


def test_ci_and_the_image_install_from_the_lock_files_with_hashes() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".venv/bin/pip install -q --require-hashes -r requirements-dev.lock" in ci
    assert "pip install -q --no-deps --no-build-isolation -e ." in ci
    assert "--upgrade pip" not in ci
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --quiet --require-hashes -r requirements.lock" in dockerfile
    assert "pip install --quiet --no-deps --no-build-isolation ." in dockerfile
    assert "!requirements.lock" in (ROOT / ".dockerignore").read_text().splitlines()
