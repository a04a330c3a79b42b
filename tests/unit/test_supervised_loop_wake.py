"""The supervised loop's wake-ups as the watch hub's feed reader uses them: an event chosen for
each wait, a back-off that no wake-up cuts short, and a long-held step that marks itself
recovered (its next failure backs off from the first wait)."""

from __future__ import annotations

import asyncio

import pytest

from queue_service.background import SupervisedLoop
from tests.harness import eventually

LONG = 1000.0


async def test_the_event_is_chosen_for_each_wait() -> None:
    first, second = asyncio.Event(), asyncio.Event()
    steps: list[str] = []
    chosen = [first]

    async def step() -> float:
        # As the loops that wait for events do: what is set during the step wakes the next one.
        first.clear()
        second.clear()
        steps.append("step")
        return LONG

    loop = SupervisedLoop("test", step, interval_seconds=LONG, expected=(), wake=lambda: chosen[0])
    loop.start()
    try:
        await eventually(lambda: len(steps) == 1, what="the first step")
        chosen[0] = second  # read at the next wait: the current one still waits for `first`
        first.set()
        await eventually(lambda: len(steps) == 2, what="the step woken by the first event")
        assert loop.woken_by == "event"
        second.set()
        await eventually(lambda: len(steps) == 3, what="the step woken by the second event")
    finally:
        await loop.stop()


@pytest.mark.parametrize("ends_backoff", [True, False])
async def test_a_back_off_ignores_wake_ups_unless_they_may_end_it(ends_backoff: bool) -> None:
    wake = asyncio.Event()
    steps: list[int] = []

    async def step() -> None:
        wake.clear()
        steps.append(1)
        if len(steps) == 1:
            raise ValueError("the first step fails")

    loop = SupervisedLoop(
        "test", step, interval_seconds=LONG, expected=(ValueError,), wake=wake, wake_ends_backoff=ends_backoff, backoff_seconds=(LONG, LONG)
    )
    loop.start()
    try:
        await eventually(lambda: loop.failures_in_a_row == 1, what="the failed step")
        wake.set()
        if ends_backoff:
            await eventually(lambda: len(steps) == 2, what="the step the wake-up started")
        else:
            await asyncio.sleep(0.1)
            assert len(steps) == 1, "a wake-up ended the back-off"
    finally:
        await loop.stop()


async def test_a_step_marked_recovered_backs_off_from_the_first_wait_at_its_next_failure() -> None:
    held = asyncio.Event()

    async def step() -> None:
        loop.recovered()
        await held.wait()
        raise ValueError("the connection it held dropped")

    loop = SupervisedLoop("test", step, interval_seconds=LONG, expected=(ValueError,), backoff_seconds=(LONG, LONG))
    loop.failures_in_a_row = 5
    loop.start()
    try:
        await eventually(lambda: loop.failures_in_a_row == 0, what="the step marked recovered")
        held.set()
        await eventually(lambda: loop.failures_in_a_row == 1, what="the next failure counted from one")
    finally:
        await loop.stop()
