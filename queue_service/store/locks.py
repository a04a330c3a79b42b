"""The only code that takes PostgreSQL advisory locks.

`locked_section` owns the key `analysis_queue:<user_id>`: every admit, promotion, completion,
give-up, cancel and settlement of a user runs under it, so they serialize per user across every
replica and code version. A typo in the namespace would silently split the lock in two, so
`tests/repository/test_lock_scan.py` fails if any other file spells the namespace or takes an advisory lock.

`capacity_section` owns the fleet-wide key `analysis_queue_capacity`: every grant of the core's
capacity runs under it, so two replicas never hand out the same free capacity. It is taken alone,
never before a user's lock (a grant changes only rows of jobs that wait, and skips those another
transaction holds), so the two kinds of lock cannot wait for each other in a cycle. A batch of
completions, once its users' locks are held and its sections have run, *tries* it
(`pg_try_advisory_xact_lock`: never a wait) and grants in the same statement when it is free
(`locked_sections_of_runs_then_grant`); a wait for it while a user's lock is held never happens.
The scan test counts both.

Every lock here is transaction-scoped (`pg_advisory_xact_lock`): an error mid-transaction can never
leak one, and they are safe behind a transaction-mode connection pooler.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool

from queue_service import deadline, errors, telemetry
from queue_service.store.pool import DictConnection, QueuePool, connection


def _user_queue_key(user_id: str) -> str:
    """The lock key of the user whose id the SQL expression `user_id` gives."""
    return "hashtextextended('analysis_queue:' || " + user_id + ", 0)"


# A locked section is one autocommit statement: the statement is the transaction. Its FROM
# takes the lock first (each `OFFSET 0` keeps a subquery from being merged into its parent, so
# the order holds); the section's query is a LATERAL subquery that reads the lock's row, so it
# can only run once the lock is granted. Sections call VOLATILE PL/pgSQL functions (each in its
# file in sql/functions/), whose statements each take a fresh snapshot: they see what the previous holder committed.
#
# Before the lock, the statement sets for itself:
# - lock_timeout: the session's, or less inside a call whose deadline comes sooner, so a busy user
#   queue is named as such (LOCK_TIMEOUT) before the caller gives up. The rest of the statement is
#   bounded by the deadline itself (`pool.statements_within_deadline`).
# - plan_cache_mode: the sections' statements run on their generic plans. PostgreSQL's default
#   kept re-planning a statement whose generic plan it estimated dearer than the custom ones
#   (the view read was planned afresh on every admit: 0.9 ms of PostgreSQL CPU against 0.1 ms to
#   run it). Those generic plans are checked to be index-driven by bench/explain.py.
#
# The lock's row reports how long the server waited for it, so measuring the wait costs nothing.
_SETTINGS = (
    "(SELECT set_config('lock_timeout', coalesce(%(lock_timeout)s, current_setting('lock_timeout')), true),"
    "        set_config('plan_cache_mode', 'force_generic_plan', true)"
    " OFFSET 0) AS settings"
)
# Once the locks are granted, the section's own lock waits (rows) get the lock timeout it would
# have had: a statement that waits only briefly for a user's lock (`_BATCH_LOCK_TIMEOUT`) still
# runs its section like any other. Evaluated in the lock's row, so before the section runs.
_SECTION_LOCK_TIMEOUT = (
    "set_config('lock_timeout', coalesce(%(section_lock_timeout)s, current_setting('lock_timeout')), true) AS section_lock_timeout"
)
# The section: a LATERAL subquery over the lock's row, so it runs once the locks are granted.
_SECTION_AFTER_LOCK = (
    " LEFT JOIN LATERAL (SELECT * FROM ({section}) AS s"
    " WHERE locked.waited_seconds IS NOT NULL AND locked.section_lock_timeout IS NOT NULL OFFSET 0) AS section ON true"
)


# The wrappers' SQL is laid out as the statement reads; the formatter would break it at every `+`.
# fmt: off
def _locked_section_sql(owner: str) -> str:
    """The wrapper for a section whose user is `owner` (a query of one row and one column, the
    user's id; NULL takes no lock). The lock's row also names the user it locked
    (`locked.locked_user_id`), so a section keyed by something else can check it."""
    return (
        "SELECT locked.waited_seconds, section.*"
        " FROM (SELECT extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS waited_seconds,"
        "              lock.user_id AS locked_user_id, " + _SECTION_LOCK_TIMEOUT +
        "        FROM (SELECT owner.user_id, pg_advisory_xact_lock(" + _user_queue_key("owner.user_id") + ")"
        "                FROM " + _SETTINGS + ", (" + owner + " OFFSET 0) AS owner"
        "              OFFSET 0) AS lock"
        "      OFFSET 0) AS locked" + _SECTION_AFTER_LOCK
    )


def _locked_sections_sql(owners: str) -> str:
    """The wrapper for sections of several users: `owners` is a query of their distinct ids (one
    column, user_id). Every lock is granted before any section runs, and they are taken in the
    order of their keys: two such statements never wait for each other in a cycle, and a single
    section takes one lock and waits for no other. The lock timeout is the caller's
    (`_BATCH_LOCK_TIMEOUT`): one user's busy queue fails the batch quickly instead of holding
    up every other user in it."""
    return (
        "SELECT locked.waited_seconds, section.*"
        " FROM (SELECT extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS waited_seconds, "
        + _SECTION_LOCK_TIMEOUT +
        "        FROM (SELECT count(*) AS locks"
        "                FROM (SELECT pg_advisory_xact_lock(" + _user_queue_key("owner.user_id") + ")"
        "                        FROM " + _SETTINGS + ","
        "                             (SELECT owner.user_id FROM (" + owners + ") AS owner"
        "                               ORDER BY " + _user_queue_key("owner.user_id") + " OFFSET 0) AS owner"
        "                      OFFSET 0) AS lock"
        "             ) AS taken"
        "      OFFSET 0) AS locked" + _SECTION_AFTER_LOCK
    )


def _capacity_section_sql() -> str:
    """The wrapper for a section under the fleet-wide capacity lock (its own fixed key, hashed
    like the others): granted before the section runs, like a user's lock."""
    return (
        "SELECT locked.waited_seconds, section.*"
        " FROM (SELECT extract(epoch FROM clock_timestamp() - statement_timestamp())::float8 AS waited_seconds, "
        + _SECTION_LOCK_TIMEOUT +
        "        FROM (SELECT pg_advisory_xact_lock(" + _CAPACITY_KEY + ")"
        "                FROM " + _SETTINGS + " OFFSET 0) AS lock"
        "      OFFSET 0) AS locked" + _SECTION_AFTER_LOCK
    )
# fmt: on


def _capacity_tried_after_sql(first: str) -> str:
    """The wrapper `first` (a locked statement over `{section}`) followed, in the same statement
    and transaction, by `{grant_section}` when the capacity lock can be taken without waiting.

    `first` is materialized and counted before the try, so every section of it has run (and its
    changes are seen by the grant's own statements, which take fresh snapshots). The grant runs
    only when the lock was taken: its condition names only the try's row, so the planner makes it
    a one-time filter in front of the grant. Every row of `first` carries the grant's rows as one
    JSON array (`capacity_grant`; NULL when the lock was busy and nothing was granted)."""
    return (
        "WITH sections AS MATERIALIZED (" + first + "),"
        " capacity_tried AS MATERIALIZED ("
        "   SELECT pg_try_advisory_xact_lock(" + _CAPACITY_KEY + ") AS taken"
        "     FROM (SELECT count(*) AS sections FROM sections) AS ran OFFSET 0),"
        " granted AS MATERIALIZED ("
        "   SELECT g.* FROM capacity_tried,"
        "        LATERAL (SELECT * FROM ({grant_section}) AS t WHERE capacity_tried.taken OFFSET 0) AS g)"
        " SELECT sections.*, (SELECT json_agg(granted) FROM granted) AS capacity_grant FROM sections"
    )


_CAPACITY_KEY = "hashtextextended('analysis_queue_capacity', 0)"
_CAPACITY_SECTION = _capacity_section_sql()

_LOCKED_SECTION = _locked_section_sql("SELECT %(user_id)s::text AS user_id")
# A run's section: the user is the run's job's (a job's user never changes, so reading it before
# the lock is safe). A run with no job yet takes no lock; the section sees NULL as the locked user.
_RUN_OWNER_LOCKED_SECTION = _locked_section_sql("SELECT (SELECT j.user_id FROM analysis_jobs j WHERE j.run_id = %(run_id)s) AS user_id")

# Several runs' sections: the users are those of the runs' jobs as the statement began (the
# sections read each run's owner in the same snapshot). The run ids are read through a subquery,
# so the prepared statement keeps a generic plan (sql/queries/claims.sql, `mark_released`).
_RUN_OWNERS_LOCKED_SECTIONS = _locked_sections_sql(
    "SELECT DISTINCT j.user_id FROM analysis_jobs j WHERE j.run_id = ANY((SELECT %(run_ids)s::uuid[])::uuid[])"
)
_RUN_OWNERS_LOCKED_SECTIONS_THEN_GRANT = _capacity_tried_after_sql(_RUN_OWNERS_LOCKED_SECTIONS)
# A batch waits this long at most for any one user's lock; then its callers run their sections
# one by one, each within its own deadline.
_BATCH_LOCK_TIMEOUT = "100ms"

# Holds the lock for a whole transaction: only for holding a user's queue still (tests, tools).
_TAKE_USER_QUEUE_LOCK = "SELECT pg_advisory_xact_lock(" + _user_queue_key("%(user_id)s") + ")"

# Holds the capacity lock for a whole transaction: only for holding every grant still (tests, tools).
_TAKE_CAPACITY_LOCK = "SELECT pg_advisory_xact_lock(" + _CAPACITY_KEY + ")"

# A fixed key of its own (the namespace is hashed the same way) so migrations from replicas that
# start together run one after another.
_TAKE_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('analysis_queue_migrations', 0))"

_Connection = TypeVar("_Connection", bound=AsyncConnection[Any])


async def locked_section(
    pool: AsyncConnectionPool[DictConnection], user_id: str, section: sql.Composable, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """Runs `section` (a query over one of the section functions in sql/functions/) holding the user's queue
    lock, as one statement and one round trip; returns its rows once committed (none when the
    section returned none).

    Inside a call with a deadline, the wait for a connection, for the lock and for the statement
    is bounded by what is left of it (LOCK_TIMEOUT / DATABASE_UNAVAILABLE before the caller gives up)."""
    return await _run_locked(pool, _LOCKED_SECTION, section, {**params, "user_id": user_id})


async def locked_section_of_run(
    pool: AsyncConnectionPool[DictConnection], run_id: uuid.UUID, section: sql.Composable, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """`locked_section` for the user whose job owns `run_id`, found in the same statement (no
    round trip to look the owner up first). The section reads `locked.locked_user_id`: NULL when
    no job owned the run as the statement began, so no lock is held and it must change nothing."""
    return await _run_locked(pool, _RUN_OWNER_LOCKED_SECTION, section, {**params, "run_id": run_id})


async def locked_sections_of_runs(
    pool: AsyncConnectionPool[DictConnection], run_ids: list[uuid.UUID], section: sql.Composable, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """`locked_section_of_run` for several runs in one statement, holding the locks of all
    their users (taken in key order, each within `_BATCH_LOCK_TIMEOUT`). The section reads each
    run's owner itself, in the statement's snapshot: the users locked here."""
    return await _run_locked(pool, _RUN_OWNERS_LOCKED_SECTIONS, section, {**params, "run_ids": run_ids}, lock_timeout=_BATCH_LOCK_TIMEOUT)


async def locked_sections_of_runs_then_grant(
    pool: AsyncConnectionPool[DictConnection],
    run_ids: list[uuid.UUID],
    section: sql.Composable,
    grant_section: sql.Composable,
    params: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """`locked_sections_of_runs`, then in the same statement (one commit) `grant_section` under
    the capacity lock if that lock is free at once; never waits for it. The sections' rows, and
    the grant's rows (None: the lock was busy, nothing was granted here)."""
    rows = await _execute_locked(
        pool,
        _RUN_OWNERS_LOCKED_SECTIONS_THEN_GRANT,
        {"section": section, "grant_section": grant_section},
        {**params, "run_ids": run_ids},
        lock_timeout=_BATCH_LOCK_TIMEOUT,
    )
    grant = rows[0]["capacity_grant"] if rows else None
    return [row for row in rows if row["row_kind"] is not None], grant


async def capacity_section(
    pool: AsyncConnectionPool[DictConnection], section: sql.Composable, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """Runs `section` holding the fleet-wide capacity lock, as one statement: the grants of every
    replica one after another, each seeing what the previous one committed."""
    return await _run_locked(pool, _CAPACITY_SECTION, section, params)


async def _run_locked(
    pool: AsyncConnectionPool[DictConnection],
    wrapper: str,
    section: sql.Composable,
    params: dict[str, Any],
    *,
    lock_timeout: str | None = None,
) -> list[dict[str, Any]]:
    """Runs the wrapped section; the wait for the user locks is `lock_timeout` if given, else the
    session's or less within the call's deadline (the section's own lock waits always are).

    A statement sent whose answer did not come (cancelled at the call's deadline: a commit
    acknowledged late is kept; or the connection broke) may have committed: OUTCOME_UNKNOWN,
    never a plain DATABASE_UNAVAILABLE."""
    rows = await _execute_locked(pool, wrapper, {"section": section}, params, lock_timeout=lock_timeout)
    return [row for row in rows if row["row_kind"] is not None]


async def _execute_locked(
    pool: AsyncConnectionPool[DictConnection],
    wrapper: str,
    sections: dict[str, sql.Composable],
    params: dict[str, Any],
    *,
    lock_timeout: str | None,
) -> list[dict[str, Any]]:
    """`_run_locked`'s statement, every row of it (the lock's own included)."""
    statement = sql.SQL(wrapper).format(**sections)
    own_lock_timeout = _lock_timeout_within_deadline(pool)
    if lock_timeout is None:
        lock_timeouts = {"lock_timeout": own_lock_timeout, "section_lock_timeout": None}
    else:
        lock_timeouts = {"lock_timeout": lock_timeout, "section_lock_timeout": own_lock_timeout or _session_lock_timeout(pool)}
    sent = False
    try:
        async with connection(pool) as conn:
            sent_ns = time.time_ns()
            sent = True
            cursor = await conn.execute(statement, {**params, **lock_timeouts})
            rows = await cursor.fetchall()
    except errors.DatabaseUnavailable as exc:
        if sent and isinstance(exc.__cause__, (TimeoutError, psycopg.OperationalError)):
            raise errors.OutcomeUnknown(
                "the database did not confirm whether this change committed; retry the same request"
                " (the same idempotency key) to learn its outcome"
            ) from exc
        raise
    _record_lock_wait(float(rows[0]["waited_seconds"]) if rows else 0.0, sent_ns)
    return rows


def _session_lock_timeout(pool: AsyncConnectionPool[DictConnection]) -> str | None:
    return f"{pool.timeouts.lock_timeout_ms}ms" if isinstance(pool, QueuePool) else None


def _lock_timeout_within_deadline(pool: AsyncConnectionPool[DictConnection]) -> str | None:
    """The lock timeout for this statement: the session's (None), or less when the call's
    deadline comes sooner. The lock gives up first, so a busy user queue is named as such: a
    tenth of what is left earlier, or more while this process's event loop runs late (its reading
    of the server's lock timeout would come after the statement's own deadline cancelled it, and
    the outcome of a write cancelled mid-flight is unknown)."""
    left = deadline.remaining()
    if left is None or not isinstance(pool, QueuePool):
        return None
    left_ms = max(1, int(left * 1000))
    configured = pool.timeouts.lock_timeout_ms
    if left_ms >= configured:
        return None
    earlier_ms = max(left_ms // 10, int(deadline.lag_allowance() * 1000))
    return f"{min(max(1, left_ms - earlier_ms), configured)}ms"


def _record_lock_wait(waited: float, sent_ns: int) -> None:
    """The wait as the server measured it, as a span placed where it happened and a histogram."""
    span = telemetry.tracer.start_span("lock.wait", start_time=sent_ns)
    span.set_attribute("queue.lock_wait_ms", waited * 1000)
    span.end(end_time=sent_ns + int(waited * 1e9))
    telemetry.metrics.lock_wait.record(waited)


@asynccontextmanager
async def holding_user_queue_lock(pool: AsyncConnectionPool[DictConnection], user_id: str) -> AsyncIterator[None]:
    """Holds the user's queue lock until the block ends (a transaction doing nothing else), so
    that every section of that user waits: for tests and tools that need a user's queue still."""
    async with connection(pool) as conn, conn.transaction():
        await take_user_queue_lock(conn, user_id)
        yield


@asynccontextmanager
async def holding_capacity_lock(pool: AsyncConnectionPool[DictConnection]) -> AsyncIterator[None]:
    """Holds the fleet-wide capacity lock until the block ends, so that every grant waits or (a
    batch of completions) grants nothing: for tests and tools."""
    async with connection(pool) as conn, conn.transaction():
        await conn.execute(_TAKE_CAPACITY_LOCK)
        yield


async def take_user_queue_lock(conn: AsyncConnection[Any], user_id: str) -> None:
    """Takes the user's queue lock in the transaction open on `conn` (any connection: a
    stranger's transaction, for tests and tools), until that transaction ends."""
    await conn.execute(_TAKE_USER_QUEUE_LOCK, {"user_id": user_id})


@asynccontextmanager
async def with_migration_lock(conn: _Connection) -> AsyncIterator[_Connection]:
    """Holds the migration lock for the duration of one transaction on `conn`."""
    async with conn.transaction():
        await conn.execute(_TAKE_MIGRATION_LOCK)
        yield conn
