"""Versioned SQL migrations, applied in one transaction under an advisory lock.

Why our own runner and not yoyo or alembic: PostgreSQL runs DDL inside transactions, so the
whole upgrade (lock, every pending file, the version rows) can be one transaction that either
lands completely or not at all, and the migration lock is transaction-scoped like every other
lock in the service. The libraries open their own connections and transactions per migration,
which would leave the lock on a separate session. The runner is small: files
`sql/migrations/NNNN_name.sql`, applied in order, recorded with a checksum so an edited,
already-applied migration is refused instead of silently diverging.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from importlib import resources
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from queue_service.store.locks import with_migration_lock

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")

_CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS queue_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
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


def available_migrations() -> list[Migration]:
    folder = resources.files("queue_service.store").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match["version"]), match["name"], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration versions must be 1..n without gaps, found {versions}")
    return found


async def migrate(dsn: str) -> list[int]:
    """Applies every pending migration; returns the versions applied by this call."""
    migrations = available_migrations()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        async with with_migration_lock(conn):
            await conn.execute(_CREATE_VERSION_TABLE)
            applied = await _applied(conn)
            newly_applied = []
            for migration in migrations:
                known = applied.get(migration.version)
                if known is not None:
                    if known != migration.checksum:
                        raise MigrationError(f"migration {migration.version:04d}_{migration.name} was edited after it was applied")
                    continue
                log.info("applying migration %04d_%s", migration.version, migration.name)
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO queue_schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
                newly_applied.append(migration.version)
            unknown = sorted(set(applied) - {m.version for m in migrations})
            if unknown:
                # A newer replica migrated further; older code keeps working on the newer schema
                # (migrations stay backward compatible for one release), so this is only noted.
                log.warning("database has migrations this code does not know: %s", unknown)
    return newly_applied


async def pending_migrations(conn: AsyncConnection[Any]) -> list[int]:
    """Versions not yet applied (empty when the schema is current); used by the health check."""
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute("SELECT to_regclass('queue_schema_migrations') IS NOT NULL AS present")
    present = await cursor.fetchone()
    applied = await _applied(conn) if present and present["present"] else {}
    return [m.version for m in available_migrations() if m.version not in applied]


async def _applied(conn: AsyncConnection[Any]) -> dict[int, str]:
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute("SELECT version, checksum FROM queue_schema_migrations")
    return {row["version"]: row["checksum"] for row in await cursor.fetchall()}
