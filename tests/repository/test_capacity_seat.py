"""The capacity seat has one owner (store/sql/functions/README.md, "The capacity seat"): only the
`queue_seat_*` functions write a job's place at the core's capacity. A writer elsewhere is how a
transition learns nothing of what another promised (a BEFORE trigger finished three functions'
rows until 0039), so every SQL text of the service is scanned, as the lock scan does for advisory
locks. The one exception is the statement creating a PENDING row, which takes the seat's values
from `queue_seat_on_entry` in that same statement."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SERVICE_ROOT = Path(__file__).resolve().parents[2] / "queue_service"
SEAT_COLUMNS = (
    "capacity_wait_since",
    "capacity_token",
    "capacity_turn_key",
    "capacity_turn_before",
    "release_turn_attempt",
    # The release's fence and timer (since 0040).
    "release_attempts",
    "next_release_at",
    "release_deadline",
)
_COLUMN = "|".join(SEAT_COLUMNS)
# An assignment in an UPDATE's SET list (unqualified, after SET or a comma), a trigger's
# `NEW.x :=`, or an INSERT naming the column.
_SET = re.compile(rf"(?:\bSET|,)\s*(?P<column>{_COLUMN})\s*=(?!=)\s*(?P<value>\w*)", re.IGNORECASE)
_NEW = re.compile(rf"\bNEW\s*\.\s*(?P<column>{_COLUMN})\s*:=", re.IGNORECASE)
_INSERT = re.compile(r"\bINSERT\s+INTO\s+(?:public\.)?analysis_jobs\s*\((?P<columns>[^)]*)\)", re.IGNORECASE)
_TAKES_THE_ENTRY = "queue_seat_on_entry("
# A value the seat computes, taken by the writer in its own statement (the exit from PENDING, a
# cancel's due time): the seat decides it.
_SEAT_VALUE = re.compile(r"queue_seat_\w+$", re.IGNORECASE)


def _sources() -> list[Path]:
    # The numbered migrations are history: they upgrade old databases and are never edited.
    return [
        p
        for p in SERVICE_ROOT.rglob("*")
        if p.suffix in (".py", ".sql") and "_gen" not in p.parts and "migrations" not in p.parts and "__pycache__" not in p.parts
    ]


def _is_owner(path: Path) -> bool:
    return path.suffix == ".sql" and path.parent.name == "functions" and path.name.startswith("queue_seat_")


def seat_writes(text: str) -> list[tuple[int, str]]:
    """Each write of a seat column in `text` (a SQL file, or Python holding SQL) as (line, column),
    except in a statement that takes the seat from `queue_seat_on_entry` and a value a seat
    function computes (`SET next_release_at = queue_seat_on_exit()`)."""
    code = re.sub(r"--[^\n]*", lambda m: " " * len(m.group(0)), text)  # comments out, offsets kept
    found = []
    start = 0
    for statement in code.split(";"):
        if _TAKES_THE_ENTRY not in statement:
            hits = [(m.start("column"), m.group("column")) for m in _NEW.finditer(statement)]
            hits += [(m.start("column"), m.group("column")) for m in _SET.finditer(statement) if not _SEAT_VALUE.match(m.group("value"))]
            for insert in _INSERT.finditer(statement):
                named = {c.strip().lower() for c in insert.group("columns").split(",")}
                hits += [(insert.start(), column) for column in SEAT_COLUMNS if column in named]
            found += [(code.count("\n", 0, start + at) + 1, column) for at, column in hits]
        start += len(statement) + 1
    return sorted(found)


def _sql_of(path: Path) -> list[tuple[int, str]]:
    """The SQL texts of a file with the line each starts on: a .sql file whole, a Python module's
    string literals (its keyword arguments named like a column are no SQL)."""
    text = path.read_text()
    if path.suffix == ".sql":
        return [(1, text)]
    return [
        (node.lineno, node.value) for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_only_the_seat_functions_write_the_seat() -> None:
    offenders = [
        f"{path.relative_to(SERVICE_ROOT.parent)}:{first + line - 1}: {column}"
        for path in _sources()
        if not _is_owner(path)
        for first, sql in _sql_of(path)
        for line, column in seat_writes(sql)
    ]
    assert offenders == []


def test_no_trigger_finishes_a_row_behind_its_writer_on_the_seat() -> None:
    owners = list((SERVICE_ROOT / "store" / "sql" / "functions").glob("queue_seat_*.sql"))
    assert len(owners) >= 8, "the seat's functions moved; update this test"
    for path in owners:
        assert "RETURNS trigger" not in path.read_text(), path


def test_the_scan_catches_each_kind_of_write_and_passes_reads() -> None:
    assert seat_writes("UPDATE analysis_jobs\n   SET status = 'pending',\n       capacity_token = NULL\n WHERE job_id = $1;") == [
        (3, "capacity_token")
    ]
    assert seat_writes("BEGIN\n    NEW.capacity_wait_since := v_now;\nEND") == [(2, "capacity_wait_since")]
    assert seat_writes("INSERT INTO analysis_jobs (job_id, release_turn_attempt) VALUES ($1, 1);") == [(1, "release_turn_attempt")]
    # Reads and comparisons, in a WHERE or a CASE, and a comment, are no writes.
    assert seat_writes("SELECT 1 FROM analysis_jobs h WHERE h.capacity_token = s AND capacity_wait_since IS NULL;") == []
    assert seat_writes("UPDATE analysis_jobs SET x = CASE WHEN release_attempts = release_turn_attempt THEN 1 END;") == []
    assert seat_writes("-- SET capacity_token = NULL\nSELECT 1;") == []
    # The release's fence and timer are the seat's too; a value the seat computes is its own.
    assert seat_writes("UPDATE analysis_jobs SET release_attempts = release_attempts + 1, next_release_at = now();") == [
        (1, "next_release_at"),
        (1, "release_attempts"),
    ]
    assert seat_writes("UPDATE analysis_jobs SET status = 'running', next_release_at = queue_seat_on_exit();") == []
    # The statement creating a PENDING row takes the seat from its owner.
    assert (
        seat_writes(
            "UPDATE analysis_jobs j SET capacity_turn_key = seat.capacity_turn_key FROM queue_seat_on_entry(u, true, n, n, 1) AS seat;"
        )
        == []
    )
