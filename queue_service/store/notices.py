"""The notices a LISTENing connection receives, read only when its socket has something to read.

psycopg's `AsyncConnection.notifies()` waits in slices of 100 ms (its wait interval, there so a
blocking wait can notice Ctrl-C): an idle listener wakes ten times a second to find nothing,
removing and re-adding its socket to the event loop each time. That cost every replica about
3.5 ms of CPU per second while nothing happened, most of what an idle replica spent
(docs/scaling.md §1, the idle replica). Here the event loop watches the socket, and the reader
wakes when a notice, an error or the connection's end arrives, never otherwise.

Built on psycopg's public libpq wrapper (`PGconn.consume_input`, `PGconn.notifies`), as psycopg's
own generator is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection, pq, sql


class NoticeReader:
    """The payloads of the notices on a connection that does nothing but LISTEN, in arrival
    order. Raises `psycopg.OperationalError` once the connection is lost."""

    def __init__(self, conn: AsyncConnection[Any], received_while_listening: list[str]) -> None:
        self._pgconn = conn.pgconn
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
            await self._readable.wait()
            self._readable.clear()
            self._pgconn.consume_input()  # raises once the server has closed the connection
            if self._pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the LISTEN connection was lost")
            while (notice := self._pgconn.notifies()) is not None:
                self._payloads.append(notice.extra.decode(self._encoding))
        return self._payloads.popleft()

    def close(self) -> None:
        """Stops watching the socket; before the connection closes, since its number may be
        reused at once by the next connection."""
        self._loop.remove_reader(self._socket)


@asynccontextmanager
async def listening(database_url: str, channel: str) -> AsyncIterator[NoticeReader]:
    """A dedicated autocommit connection LISTENing on `channel`; yields its notices' payloads."""
    async with await AsyncConnection.connect(database_url, autocommit=True) as conn:
        # Notices psycopg reads while it runs the LISTEN itself reach this handler, not the socket.
        received_while_listening: list[str] = []

        def keep(notice: psycopg.Notify) -> None:
            received_while_listening.append(notice.payload)

        conn.add_notify_handler(keep)
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        conn.remove_notify_handler(keep)
        reader = NoticeReader(conn, received_while_listening)
        try:
            yield reader
        finally:
            reader.close()
