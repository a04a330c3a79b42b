"""Faults to inject between the service and PostgreSQL: a TCP proxy on 127.0.0.1 that can be
taken down (connections cut, new ones refused) and brought back, and the freezing of a
PostgreSQL backend with SIGSTOP (a live kernel in front of a server that answers nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg

from queue_service.dev.embedded_postgres import free_port
from queue_service.store.notices import LIVENESS_QUERY


class TcpProxy:
    """Forwards 127.0.0.1:`port` to the PostgreSQL of `target_dsn`. `down()` cuts every
    connection and refuses new ones (the listening socket is closed); `up()` listens again on
    the same port."""

    def __init__(self, target_dsn: str) -> None:
        parts = urlsplit(target_dsn)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._target_dsn = target_dsn
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._refusing = False
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        # `cut_when_sent`: the next connection whose client sends these bytes is cut before they
        # reach the server (a connection that breaks at one chosen statement).
        self._cut_pattern: bytes | None = None
        self.cut_done = asyncio.Event()

    def dsn(self) -> str:
        parts = urlsplit(self._target_dsn)
        netloc = parts.netloc.rsplit("@", 1)
        auth = netloc[0] + "@" if len(netloc) == 2 else ""
        return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{self.port}"))

    async def up(self) -> None:
        self._refusing = False
        if self._server is None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)

    async def down(self, *, hold_port: bool = False) -> None:
        """`hold_port`: keep listening and reset every new connection at once, so that no other
        process takes the port meanwhile (it came from the ephemeral range, which outgoing
        connections draw from too) and `up()` cannot fail to bind it again."""
        self._refusing = hold_port
        if self._server is not None and not hold_port:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def retarget(self, target_dsn: str) -> None:
        """Forwards new connections to the PostgreSQL of `target_dsn` (a failover behind a proxy
        that follows the primary); `cut()` ends the old ones."""
        parts = urlsplit(target_dsn)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)

    async def cut(self) -> None:
        """Cuts every open connection (as a restart of PostgreSQL would) and keeps listening."""
        for writer in list(self._writers):
            writer.transport.abort()

    def cut_when_sent(self, pattern: bytes) -> None:
        """Cuts the first connection that sends `pattern` (a statement's text: psycopg sends it
        until a statement is prepared), before the server sees it; `cut_done` is set then."""
        self._cut_pattern = pattern
        self.cut_done.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        for source, sink, upstream in ((reader, up_writer, True), (up_reader, writer, False)):
            task = asyncio.create_task(self._pipe(source, sink, (writer, up_writer), upstream=upstream))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, both: tuple[asyncio.StreamWriter, ...], *, upstream: bool = False
    ) -> None:
        try:
            while data := await source.read(65536):
                if upstream and self._cut_pattern is not None and self._cut_pattern in data:
                    self._cut_pattern = None
                    self.cut_done.set()
                    break
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in both:
                writer.transport.abort()
                self._writers.discard(writer)


# The replica's LISTEN connection in pg_stat_activity: `query` says LISTEN until its first liveness
# query, then that query's text.
LISTENER = f"(query LIKE 'LISTEN%' OR query = '{LIVENESS_QUERY}')"


def backend_pids(dsn: str, where: str) -> list[int]:
    """Pids of the backends of `dsn`'s database matching the SQL condition `where` (on
    pg_stat_activity), this session's own excluded."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(  # type: ignore[call-overload]
            f"SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND ({where})"
        ).fetchall()
    return [int(pid) for (pid,) in rows]


@contextlib.contextmanager
def frozen(pids: list[int]) -> Iterator[list[int]]:
    """SIGSTOPs the backends for the block: their sockets stay open, their kernel answers TCP,
    and nothing they were asked is answered. A backend that exited since it was listed (its pool
    closed the connection, its replica reconnected) is left out: the block gets the pids it froze,
    and every one of them is let go again, even when a later one was gone."""
    stopped: list[int] = []
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            stopped.append(pid)
        yield stopped
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
