"""deploy/audit-dependencies audits every lock file of the repository: a new one, of any kind,
cannot be left out of the release audit unnoticed."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
