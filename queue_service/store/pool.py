"""Connections, transactions and the translation of driver errors into domain errors.

This module and `locks` are the only places that open transactions; `repository` runs the
named queries on the connections they yield. Driver errors are translated here, once:
a lost connection, an exhausted pool or a read-only node is UNAVAILABLE (the caller may retry), a lock timeout is
LOCK_TIMEOUT, serialization failures and deadlocks are ABORTED.

Inside a call with a deadline (see `deadline`), the pool checkout and every statement are bounded
by what is left of it, so the caller hears DATABASE_UNAVAILABLE before its own deadline passes.
A statement still running then is cancelled on the server; when the server does not end it at
once (a frozen or unreachable node), the connection is given up rather than waited on
(`statements_within_deadline`).

Outside any call (background work: the dispatcher's marks, the feed reader, the sweeper), each
exchange with the server is bounded too (`QueueConnection`): the server ends any statement at
its statement_timeout, so one unanswered well past that is on a frozen or unreachable node, and
its connection is given up instead of being held for good.

A silent peer is noticed: every connection carries TCP keepalives and `tcp_user_timeout`
(`connection_parameters`), and the pool retries a lost database at most
`reconnect_max_seconds` apart and lends no connection the server has closed, so a restart of
PostgreSQL does not fail one call per pooled connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import select
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, nullcontext
from types import TracebackType
from typing import Any, TypeAlias

import psycopg
from psycopg import AsyncConnection, conninfo, pq
from psycopg import errors as pg_errors
from psycopg.abc import RV, PQGen
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.pool_async import AddConnection

from queue_service import deadline, errors, telemetry

log = logging.getLogger(__name__)

# The pool's connections return rows as dicts (`row_factory=dict_row`, see `create_pool`).
DictConnection: TypeAlias = AsyncConnection[DictRow]

# Past the session's statement_timeout, how long an exchange outside any call may go unanswered
# before its connection is given up: the server answers a statement it timed out at once.
_UNANSWERED_GRACE_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Timeouts:
    lock_timeout_ms: int
    statement_timeout_ms: int


@contextmanager
def translated_errors() -> Iterator[None]:
    try:
        yield
    except errors.QueueError:
        raise
    except PoolTimeout as exc:
        raise errors.DatabaseUnavailable(f"no database connection free in time: {exc}") from exc
    except TimeoutError as exc:
        # Raised by `statements_within_deadline`: the statement was cancelled on the server.
        raise errors.DatabaseUnavailable("the database did not answer within the call's deadline; retry the call") from exc
    except pg_errors.LockNotAvailable as exc:
        raise errors.LockTimeout("the user's queue is busy; retry the call") from exc
    except pg_errors.QueryCanceled as exc:
        raise errors.DatabaseUnavailable("a database statement timed out; retry the call") from exc
    except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as exc:
        raise errors.Conflict("a concurrent change won; retry the call") from exc
    except (pg_errors.DuplicatePreparedStatement, pg_errors.InvalidSqlStatementName) as exc:
        # A transaction-mode pooler (PgBouncer before 1.21, or without max_prepared_statements)
        # hands one server connection to several clients, whose prepared statements then clash.
        # Nothing was applied; the call may be retried. QUEUE_DB_PREPARED_STATEMENTS=false ends it.
        telemetry.metrics.prepared_statement_clashes.add(1)
        log.warning(
            "prepared statement clash (%s): is DATABASE_URL a transaction-mode pooler? set QUEUE_DB_PREPARED_STATEMENTS=false",
            exc.__class__.__name__,
        )
        raise errors.DatabaseUnavailable(
            f"the database connection's prepared statements were not its own ({exc.__class__.__name__}); retry the call"
        ) from exc
    except pg_errors.UniqueViolation as exc:
        constraint = exc.diag.constraint_name or "unknown"
        raise errors.Conflict(f"a concurrent change won ({constraint}); retry the call", metadata={"constraint": constraint}) from exc
    except pg_errors.ForeignKeyViolation as exc:
        # A row the change names went meanwhile (a delta's base pruned past its retention between
        # the admit's pre-check and its insert): nothing was applied, and the retry's pre-check
        # says why (`DELTA_BASE_NOT_FOUND`).
        constraint = exc.diag.constraint_name or "unknown"
        raise errors.Conflict(
            f"a row this change names was deleted meanwhile ({constraint}); retry the call", metadata={"constraint": constraint}
        ) from exc
    except (psycopg.DataError, psycopg.IntegrityError) as exc:
        # Classes 22 and 23 (but for the violations above, which a concurrent change causes).
        raise _refused_for_good(exc) from exc
    except pg_errors.ReadOnlySqlTransaction as exc:
        # A standby answered: during a failover a router (HAProxy on Patroni's /primary check)
        # or a multi-host DSN can reach a member not yet, or no longer, the primary. Nothing was
        # written; the call may be retried once the route leads to the primary again.
        raise errors.DatabaseUnavailable("the database is read-only (a standby, or a primary mid-failover); retry the call") from exc
    except (psycopg.OperationalError, pg_errors.AdminShutdown, pg_errors.CannotConnectNow) as exc:
        if (exc.sqlstate or "").startswith(_PROGRAM_LIMIT_EXCEEDED):
            raise _refused_for_good(exc) from exc
        raise errors.DatabaseUnavailable(f"the database is unavailable: {exc.__class__.__name__}") from exc


# SQLSTATE class 54, a program limit (an index entry over a third of its page, an array too
# large): psycopg files it under OperationalError, beside a lost connection, but the statement
# fails the same way every time it is sent with the same values.
_PROGRAM_LIMIT_EXCEEDED = "54"


def _refused_for_good(exc: psycopg.Error) -> errors.QueueError:
    """The domain error of a statement the database refuses whenever it is sent with the same
    values: classes 22 (a data exception: a value out of its type's range, a string too long), 23
    (a constraint) and 54 (a program limit). Nothing was written, and a retry cannot help, so it
    never reads "retry" nor "outcome unknown" (an admit's run is canceled at the core, I5): 22 and
    54 are the request's values that cannot be stored (INVALID_REQUEST); 23 is a constraint the
    validation should have kept (INTERNAL, a bug)."""
    sqlstate = exc.sqlstate or ""
    condition = exc.__class__.__name__
    constraint = exc.diag.constraint_name or ""
    metadata = {"sqlstate": sqlstate} | ({"constraint": constraint} if constraint else {})
    telemetry.metrics.statements_refused_for_good.add(1, {"sqlstate": sqlstate})
    log.error("the database refused a statement for good (SQLSTATE %s, %s %s): %s", sqlstate, condition, constraint, exc)
    if sqlstate.startswith("23"):
        return errors.Internal(
            f"the database refused this change ({condition}, SQLSTATE {sqlstate}); sending it again fails the same way: do not retry it",
            metadata=metadata,
        )
    return errors.InvalidRequest(
        f"the database cannot store this request as it is ({condition}, SQLSTATE {sqlstate}); sending it again fails the same way: "
        "do not retry it",
        metadata=metadata,
    )


# Once a call's deadline has come, how long a cancelled statement may take to end on the server
# before its connection is given up instead (a healthy server ends it within a millisecond or
# two); less than the least reserve the deadline keeps for the answer (`deadline`, 50 ms).
_GIVE_UP_SECONDS = 0.03


class QueuePool(AsyncConnectionPool[DictConnection]):
    """The service's pool: knows the timeouts its connections carry, so a call's deadline can
    shorten them; retries a lost database at most `reconnect_max_seconds` apart; and lends no
    connection the server has closed (`getconn`)."""

    def __init__(self, *args: Any, timeouts: Timeouts, reconnect_max_seconds: float = 0.5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeouts = timeouts
        self.reconnect_max_seconds = reconnect_max_seconds

    async def schedule_task(self, task: Any, delay: float) -> None:
        # psycopg_pool retries a failed connection attempt with an exponential backoff (1, 2, 4,
        # 8, 16 s ... until reconnect_timeout) and has no setting for its ceiling: capped here,
        # a database that is back is reached again within `reconnect_max_seconds`.
        if isinstance(task, AddConnection):
            delay = min(delay, self.reconnect_max_seconds)
        await super().schedule_task(task, delay)

    async def getconn(self, timeout: float | None = None) -> DictConnection:
        """A connection from the pool, never one the server has closed while it sat idle (a
        restart, a failover, a terminated backend): such a connection has the server's last
        words or its end waiting on its socket, found without a round trip (`_closed_while_idle`);
        it goes back to the pool, which discards and replaces it, and the next one is taken,
        all within `timeout`. A silent peer leaves nothing there: keepalives end such a
        connection (`connection_parameters`), after which it shows here too."""
        give_up_at = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            conn = await super().getconn(timeout=max(0.0, give_up_at - time.monotonic()))
            if not _closed_while_idle(conn):
                return conn
            telemetry.metrics.stale_connections.add(1)
            await self.putconn(conn)


def _closed_while_idle(conn: DictConnection) -> bool:
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK:
        return True
    readable, _, _ = select.select([pgconn.socket], [], [], 0)
    if not readable:
        return False
    try:
        pgconn.consume_input()
    except psycopg.OperationalError:
        return True
    return pgconn.status != pq.ConnStatus.OK


@asynccontextmanager
async def checkout(pool: AsyncConnectionPool[DictConnection]) -> AsyncIterator[DictConnection]:
    """A pooled connection, waiting for one no longer than the pool's timeout or what is left of
    the caller's deadline."""
    wait = deadline.bound(pool.timeout)
    if wait <= 0:
        raise errors.DatabaseUnavailable("no time was left in the call's deadline to reach the database; retry the call")
    async with pool.connection(timeout=wait) as conn:
        try:
            yield conn
        except pg_errors.ReadOnlySqlTransaction:
            # The connection reached a standby (mid-failover, a router still sending some new
            # connections to the old or not yet promoted member): closed, the pool replaces it
            # through the route, which leads to the primary, instead of lending it again.
            telemetry.metrics.read_only_connections.add(1)
            await conn.close()
            raise


class QueueConnection(AsyncConnection[DictRow]):
    """A pooled connection whose every exchange outside a call (no deadline: background work) is
    bounded by `unanswered_after` seconds (the statement_timeout plus a grace, set by
    `create_pool`): a healthy server has answered by then, if only with its own timeout. Left
    unbounded, a statement on a frozen backend (SIGSTOPped, a hung VM: its kernel still answers
    TCP, so keepalives see nothing) would hold its connection until the node woke up, and a
    small pool would lend no call a connection meanwhile. Calls are bounded by their deadline
    instead (`statements_within_deadline`)."""

    unanswered_after: float | None = None

    async def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        limit = self.unanswered_after
        if limit is None or deadline.remaining() is not None:
            return await super().wait(gen, interval, timeout)
        async with _InterruptedAfter(limit, "a statement outside any call went unanswered past the statement timeout"):
            return await super().wait(gen, interval, timeout)


def statements_within_deadline() -> AbstractAsyncContextManager[None]:
    """Bounds the block's statements by the caller's deadline: when it runs out, the running
    statement is cancelled on the server (psycopg does that when its task is cancelled) and the
    block raises TimeoutError. Without a deadline, the session's statement_timeout applies.

    psycopg, cancelled mid-statement, waits up to 5 s for its cancel request to go through and
    5 s more for the statement to end: on a frozen server or a cut network, 10 s past the
    caller's deadline. So if the block is still running `_GIVE_UP_SECONDS` after the deadline
    (within the reserve the deadline keeps for the answer), its task is interrupted again;
    psycopg then closes the connection, which the pool discards, and the block raises
    TimeoutError all the same."""
    left = deadline.remaining()
    if left is None:
        return _UNBOUNDED
    return _InterruptedAfter(max(0.0, left), "a statement outlived its call's deadline")


_UNBOUNDED: AbstractAsyncContextManager[None] = nullcontext()


class _InterruptedAfter:
    """Cancels the block after `left` seconds (psycopg cancels the running statement on the
    server) and raises TimeoutError; a block still running `_GIVE_UP_SECONDS` later is
    interrupted again, and psycopg closes its connection.

    One timer, armed again for the give-up only once the deadline has passed: every block of a
    call's statements (two per admit) enters this, so it costs one timer and no generator, where
    `asyncio.timeout` with a give-up timer beside it cost two and two."""

    __slots__ = ("_left", "_what", "_task", "_timer", "_cancelling", "_expired", "_interrupted_again")

    def __init__(self, left: float, what: str) -> None:
        self._left = left
        self._what = what
        self._expired = False
        self._interrupted_again = False

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        # Cancels requested before the block are not ours to turn into a TimeoutError.
        self._cancelling = task.cancelling()
        self._timer = asyncio.get_running_loop().call_later(self._left, self._expire)

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()
        self._timer = asyncio.get_running_loop().call_later(_GIVE_UP_SECONDS, self._give_up)

    def _give_up(self) -> None:
        self._interrupted_again = True
        telemetry.metrics.abandoned_connections.add(1)
        log.warning("%s and did not end when cancelled: connection given up", self._what)
        self._task.cancel()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._timer.cancel()
        if not self._expired:
            return
        # As asyncio.timeout: the cancel this block requested is taken back, and a CancelledError
        # that no other cancel explains becomes a TimeoutError.
        cancels_left = self._task.uncancel()
        if exc_type is not asyncio.CancelledError:
            return
        if self._interrupted_again:
            self._task.uncancel()
            raise TimeoutError(self._what) from None
        if cancels_left <= self._cancelling:
            raise TimeoutError from exc


@asynccontextmanager
async def connection(pool: AsyncConnectionPool[DictConnection]) -> AsyncIterator[DictConnection]:
    """Yields a pooled connection in autocommit mode: each statement is its own transaction.

    The pool's connections carry the configured lock and statement timeouts as session defaults;
    inside a call, the checkout and the statements are also bounded by the caller's deadline.
    """
    with translated_errors():
        async with checkout(pool) as conn, statements_within_deadline():
            yield conn


def connection_parameters(dsn: str, *, dead_peer_seconds: int) -> dict[str, Any]:
    """libpq parameters that let a connection notice a silent peer (a crashed node, a cut or
    blackholed network) within about `dead_peer_seconds`, for those the DSN does not set itself:
    TCP keepalives on an idle connection (first probe after half of it, then every sixth, three
    unanswered probes end it) and tcp_user_timeout for data sent and never acknowledged. Linux
    defaults would take over two hours. Unix-socket connections ignore them."""
    wanted: dict[str, Any] = {
        "keepalives": 1,
        "keepalives_idle": max(1, dead_peer_seconds // 2),
        "keepalives_interval": max(1, dead_peer_seconds // 6),
        "keepalives_count": 3,
        "tcp_user_timeout": dead_peer_seconds * 1000,
    }
    given = conninfo.conninfo_to_dict(dsn)
    return {name: value for name, value in wanted.items() if name not in given}


def create_pool(
    dsn: str,
    *,
    timeouts: Timeouts,
    min_size: int,
    max_size: int,
    timeout: float,
    name: str = "queue",
    dead_peer_seconds: int = 10,
    reconnect_max_seconds: float = 0.5,
    prepared_statements: bool = True,
) -> QueuePool:
    """A pool opened explicitly by the caller (`await pool.open(wait=True)`), closed on shutdown.

    Every new connection gets the lock and statement timeouts as session defaults, and the
    keepalive parameters of `connection_parameters`. Connections are not pinged before each loan
    (that would cost a round trip per transaction); a connection the server closed is found
    without one (`QueuePool.getconn`), so after a PostgreSQL restart no call gets a
    stale connection. Without `prepared_statements`, psycopg
    never prepares a statement on the server (`prepare_threshold=None`), as a transaction-mode
    pooler needs.
    """

    async def configure(conn: DictConnection) -> None:
        await conn.execute(
            "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
            (f"{timeouts.lock_timeout_ms}ms", f"{timeouts.statement_timeout_ms}ms"),
        )
        if isinstance(conn, QueueConnection):
            conn.unanswered_after = timeouts.statement_timeout_ms / 1000 + _UNANSWERED_GRACE_SECONDS

    kwargs: dict[str, Any] = {
        "row_factory": dict_row,
        "autocommit": True,
        **connection_parameters(dsn, dead_peer_seconds=dead_peer_seconds),
    }
    if not prepared_statements:
        kwargs["prepare_threshold"] = None
    return QueuePool(
        dsn,
        connection_class=QueueConnection,
        timeouts=timeouts,
        reconnect_max_seconds=reconnect_max_seconds,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        open=False,
        name=name,
        kwargs=kwargs,
        configure=configure,
        reconnect_timeout=3600,
    )
