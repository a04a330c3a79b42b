"""The user-queue lock has one owner: a typo'd second copy would silently split the lock."""

from __future__ import annotations

import re
from pathlib import Path

SERVICE_ROOT = Path(__file__).resolve().parents[2] / "queue_service"
LOCK_OWNER = SERVICE_ROOT / "store" / "locks.py"
ADVISORY = re.compile(r"pg_(try_)?advisory", re.IGNORECASE)
# The namespace, and near-miss spellings of it that would split the lock.
NAMESPACE = re.compile(r"analysis[-_ ]?queue\s*[:/-]", re.IGNORECASE)


def _sources() -> list[Path]:
    return [p for p in SERVICE_ROOT.rglob("*") if p.suffix in (".py", ".sql") and "_gen" not in p.parts]


def test_only_the_lock_helper_takes_advisory_locks_or_spells_the_namespace() -> None:
    offenders = []
    for path in _sources():
        if path == LOCK_OWNER:
            continue
        text = path.read_text()
        for pattern in (ADVISORY, NAMESPACE):
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                offenders.append(f"{path.relative_to(SERVICE_ROOT.parent)}:{line}: {match.group(0)!r}")
    assert offenders == []


def test_the_lock_helper_builds_the_key_exactly_once() -> None:
    text = LOCK_OWNER.read_text()
    assert text.count("'analysis_queue:' || ") == 1
    # The locked sections (one user's, several users'), and the plain hold build the key with that
    # one function; the migration lock has its own.
    assert text.count('pg_advisory_xact_lock(" + _user_queue_key(') == 3
    assert text.count("pg_advisory_xact_lock(hashtextextended('analysis_queue_migrations', 0))") == 1
    # The fleet-wide capacity lock: one key, built once, taken by one wrapper.
    assert text.count("'analysis_queue_capacity'") == 1
    assert text.count('pg_advisory_xact_lock(" + _CAPACITY_KEY + ")') == 2  # the section's, and the plain hold
    # A batch of completions only tries it (never waits for it while holding users' locks).
    assert text.count('pg_try_advisory_xact_lock(" + _CAPACITY_KEY + ")') == 1
    assert len(re.findall(r"pg_try_advisory_xact_lock\(", text)) == 1
    assert len(re.findall(r"(?<!try_)pg_advisory_xact_lock\(", text)) == 6
    assert "pg_advisory_lock(" not in text  # transaction-scoped only, never session locks


def test_the_scan_catches_a_typo(tmp_path: Path) -> None:
    sample = "SELECT pg_advisory_xact_lock(hashtextextended('analysis-queue:' || $1, 0))"
    assert ADVISORY.search(sample) and NAMESPACE.search(sample)
