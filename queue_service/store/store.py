"""The store: the only code that runs SQL. `Store` is the database as the rest of the service sees it.

`Store.statements()` yields `Statements` (`statements/`: one typed method per named query of
`sql/queries/`, a module per concern) on a pooled connection in autocommit mode (each statement
its own transaction). The locked sections (`sections.py`: `Store.admit_job`, `end_job`, `end_run`,
`end_runs`, `promote`, `settle_job_run`, `refund_failed_job`) each run as one statement holding
the user's queue lock (`locks`), `grant_capacity` the fleet-wide capacity lock. Methods take and
return model types (`queue_service.model`), built from rows in `rows.py`; no cursor, row or
connection leaves this package. Driver errors become domain errors in `pool.translated_errors`.
This module holds the rest: the pool's life, migrate, health's probes, the feed's hints.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg

from queue_service import deadline
from queue_service.model import DatabaseIdentity, ReplicationStance
from queue_service.store import migrations, notices
from queue_service.store import rows as from_row
from queue_service.store.feed import HINT_CHANNEL, CommitHints
from queue_service.store.locks import holding_capacity_lock, holding_user_queue_lock
from queue_service.store.pool import QueuePool, connection, connection_parameters, translated_errors
from queue_service.store.sections import LockedSections
from queue_service.store.statements import Statements

log = logging.getLogger(__name__)

# Announced by the trigger of migrations 0001-0013 (since 0013, on every change a job's view
# shows); since migration 0015 the trigger writes the job-change feed instead (store/feed.py),
# and nothing notifies here.
JOB_CHANGES_CHANNEL = "analysis_job_changes"


class Store(LockedSections):
    """The database, as the rest of the service sees it."""

    def __init__(
        self,
        pool: QueuePool,
        *,
        database_url: str,
        listen_database_url: str = "",
        dead_peer_seconds: int = 10,
        liveness_seconds: float | None = 2.0,
    ) -> None:
        self.pool = pool
        self._database_url = database_url
        self._listen_database_url = listen_database_url or database_url
        self._dead_peer_seconds = dead_peer_seconds
        self._liveness_seconds = liveness_seconds
        # The database's identity as health's last committed probe read it, and when the probe
        # began (`commit_probe`); False once the role proved unable to read it.
        self._probed_identity: tuple[float, DatabaseIdentity] | None = None
        self._probe_reads_identity = True
        # This replica's commits of job changes: its feed reader wakes at once, the other
        # replicas' through a debounced hint (store/feed.py).
        self.hints = CommitHints(self._send_hint)

    async def _send_hint(self, sender: str) -> None:
        async with self.statements() as db:
            await db.job_feed_hint(sender=sender)

    @asynccontextmanager
    async def statements(self) -> AsyncIterator[Statements]:
        """Statements on a pooled connection, each its own transaction; inside a call, the
        checkout and each statement are bounded by what is left of the caller's deadline."""
        async with connection(self.pool) as conn:
            yield Statements(conn, self.hints.committed)

    @asynccontextmanager
    async def holding_user_queue_lock(self, user_id: str) -> AsyncIterator[None]:
        """Holds the user's queue lock until the block ends, so every section of that user
        waits (tests and tools)."""
        async with holding_user_queue_lock(self.pool, user_id):
            yield

    @asynccontextmanager
    async def holding_capacity_lock(self) -> AsyncIterator[None]:
        """Holds the fleet-wide capacity lock until the block ends (tests and tools)."""
        async with holding_capacity_lock(self.pool):
            yield

    async def open(self, *, timeout: float) -> None:
        await self.pool.open(wait=True, timeout=timeout)

    async def close(self) -> None:
        await self.hints.close()
        await self.pool.close()

    async def migrate(self) -> list[int]:
        """Applies every pending migration and changed function file; returns the versions this
        call applied."""
        with translated_errors():
            return await migrations.migrate(self._database_url)

    async def pending_migrations(self) -> list[str]:
        """Migrations and function files not yet applied (`migrations.pending_migrations`)."""
        with translated_errors():
            async with self.pool.connection() as conn:
                return await migrations.pending_migrations(conn)

    async def reachable(self, *, timeout: float) -> bool:
        """Whether the database answers a trivial statement within `timeout`."""
        try:
            async with self.pool.connection(timeout=timeout) as conn:
                await conn.execute("SELECT 1")
        except Exception:
            return False
        return True

    async def commit_probe(self, *, timeout: float) -> None:
        """Commits a tiny write (a transactional WAL message) within `timeout` (checkout
        included): the database can take this replica's writes. Raises DatabaseUnavailable otherwise; a commit
        still waiting then (for a synchronous standby, say) is cancelled, its connection given
        up if the server does not end it at once (`pool.statements_within_deadline`).

        The same statement reads the database's identity (`probed_identity`), unless the role
        may not read it: then the write is made alone from then on."""
        started = time.monotonic()
        with deadline.call_budget(timeout):
            async with self.statements() as db:
                if self._probe_reads_identity:
                    identity = await db.commit_probe_reading_identity()
                else:
                    identity = None
                    await db._send("commit_probe", {})
        if identity is None:
            self._probe_reads_identity = False
        else:
            self._probed_identity = (started, identity)

    def probed_identity(self, *, started_after: float) -> tuple[float, DatabaseIdentity] | None:
        """The database's identity as the last health probe read it, with when that probe began
        (monotonic), if it began after `started_after` and its commit went through."""
        probed = self._probed_identity
        return probed if probed is not None and probed[0] > started_after else None

    async def replication_stance(self, *, timeout: float) -> ReplicationStance:
        """What this replica's commits wait for (`ReplicationStance`)."""
        with deadline.call_budget(timeout):
            async with self.statements() as db:
                row = await db._one("replication_stance", {})
        assert row is not None
        return from_row.replication_stance(row)

    async def wait_until_reachable(self, *, wait_seconds: float, retry_max_seconds: float) -> None:
        """Returns once a connection to the database opens; retries for `wait_seconds`,
        logging each failure, then raises the last one. A refusal that waiting cannot cure (a
        wrong password, an unknown database: SQLSTATE class 28, 3D000) raises at once."""
        give_up_at = time.monotonic() + wait_seconds
        delay = 0.1
        attempt = 0
        while True:
            attempt += 1
            try:
                conn = await psycopg.AsyncConnection.connect(self._database_url, connect_timeout=max(2, int(retry_max_seconds * 4)))
            except psycopg.OperationalError as exc:
                left = give_up_at - time.monotonic()
                sqlstate = exc.sqlstate or ""
                if left <= 0 or sqlstate.startswith("28") or sqlstate == "3D000":
                    raise
                log.warning(
                    "database not reachable yet (attempt %d: %s); retrying for %.0fs more (QUEUE_DB_START_WAIT_SECONDS)",
                    attempt,
                    " ".join(str(exc).split()) or exc.__class__.__name__,
                    left,
                )
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, max(retry_max_seconds, 1.0))
                continue
            await conn.close()
            if attempt > 1:
                log.info("database reachable after %d attempts", attempt)
            return

    @asynccontextmanager
    async def feed_hints(self) -> AsyncIterator[AsyncIterator[str]]:
        """A dedicated connection LISTENing for the job-change feed's wake-up hints (store/feed.py);
        yields their payloads, each the sending replica's `hints.sender`. The caller reconnects
        when it drops, or when it goes silent (`notices`: a liveness query after
        `liveness_seconds` without traffic, TCP keepalives)."""
        parameters = connection_parameters(self._listen_database_url, dead_peer_seconds=self._dead_peer_seconds)
        async with notices.listening(
            self._listen_database_url, HINT_CHANNEL, liveness_seconds=self._liveness_seconds, **parameters
        ) as payloads:
            yield payloads
