"""The notices a LISTENing connection receives, read only when its socket has something to read.

psycopg's `AsyncConnection.notifies()` waits in slices of 100 ms (its wait interval, there so a
blocking wait can notice Ctrl-C): an idle listener wakes ten times a second to find nothing,
removing and re-adding its socket to the event loop each time. That cost every replica about
3.5 ms of CPU per second while nothing happened, most of what an idle replica spent
(docs/scaling.md §1, the idle replica). Here the event loop watches the socket, and the reader
wakes when a notice, an error or the connection's end arrives, never otherwise.

A listener must also notice when its peer goes silent: a frozen primary, a node that crashed
without closing its sockets, a network path that drops everything. Nothing arrives then, which
is what an idle channel looks like too. So after `liveness_seconds` without traffic the reader
sends a liveness query (`LIVENESS_QUERY`, a text of its own so an operator, and a test, can tell
the listener in `pg_stat_activity` after its first probe, when `query` no longer says LISTEN) on
the connection and ends with OperationalError when no
answer comes within `liveness_seconds` more; the caller reconnects and resyncs. TCP keepalives
(`pool.connection_parameters`) would notice a dead node too, but not a live kernel in front of a
frozen server.

Built on psycopg's public libpq wrapper (`PGconn.consume_input`, `PGconn.notifies`,
`PGconn.send_query`, `PGconn.get_result`), as psycopg's own generator is.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection, pq, sql

from queue_service import telemetry

LIVENESS_QUERY = "SELECT 1 AS listener_liveness"


class NoticeReader:
    """The payloads of the notices on a connection that does nothing but LISTEN, in arrival
    order. Raises `psycopg.OperationalError` once the connection is lost."""

    def __init__(self, conn: AsyncConnection[Any], received_while_listening: list[str], *, liveness_seconds: float | None = None) -> None:
        self._pgconn = conn.pgconn
        self._liveness_seconds = liveness_seconds
        # When the liveness query in flight must have been answered (None: none in flight).
        self._probe_due: float | None = None
        self._encoding = conn.info.encoding
        self._payloads = deque(received_while_listening)
        self._readable = asyncio.Event()
        # A first pass without waiting: what libpq had read behind the LISTEN's own answer is in
        # its buffer, not on the socket, so no readiness would announce it.
        self._readable.set()
        self._loop = asyncio.get_running_loop()
        self._socket = self._pgconn.socket
        self._loop.add_reader(self._socket, self._readable.set)

    def __aiter__(self) -> NoticeReader:
        return self

    async def __anext__(self) -> str:
        while not self._payloads:
            await self._wait_readable()
            self._readable.clear()
            self._pgconn.consume_input()  # raises once the server has closed the connection
            if self._pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the LISTEN connection was lost")
            while (notice := self._pgconn.notifies()) is not None:
                self._payloads.append(notice.extra.decode(self._encoding))
            if self._probe_due is not None:
                self._read_probe_answer()
        return self._payloads.popleft()

    async def _wait_readable(self) -> None:
        """Until the socket is readable; with liveness checks, sends the liveness query after a
        quiet spell and raises OperationalError when its answer is late."""
        if self._liveness_seconds is None:
            await self._readable.wait()
            return
        while not self._readable.is_set():
            if self._probe_due is None:
                wait = self._liveness_seconds
            else:
                wait = self._probe_due - time.monotonic()
            try:
                async with asyncio.timeout(max(0.0, wait)):
                    await self._readable.wait()
                return
            except TimeoutError:
                if self._probe_due is not None:
                    telemetry.metrics.listener_liveness_failures.add(1)
                    raise psycopg.OperationalError(
                        f"the LISTEN connection did not answer a liveness query within {self._liveness_seconds:g}s"
                    ) from None
                self._pgconn.send_query(LIVENESS_QUERY.encode())
                self._pgconn.flush()
                self._probe_due = time.monotonic() + self._liveness_seconds

    def _read_probe_answer(self) -> None:
        """Takes the liveness query's results, if they have all arrived."""
        while not self._pgconn.is_busy():
            result = self._pgconn.get_result()
            if result is None:
                self._probe_due = None
                return
            if result.status == pq.ExecStatus.FATAL_ERROR:
                message = (result.error_message or b"").decode(self._encoding, "replace").strip()
                raise psycopg.OperationalError(f"the LISTEN connection's liveness query failed: {message}")

    def close(self) -> None:
        """Stops watching the socket; before the connection closes, since its number may be
        reused at once by the next connection."""
        self._loop.remove_reader(self._socket)


@asynccontextmanager
async def listening(
    database_url: str, channel: str, *, liveness_seconds: float | None = None, **connect_parameters: Any
) -> AsyncIterator[NoticeReader]:
    """A dedicated autocommit connection LISTENing on `channel`; yields its notices' payloads.
    With `liveness_seconds`, a silent connection is checked with a liveness query (module doc);
    `connect_parameters` go to libpq (keepalives)."""
    async with await AsyncConnection.connect(database_url, autocommit=True, **connect_parameters) as conn:
        # Notices psycopg reads while it runs the LISTEN itself reach this handler, not the socket.
        received_while_listening: list[str] = []

        def keep(notice: psycopg.Notify) -> None:
            received_while_listening.append(notice.payload)

        conn.add_notify_handler(keep)
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        conn.remove_notify_handler(keep)
        reader = NoticeReader(conn, received_while_listening, liveness_seconds=liveness_seconds)
        try:
            yield reader
        finally:
            reader.close()
