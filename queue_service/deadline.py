"""The caller's deadline as a budget that every wait inside a call draws on.

The gRPC edge records when the caller gives up, less a reserve for sending the answer. Each wait
inside the call (a pool checkout, the user lock, a statement, a call to the core) is bounded by
what is left as well as by its configured limit, so a slow database, a busy user lock or a hung
core makes the service answer UNAVAILABLE with the reason of the wait that ran out *before* the
caller's deadline passes, instead of leaving the caller to time out without knowing why.

Background work (dispatcher, sweeper, a failed admit's clean-up) runs detached from any call:
only the configured limits bound it (and each of its exchanges with a server that stopped
answering is given up a little after the statement timeout: `store.pool.QueueConnection`).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections.abc import Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

T = TypeVar("T")

_call_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("queue_call_deadline", default=None)

# Kept back from the caller's deadline for building and sending the answer: a tenth of the
# call's time, at least 50 ms and at most half a second while the event loop keeps time.
_RESERVE_SHARE = 0.1
_RESERVE_MIN_SECONDS = 0.05
_RESERVE_MAX_SECONDS = 0.5
# On a starved CPU the event loop runs late, and an answer waits for the loop twice after its
# last bounded wait ran out: to wake the call up, then to hand the answer to gRPC. So the reserve
# is at least LAG_TURNS times the loop's recent lateness (`LoopLag`), but never more than
# LAG_MAX_SHARE of the call's time: a call then answers its own status, early, instead of
# leaving the caller to hear DEADLINE_EXCEEDED.
_LAG_TURNS = 3.0
_LAG_MAX_SHARE = 0.5


class LoopLag:
    """How late this process's event loop has been running lately: a timer that should fire every
    `interval` seconds measures how late it fires; the figure kept is the recent peak, decaying
    by half every `half_life` seconds, so one stall is remembered for a while, not forever.

    The figure serves calls (their reserves, `lag_allowance`). While no call has come for
    `busy_for` seconds the timer fires only every `idle_interval` seconds, so an idle replica is
    not woken twenty times a second; the next call (`note_call`) ends that rest at once, and how
    late the timer then resumes is itself a reading of the loop's lateness."""

    def __init__(self, interval: float = 0.05, half_life: float = 5.0, idle_interval: float = 1.0, busy_for: float = 2.0) -> None:
        self.interval = interval
        self.half_life = half_life
        self.idle_interval = idle_interval
        self.busy_for = busy_for
        self._peak = 0.0
        self._peak_at = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._users = 0
        self._call_at = float("-inf")
        # While resting: the future the slow tick waits on, and when a call woke it.
        self._rest: asyncio.Future[None] | None = None
        self._woken_at = 0.0
        self.ticks = 0

    @property
    def seconds(self) -> float:
        return self._peak * math.pow(0.5, (time.monotonic() - self._peak_at) / self.half_life)

    def observe(self, lateness: float) -> None:
        if lateness >= self.seconds:
            self._peak, self._peak_at = lateness, time.monotonic()

    def note_call(self) -> None:
        """A call began: the loop is watched closely again (at once, if it was resting)."""
        now = time.monotonic()
        self._call_at = now
        rest = self._rest
        if rest is not None and not rest.done():
            self._woken_at = now
            rest.set_result(None)

    @property
    def resting(self) -> bool:
        return self._rest is not None

    def start(self) -> None:
        """Watches the running loop; every `start` is matched by a `stop` (several servers may
        share a process: the watch ends with the last)."""
        self._users += 1
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = spawn_detached(self._watch(), name="loop-lag")

    async def stop(self) -> None:
        self._users = max(0, self._users - 1)
        if self._users == 0 and self._task is not None and self._task.get_loop() is asyncio.get_running_loop():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.ticks += 1
            if time.monotonic() - self._call_at < self.busy_for:
                planned = time.monotonic() + self.interval
                await asyncio.sleep(self.interval)
                self.observe(max(0.0, time.monotonic() - planned))
                continue
            rest = self._rest = loop.create_future()
            planned = time.monotonic() + self.idle_interval
            timer = loop.call_later(self.idle_interval, _settle, rest)
            try:
                await rest
            finally:
                timer.cancel()
                self._rest = None
            now = time.monotonic()
            # Woken by a call: how long the loop took to resume the watch is its lateness now.
            self.observe(max(0.0, now - planned) if now >= planned else now - self._woken_at)


def _settle(rest: asyncio.Future[None]) -> None:
    if not rest.done():
        rest.set_result(None)


# The process's monitor; the server starts it (unstarted, it reads no lag).
loop_lag = LoopLag()


def lag_allowance() -> float:
    """How late an answer this process is waiting for may be handled, as the loop runs now: a
    wait that must end before another (a lock timeout before its statement's deadline) ends
    this much earlier."""
    return _LAG_TURNS * loop_lag.seconds


def reply_reserve(time_remaining: float) -> float:
    usual = min(_RESERVE_MAX_SECONDS, max(_RESERVE_MIN_SECONDS, time_remaining * _RESERVE_SHARE))
    return max(usual, min(_LAG_MAX_SHARE * time_remaining, lag_allowance()))


def call_budget(time_remaining: float | None) -> AbstractContextManager[None]:
    """Bounds every wait inside the block by the caller's deadline (`None`: no deadline)."""
    return _NO_BUDGET if time_remaining is None else _CallBudget(time_remaining)


_NO_BUDGET: AbstractContextManager[None] = nullcontext()


class _CallBudget:
    """`call_budget`'s block: a class, not a generator, as every call enters one."""

    __slots__ = ("_time_remaining", "_previous")

    def __init__(self, time_remaining: float) -> None:
        self._time_remaining = time_remaining

    def __enter__(self) -> None:
        self._previous = _call_deadline.get()
        _call_deadline.set(time.monotonic() + self._time_remaining - reply_reserve(self._time_remaining))

    def __exit__(self, *exc_info: object) -> None:
        # Not Token.reset: a stream's generator may be closed from another context.
        _call_deadline.set(self._previous)


@contextmanager
def share_of_remaining(share: float) -> Iterator[None]:
    """Bounds the block's waits by `share` of what is left of the call's deadline: for a step
    whose failure the call survives, so that time is left to answer without it. Outside a call
    with a deadline, only the configured limits apply."""
    left = remaining()
    if left is None:
        yield
        return
    previous = _call_deadline.get()
    _call_deadline.set(time.monotonic() + max(0.0, left) * share)
    try:
        yield
    finally:
        _call_deadline.set(previous)


def remaining() -> float | None:
    """Seconds left for the current call's work, or None outside a call with a deadline."""
    deadline = _call_deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def bound(limit: float, share: float = 1.0) -> float:
    """`limit` seconds, or less when the caller's deadline comes sooner: at most `share` of what
    is left (a call to the core leaves time for the transaction after it). Never negative."""
    left = remaining()
    return limit if left is None else max(0.0, min(limit, left * share))


async def acquire(slots: asyncio.Semaphore, *, limit: float | None = None, share: float = 1.0) -> bool:
    """Takes one of `slots`, waiting no longer than `limit` seconds nor `share` of what is left of
    the caller's deadline (without either, as long as it takes); False when no slot came in time."""
    if not slots.locked():
        await slots.acquire()
        return True
    left = remaining()
    if left is None:
        wait = limit
    else:
        wait = max(0.0, min(left * share, limit if limit is not None else left))
    try:
        await asyncio.wait_for(slots.acquire(), timeout=wait)
    except TimeoutError:
        return False
    return True


def spawn_detached(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
    """Starts background work that must not inherit the current call's deadline."""
    context = contextvars.copy_context()
    context.run(_call_deadline.set, None)
    return asyncio.get_running_loop().create_task(coro, name=name, context=context)
