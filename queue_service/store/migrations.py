"""Versioned SQL migrations, applied in one transaction under an advisory lock.

Why our own runner and not yoyo or alembic: PostgreSQL runs DDL inside transactions, so the
whole upgrade (lock, every pending file, the version rows) can be one transaction that either
lands completely or not at all, and the migration lock is transaction-scoped like every other
lock in the service. The libraries open their own connections and transactions per migration,
which would leave the lock on a separate session. The runner is small: files
`sql/migrations/NNNN_name.sql`, applied in order, recorded with a checksum so an edited,
already-applied migration is refused instead of silently diverging.

A fresh database (no migration recorded) does not replay them: it installs `sql/baseline.sql`,
the tables, indexes and rows the numbered migrations up to the baseline's leave (generated from a
database they built, `tests/integration/schema_tool.py`), records those migrations as applied
with the checksums a replay records, then applies the migrations after the baseline's number.
The numbered migrations stay only to upgrade existing databases; the superseded function texts
in them never run on a new one.

After them, in the same transaction and under the same lock, the repeatable step: each function,
trigger and view the code uses has one file, `sql/functions/<name>.sql` (its current definition
and why), re-applied whenever its text changes, like Flyway's R__ files. A file's checksum is
recorded in `queue_schema_functions` with every text it ever had, so a replica can tell a text
it brings that was never applied (pending) from an older one (the deploy it overlaps).
`sql/functions/README.md` has the rules.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Iterable
from importlib import resources
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from queue_service.store.locks import with_migration_lock

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
# The baseline's header line naming the last migration it stands for.
_BASELINE_STANDS_FOR = re.compile(r"^-- Stands for migrations 0001-(?P<version>\d{4})\b", re.MULTILINE)

_CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS queue_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


_FUNCTION_FILE = re.compile(r"^(?P<name>[a-z0-9_]+)\.sql$")
_REQUIRES = re.compile(r"^-- requires: (?P<names>.+)$", re.MULTILINE)

# Every text a file ever had (its history), the latest applied being the one in force.
_CREATE_FUNCTIONS_TABLE = """
CREATE TABLE IF NOT EXISTS queue_schema_functions (
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (name, checksum)
)
"""


class MigrationError(RuntimeError):
    """The database holds a migration history this code does not match."""


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class FunctionFile:
    """One `sql/functions/<name>.sql`: the objects it defines, re-created by its whole text."""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def requires(self) -> tuple[str, ...]:
        """The files whose objects its CREATE needs (`-- requires: a, b` lines in the file)."""
        return tuple(name.strip() for match in _REQUIRES.finditer(self.sql) for name in match["names"].split(","))


@dataclasses.dataclass(frozen=True)
class Baseline:
    """`sql/baseline.sql`: what the numbered migrations up to `version` leave, without function,
    trigger or view (those come from the function files, applied after it)."""

    version: int
    sql: str


@dataclasses.dataclass(frozen=True)
class Applied:
    """What one `migrate` call applied: migration versions, then function files by name."""

    versions: list[int]
    function_files: list[str]


def function_files() -> list[FunctionFile]:
    """Every function file, each after the files it requires, otherwise by name."""
    folder = resources.files("queue_service.store").joinpath("sql/functions")
    found = {}
    for entry in folder.iterdir():
        match = _FUNCTION_FILE.match(entry.name)
        if match:
            found[match["name"]] = FunctionFile(match["name"], entry.read_text())
    return _in_dependency_order(found)


def _in_dependency_order(files: dict[str, FunctionFile]) -> list[FunctionFile]:
    ordered: list[FunctionFile] = []
    placed: set[str] = set()

    def place(name: str, path: Iterable[str]) -> None:
        if name in placed:
            return
        if name in path:
            raise MigrationError(f"function files require each other in a circle: {' -> '.join([*path, name])}")
        for needed in files[name].requires:
            if needed not in files:
                raise MigrationError(f"functions/{name}.sql requires {needed!r}, which has no file")
            place(needed, [*path, name])
        placed.add(name)
        ordered.append(files[name])

    for name in sorted(files):
        place(name, [])
    return ordered


def baseline() -> Baseline:
    text = resources.files("queue_service.store").joinpath("sql/baseline.sql").read_text()
    match = _BASELINE_STANDS_FOR.search(text)
    if match is None:
        raise MigrationError("sql/baseline.sql does not say which migration it stands for ('-- Stands for migrations 0001-NNNN')")
    return Baseline(int(match["version"]), text)


def available_migrations() -> list[Migration]:
    folder = resources.files("queue_service.store").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match["version"]), match["name"], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    # Migrations apply in their order, each on the schema the ones before it left: a gap would
    # let a later one run before the one it was written after.
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration versions must be 1..n without gaps, found {versions}")
    return found


async def migrate(dsn: str) -> list[int]:
    """Applies every pending migration, then every changed function file; returns the versions
    applied by this call."""
    return (await migrate_all(dsn)).versions


async def migrate_all(dsn: str, *, from_baseline: bool = True) -> Applied:
    """`migrate`, saying which function files it applied too. With `from_baseline=False` a fresh
    database replays every numbered migration instead of installing the baseline: how the
    baseline is generated, and how the tests prove the two paths build the same schema."""
    migrations = available_migrations()
    files = function_files()
    start = baseline() if from_baseline else None
    if start is not None and start.version > len(migrations):
        raise MigrationError(f"sql/baseline.sql stands for migration {start.version:04d}, which has no file")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        async with with_migration_lock(conn):
            await conn.execute(_CREATE_VERSION_TABLE)
            applied = await _applied(conn)
            newly_applied = []
            if not applied and start is not None:
                log.info("installing the baseline of migrations 0001-%04d", start.version)
                await conn.execute(start.sql)
                for migration in migrations[: start.version]:
                    await _record(conn, migration)
                    newly_applied.append(migration.version)
                applied = await _applied(conn)
            for migration in migrations:
                known = applied.get(migration.version)
                if known is not None:
                    if known != migration.checksum:
                        raise MigrationError(f"migration {migration.version:04d}_{migration.name} was edited after it was applied")
                    continue
                log.info("applying migration %04d_%s", migration.version, migration.name)
                await conn.execute(migration.sql)
                await _record(conn, migration)
                newly_applied.append(migration.version)
            unknown = sorted(set(applied) - {m.version for m in migrations})
            if unknown:
                # A newer replica migrated further; older code keeps working on the newer schema
                # (migrations stay backward compatible for one release), so this is only noted.
                log.warning("database has migrations this code does not know: %s", unknown)
                # Its function files are newer than ours too; ours would undo them.
                return Applied(newly_applied, [])
            applied_files = await _apply_function_files(conn, files)
    return Applied(newly_applied, applied_files)


async def _apply_function_files(conn: AsyncConnection[Any], files: list[FunctionFile]) -> list[str]:
    """Every file whose text is not the one in force, recorded in its history; their names."""
    await conn.execute(_CREATE_FUNCTIONS_TABLE)
    in_force = await _function_checksums(conn, latest_only=True)
    applied_files = []
    for file in files:
        if in_force.get(file.name) == {file.checksum}:
            continue
        log.info("applying functions/%s.sql", file.name)
        await conn.execute(file.sql)
        await conn.execute(
            "INSERT INTO queue_schema_functions (name, checksum) VALUES (%s, %s)"
            " ON CONFLICT (name, checksum) DO UPDATE SET applied_at = clock_timestamp()",
            (file.name, file.checksum),
        )
        applied_files.append(file.name)
    return applied_files


async def _record(conn: AsyncConnection[Any], migration: Migration) -> None:
    """The row a migration leaves, whether it ran or the baseline stands for it."""
    await conn.execute(
        "INSERT INTO queue_schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
        (migration.version, migration.name, migration.checksum),
    )


async def pending_migrations(conn: AsyncConnection[Any]) -> list[str]:
    """Migrations (`0027_name`) and function files (`functions/name.sql`) not yet applied; empty
    when the schema is current. Used by a replica's start-up check. A function file whose text
    was applied once is not pending even when a newer text is in force: that is the deploy this
    replica overlaps, and a newer text keeps the old one's meaning (sql/functions/README.md)."""
    migrations = available_migrations()
    applied = await _applied(conn) if await _table_exists(conn, "queue_schema_migrations") else {}
    pending = [f"{m.version:04d}_{m.name}" for m in migrations if m.version not in applied]
    if set(applied) - {m.version for m in migrations}:
        return pending  # a newer replica migrated further: its function files serve ours
    ever_applied = await _function_checksums(conn, latest_only=False) if await _table_exists(conn, "queue_schema_functions") else {}
    pending += [f"functions/{f.name}.sql" for f in function_files() if f.checksum not in ever_applied.get(f.name, set())]
    return pending


async def _table_exists(conn: AsyncConnection[Any], table: str) -> bool:
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute("SELECT to_regclass(%s) IS NOT NULL AS present", (table,))
    row = await cursor.fetchone()
    return bool(row and row["present"])


async def _function_checksums(conn: AsyncConnection[Any], *, latest_only: bool) -> dict[str, set[str]]:
    """Per function file, the checksum in force (`latest_only`) or every checksum it ever had."""
    cursor = conn.cursor(row_factory=dict_row)
    if latest_only:
        await cursor.execute("SELECT DISTINCT ON (name) name, checksum FROM queue_schema_functions ORDER BY name, applied_at DESC")
    else:
        await cursor.execute("SELECT name, checksum FROM queue_schema_functions")
    found: dict[str, set[str]] = {}
    for row in await cursor.fetchall():
        found.setdefault(row["name"], set()).add(row["checksum"])
    return found


async def _applied(conn: AsyncConnection[Any]) -> dict[int, str]:
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute("SELECT version, checksum FROM queue_schema_migrations")
    return {row["version"]: row["checksum"] for row in await cursor.fetchall()}
