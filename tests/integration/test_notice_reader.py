"""The LISTEN connection's reader: every notice in order, the end of the connection as an error,
and no wake-up while nothing arrives (psycopg's own `notifies()` re-armed its socket every 100 ms,
which cost an idle replica most of its CPU)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from queue_service.store import notices
from tests.faults import LISTENER, backend_pids
from tests.harness import until

_CHANNEL = "test_notice_reader"


async def _notify(database_url: str, *payloads: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:  # one transaction
        for payload in payloads:
            await conn.execute("SELECT pg_notify(%s, %s)", (_CHANNEL, payload))


async def test_notices_arrive_in_order_and_the_lost_connection_ends_the_reader(database_url: str) -> None:
    async with notices.listening(database_url, _CHANNEL) as reader:
        await _notify(database_url, "one", "two")
        await _notify(database_url, "three ✓")
        received = [await asyncio.wait_for(anext(reader), 5) for _ in range(3)]
        assert received == ["one", "two", "three ✓"]

        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                f" WHERE {LISTENER} AND datname = current_database() AND pid <> pg_backend_pid()"
            )
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(anext(reader), 5)


async def test_an_idle_reader_leaves_the_event_loop_alone(database_url: str) -> None:
    loop = asyncio.get_running_loop()
    registrations: list[int] = []
    add_reader = loop.add_reader

    def counting_add_reader(fd: Any, callback: Any, *args: Any) -> None:
        registrations.append(fd)
        add_reader(fd, callback, *args)

    async with notices.listening(database_url, _CHANNEL) as reader:
        loop.add_reader = counting_add_reader  # type: ignore[method-assign]
        waiting = asyncio.create_task(anext(reader))
        try:
            await asyncio.sleep(0.5)
            # The socket was registered once, before; psycopg's notifies() re-registers it every
            # 100 ms while nothing arrives.
            assert registrations == []
            await _notify(database_url, "after a quiet spell")
            assert await asyncio.wait_for(waiting, 5) == "after a quiet spell"
        finally:
            waiting.cancel()
            del loop.add_reader


async def test_the_listener_is_told_apart_in_pg_stat_activity_after_its_liveness_query(database_url: str) -> None:
    """After its first liveness query, `pg_stat_activity.query` no longer says LISTEN: it names the
    liveness query, so an operator (and the fault tests, through `tests.faults.LISTENER`) still
    finds the replica's listener and tells it from the pool's connections."""
    async with notices.listening(database_url, _CHANNEL, liveness_seconds=0.2) as reader:
        waiting = asyncio.create_task(anext(reader))
        try:

            async def probed() -> bool:
                listeners = backend_pids(database_url, LISTENER)
                return len(listeners) == 1 and listeners == backend_pids(database_url, f"query = '{notices.LIVENESS_QUERY}'")

            await until(probed, within=5, what="the listener's liveness query in pg_stat_activity")
            await _notify(database_url, "still listening")
            assert await asyncio.wait_for(waiting, 5) == "still listening"
        finally:
            waiting.cancel()
