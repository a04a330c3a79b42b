"""The reply reserve grows with the event loop's lateness (`deadline.LoopLag`), so a replica whose
loop runs late answers its own status early instead of after its caller's deadline."""

from __future__ import annotations

import asyncio
import time

import pytest

from queue_service import deadline


@pytest.fixture(autouse=True)
def _quiet_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadline, "loop_lag", deadline.LoopLag())


def test_the_reserve_on_a_punctual_loop_is_a_tenth_within_its_bounds() -> None:
    assert deadline.reply_reserve(5.0) == pytest.approx(0.5)
    assert deadline.reply_reserve(1.0) == pytest.approx(0.1)
    assert deadline.reply_reserve(0.2) == pytest.approx(0.05)
    assert deadline.reply_reserve(30.0) == pytest.approx(0.5)


def test_a_late_loop_widens_the_reserve_to_three_times_its_lateness_at_most_half_the_call() -> None:
    deadline.loop_lag.observe(0.4)
    assert deadline.reply_reserve(5.0) == pytest.approx(1.2, abs=0.01)
    assert deadline.reply_reserve(1.0) == pytest.approx(0.5)
    assert deadline.lag_allowance() == pytest.approx(1.2, abs=0.01)


def test_the_lateness_remembered_decays_by_half_every_half_life() -> None:
    lag = deadline.LoopLag(half_life=0.2)
    lag.observe(1.0)
    time.sleep(0.2)
    assert lag.seconds == pytest.approx(0.5, abs=0.1)
    lag.observe(0.1)  # lower than what is remembered: the peak stands
    assert lag.seconds > 0.3


async def test_the_watch_measures_a_loop_blocked_by_synchronous_work() -> None:
    lag = deadline.LoopLag(interval=0.01)
    lag.note_call()  # calls are being answered: the loop is watched closely
    lag.start()
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # the loop is blocked: the watch's timer fires about 0.3 s late
    await asyncio.sleep(0.05)
    await lag.stop()
    assert 0.2 < lag.seconds < 0.6


async def test_without_calls_the_watch_rests_and_the_next_call_wakes_it_at_once() -> None:
    """An idle replica is not woken twenty times a second: with no call for `busy_for` seconds
    the watch ticks every `idle_interval`; a call ends the rest at once, and the watch is close
    again (a stall right after it is measured)."""
    lag = deadline.LoopLag(interval=0.01, idle_interval=5.0, busy_for=0.05)
    lag.start()
    await asyncio.sleep(0.3)
    assert lag.resting
    ticks = lag.ticks
    await asyncio.sleep(0.3)
    assert lag.ticks == ticks, "a resting watch ticked before its idle interval"
    lag.note_call()
    # At once: long before the idle interval (5 s), however slow the machine is to schedule it.
    woken_by = time.monotonic() + 2.0
    while (lag.resting or lag.ticks == ticks) and time.monotonic() < woken_by:
        await asyncio.sleep(0.01)
    assert not lag.resting and lag.ticks > ticks
    time.sleep(0.3)  # blocked right after the call
    await asyncio.sleep(0.03)
    await lag.stop()
    assert 0.2 < lag.seconds < 0.6


async def test_a_call_waking_a_resting_watch_reads_how_late_the_loop_resumed_it() -> None:
    lag = deadline.LoopLag(interval=0.01, idle_interval=5.0, busy_for=0.0)
    lag.start()
    await asyncio.sleep(0.05)
    assert lag.resting
    lag.note_call()
    time.sleep(0.25)  # the loop is busy with this call's work before the watch can resume
    await asyncio.sleep(0.02)
    await lag.stop()
    assert 0.15 < lag.seconds < 0.6
