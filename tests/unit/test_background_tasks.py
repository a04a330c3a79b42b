"""The engine's background tasks (`engine/tasks.py`): a change outlives a caller who stops
listening, and stopping waits a moment for what runs, then cancels the rest."""

from __future__ import annotations

import asyncio

import pytest

from queue_service.engine.tasks import BackgroundTasks


async def test_a_change_outlives_the_caller_who_stops_listening() -> None:
    tasks = BackgroundTasks()
    committed = asyncio.Event()
    follow_up_done = asyncio.Event()

    async def change() -> str:
        committed.set()
        await asyncio.sleep(0.05)  # the follow-up the commit owes
        follow_up_done.set()
        return "done"

    caller = asyncio.create_task(tasks.outliving_the_caller(change(), name="probe-change"))
    await committed.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(follow_up_done.wait(), timeout=5)
    assert await tasks.outliving_the_caller(asyncio.sleep(0, result="answer"), name="probe-answer") == "answer"


async def test_a_clean_up_s_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    tasks = BackgroundTasks()

    async def failing() -> None:
        raise RuntimeError("boom")

    await tasks.in_background(failing(), name="probe-clean-up")
    assert "probe-clean-up failed; the sweeper retries it" in caplog.text


async def test_stop_waits_for_quick_work_and_cancels_the_rest() -> None:
    tasks = BackgroundTasks(stop_seconds=0.2)
    quick = tasks.in_background(asyncio.sleep(0.01), name="quick")
    stuck_started = asyncio.Event()

    async def stuck() -> None:
        stuck_started.set()
        await asyncio.sleep(60)

    slow = tasks.in_background(stuck(), name="stuck")
    await stuck_started.wait()
    await tasks.stop()
    await asyncio.sleep(0)
    assert quick.done() and not quick.cancelled()
    assert slow.cancelled() or slow.cancelling()
