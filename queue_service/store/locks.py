"""The only code that takes PostgreSQL advisory locks.

`with_user_queue_lock` owns the key `analysis_queue:<user_id>`: every admit, promotion,
completion, give-up and cancel of a user runs inside it, so they serialize per user across every
replica and code version. A typo in the namespace would silently split the lock in two, so
`tests/unit/test_lock_scan.py` fails if any other file spells the namespace or takes an advisory lock.

Both locks are transaction-scoped (`pg_advisory_xact_lock`): an error mid-transaction can never
leak one, and they are safe behind a transaction-mode connection pooler.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from queue_service import deadline, telemetry
from queue_service.store.pool import DictConnection, QueuePool, checkout, translated_errors

# The statement reports how long the server waited for the lock, so measuring the wait costs no
# round trip of its own (see below). lock_timeout bounds the wait: a session default of the pool.
#
# It also makes the rest of the locked transaction run prepared statements on their generic plan.
# PostgreSQL's default keeps re-planning a statement whose generic plan it estimates dearer than
# the custom ones: the view read of `job_id = ANY($1)` was planned afresh on every admit, 0.9 ms
# of PostgreSQL CPU against 0.1 ms to run it (bench --statement-stats). The generic plans of the
# locked sections' statements are checked to be index-driven by bench/explain.py.
_TAKE_USER_QUEUE_LOCK = (
    "SELECT extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS waited_seconds,"
    " set_config('plan_cache_mode', 'force_generic_plan', true) AS plan_cache_mode"
    " FROM (SELECT pg_advisory_xact_lock(hashtextextended('analysis_queue:' || %(user_id)s, 0)) OFFSET 0) AS locked"
)

# Inside a call whose deadline comes before the session's limits, this transaction's lock and
# statement timeouts are lowered to what is left (sent in the same pipeline: no extra round trip).
_SHORTEN_TIMEOUTS = "SELECT set_config('lock_timeout', %(lock_ms)s, true), set_config('statement_timeout', %(statement_ms)s, true)"

# A fixed key of its own (the namespace is hashed the same way) so migrations from replicas that
# start together run one after another.
_TAKE_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('analysis_queue_migrations', 0))"

_Connection = TypeVar("_Connection", bound=AsyncConnection[Any])


@asynccontextmanager
async def with_user_queue_lock(
    pool: AsyncConnectionPool[DictConnection], user_id: str) -> AsyncIterator[DictConnection]:
    """Opens a transaction holding the user's queue lock and yields its connection.

    Commits when the block ends, rolls back (and so releases the lock) on any error. The
    connection is in pipeline mode: BEGIN and the lock travel with the block's first statement,
    and COMMIT needs no extra wait, so the locked section costs two round trips, not four. A lock
    timeout surfaces at the block's first result.

    Inside a call with a deadline, the wait for a connection, for the lock and for each statement
    is bounded by what is left of it (LOCK_TIMEOUT / DATABASE_UNAVAILABLE before the caller gives up).
    """
    with translated_errors():
        async with checkout(pool) as conn:
            async with conn.pipeline():
                async with conn.transaction():
                    sent_ns = time.time_ns()
                    await _shorten_timeouts_to_deadline(conn, pool)
                    lock = await conn.execute(_TAKE_USER_QUEUE_LOCK, {"user_id": user_id})
                    yield conn
                    row = await lock.fetchone()
                    _record_lock_wait(float(row["waited_seconds"]) if row else 0.0, sent_ns)


async def _shorten_timeouts_to_deadline(conn: DictConnection, pool: AsyncConnectionPool[DictConnection]) -> None:
    left = deadline.remaining()
    if left is None or not isinstance(pool, QueuePool):
        return
    left_ms = max(1, int(left * 1000))
    configured = pool.timeouts
    if left_ms < max(configured.lock_timeout_ms, configured.statement_timeout_ms):
        await conn.execute(
            _SHORTEN_TIMEOUTS,
            {
                # The lock gives up first, so a busy user queue is named as such (LOCK_TIMEOUT).
                "lock_ms": f"{min(max(1, left_ms * 9 // 10), configured.lock_timeout_ms)}ms",
                "statement_ms": f"{min(left_ms, configured.statement_timeout_ms)}ms",
            },
        )


def _record_lock_wait(waited: float, sent_ns: int) -> None:
    """The wait as the server measured it, as a span placed where it happened and a histogram."""
    span = telemetry.tracer.start_span("lock.wait", start_time=sent_ns)
    span.set_attribute("queue.lock_wait_ms", waited * 1000)
    span.end(end_time=sent_ns + int(waited * 1e9))
    telemetry.metrics.lock_wait.record(waited)


@asynccontextmanager
async def with_migration_lock(conn: _Connection) -> AsyncIterator[_Connection]:
    """Holds the migration lock for the duration of one transaction on `conn`."""
    async with conn.transaction():
        await conn.execute(_TAKE_MIGRATION_LOCK)
        yield conn
