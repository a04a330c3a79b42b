"""Connections, transactions and the translation of driver errors into domain errors.

This module and `locks` are the only places that open transactions; `repository` runs the
named queries on the connections they yield. Driver errors are translated here, once:
a lost connection or an exhausted pool is UNAVAILABLE (the caller may retry), a lock timeout is
LOCK_TIMEOUT, serialization failures and deadlocks are ABORTED.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import psycopg
from psycopg import AsyncConnection, errors as pg_errors
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from queue_service import errors

log = logging.getLogger(__name__)


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


@asynccontextmanager
async def connection(pool: AsyncConnectionPool) -> AsyncIterator[AsyncConnection]:
    """Yields a pooled connection in autocommit mode: each statement is its own transaction.

    The pool's connections carry the configured lock and statement timeouts as session defaults.
    A caller's deadline needs nothing here: gRPC cancels the handler when the caller gives up, and
    psycopg cancels the running statement on the server when its task is cancelled
    (tests/test_bounds.py proves nobody is left waiting).
    """
    with translated_errors():
        async with pool.connection() as conn:
            yield conn


def create_pool(dsn: str, *, timeouts: Timeouts, min_size: int, max_size: int, timeout: float, name: str = "queue") -> AsyncConnectionPool:
    """A pool opened explicitly by the caller (`await pool.open(wait=True)`), closed on shutdown.

    Every new connection gets the lock and statement timeouts as session defaults. Connections
    are not pinged before each loan (that would cost a round trip per transaction): after a
    PostgreSQL restart a stale connection fails its first statement, the caller hears
    UNAVAILABLE, and the pool discards it and opens a fresh one.
    """

    async def configure(conn: AsyncConnection) -> None:
        await conn.execute(
            "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
            (f"{timeouts.lock_timeout_ms}ms", f"{timeouts.statement_timeout_ms}ms"),
        )

    return AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        open=False,
        name=name,
        kwargs={"row_factory": dict_row, "autocommit": True},
        configure=configure,
        reconnect_timeout=3600,
    )
