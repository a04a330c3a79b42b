"""The only code that takes PostgreSQL advisory locks.

`with_user_queue_lock` owns the key `analysis_queue:<user_id>`: every admit, promotion,
completion, give-up and cancel of a user runs inside it, so they serialize per user across every
replica and code version. A typo in the namespace would silently split the lock in two, so
`tests/test_lock_scan.py` fails if any other file spells the namespace or takes an advisory lock.

Both locks are transaction-scoped (`pg_advisory_xact_lock`): an error mid-transaction can never
leak one, and they are safe behind a transaction-mode connection pooler.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from queue_service import telemetry
from queue_service.db import Timeouts, session_timeouts, transaction

# The timeouts go into the same statement as the lock so taking the lock costs one round trip.
_TAKE_USER_QUEUE_LOCK = (
    "SELECT set_config('lock_timeout', %(lock_timeout)s, true),"
    " set_config('statement_timeout', %(statement_timeout)s, true),"
    " pg_advisory_xact_lock(hashtextextended('analysis_queue:' || %(user_id)s, 0))"
)

# A fixed key of its own (the namespace is hashed the same way) so migrations from replicas that
# start together run one after another.
_TAKE_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('analysis_queue_migrations', 0))"


@asynccontextmanager
async def with_user_queue_lock(
    pool: AsyncConnectionPool, user_id: str, timeouts: Timeouts
) -> AsyncIterator[AsyncConnection]:
    """Opens a transaction holding the user's queue lock and yields its connection.

    Commits when the block ends, rolls back (and so releases the lock) on any error.
    """
    # The lock statement sets the timeouts itself (same round trip), so the transaction needn't.
    async with transaction(pool, session_timeouts(pool)) as conn:
        started = time.perf_counter()
        with telemetry.tracer.start_as_current_span("lock.wait") as span:
            await conn.execute(
                _TAKE_USER_QUEUE_LOCK,
                {
                    "lock_timeout": f"{timeouts.lock_timeout_ms}ms",
                    "statement_timeout": f"{timeouts.statement_timeout_ms}ms",
                    "user_id": user_id,
                },
            )
            waited = time.perf_counter() - started
            span.set_attribute("queue.lock_wait_ms", waited * 1000)
        telemetry.metrics.lock_wait.record(waited)
        yield conn


@asynccontextmanager
async def with_migration_lock(conn: AsyncConnection) -> AsyncIterator[AsyncConnection]:
    """Holds the migration lock for the duration of one transaction on `conn`."""
    async with conn.transaction():
        await conn.execute(_TAKE_MIGRATION_LOCK)
        yield conn
