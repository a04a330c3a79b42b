"""Connections, transactions and the translation of driver errors into domain errors.

This module and `locks` are the only places that open transactions; `repository` runs the
named queries on the connections they yield. Driver errors are translated here, once:
a lost connection or an exhausted pool is UNAVAILABLE (the caller may retry), a lock timeout is
LOCK_TIMEOUT, serialization failures and deadlocks are ABORTED.

Inside a call with a deadline (see `deadline`), the pool checkout and every statement are bounded
by what is left of it, so the caller hears DATABASE_UNAVAILABLE before its own deadline passes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeAlias

import psycopg
from psycopg import AsyncConnection, errors as pg_errors
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from queue_service import deadline, errors

log = logging.getLogger(__name__)

# The pool's connections return rows as dicts (`row_factory=dict_row`, see `create_pool`).
DictConnection: TypeAlias = AsyncConnection[DictRow]


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
    except pg_errors.UniqueViolation as exc:
        constraint = exc.diag.constraint_name or "unknown"
        raise errors.Conflict(
            f"a concurrent change won ({constraint}); retry the call", metadata={"constraint": constraint}
        ) from exc
    except (psycopg.OperationalError, pg_errors.AdminShutdown, pg_errors.CannotConnectNow) as exc:
        raise errors.DatabaseUnavailable(f"the database is unavailable: {exc.__class__.__name__}") from exc


class QueuePool(AsyncConnectionPool[DictConnection]):
    """The service's pool: knows the timeouts its connections carry, so a call's deadline can
    shorten them."""

    def __init__(self, *args: Any, timeouts: Timeouts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeouts = timeouts


@asynccontextmanager
async def checkout(pool: AsyncConnectionPool[DictConnection]) -> AsyncIterator[DictConnection]:
    """A pooled connection, waiting for one no longer than the pool's timeout or what is left of
    the caller's deadline."""
    wait = deadline.bound(pool.timeout)
    if wait <= 0:
        raise errors.DatabaseUnavailable("no time was left in the call's deadline to reach the database; retry the call")
    async with pool.connection(timeout=wait) as conn:
        yield conn


@asynccontextmanager
async def statements_within_deadline() -> AsyncIterator[None]:
    """Bounds the block's statements by the caller's deadline: when it runs out, the running
    statement is cancelled on the server (psycopg does that when its task is cancelled) and the
    block raises TimeoutError. Without a deadline, the session's statement_timeout applies."""
    left = deadline.remaining()
    if left is None:
        yield
        return
    async with asyncio.timeout(max(0.0, left)):
        yield


@asynccontextmanager
async def connection(pool: AsyncConnectionPool[DictConnection]) -> AsyncIterator[DictConnection]:
    """Yields a pooled connection in autocommit mode: each statement is its own transaction.

    The pool's connections carry the configured lock and statement timeouts as session defaults;
    inside a call, the checkout and the statements are also bounded by the caller's deadline.
    """
    with translated_errors():
        async with checkout(pool) as conn, statements_within_deadline():
            yield conn


def create_pool(dsn: str, *, timeouts: Timeouts, min_size: int, max_size: int, timeout: float, name: str = "queue") -> QueuePool:
    """A pool opened explicitly by the caller (`await pool.open(wait=True)`), closed on shutdown.

    Every new connection gets the lock and statement timeouts as session defaults. Connections
    are not pinged before each loan (that would cost a round trip per transaction): after a
    PostgreSQL restart a stale connection fails its first statement, the caller hears
    UNAVAILABLE, and the pool discards it and opens a fresh one.
    """

    async def configure(conn: DictConnection) -> None:
        await conn.execute(
            "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
            (f"{timeouts.lock_timeout_ms}ms", f"{timeouts.statement_timeout_ms}ms"),
        )

    return QueuePool(
        dsn,
        timeouts=timeouts,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        open=False,
        name=name,
        kwargs={"row_factory": dict_row, "autocommit": True},
        configure=configure,
        reconnect_timeout=3600,
    )
