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
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_call_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("queue_call_deadline", default=None)

# Kept back from the caller's deadline for building and sending the answer: a tenth of the
# call's time, at least 50 ms (a busy event loop) and at most half a second.
_RESERVE_SHARE = 0.1
_RESERVE_MIN_SECONDS = 0.05
_RESERVE_MAX_SECONDS = 0.5


def reply_reserve(time_remaining: float) -> float:
    return min(_RESERVE_MAX_SECONDS, max(_RESERVE_MIN_SECONDS, time_remaining * _RESERVE_SHARE))


@contextmanager
def call_budget(time_remaining: float | None) -> Iterator[None]:
    """Bounds every wait inside the block by the caller's deadline (`None`: no deadline)."""
    if time_remaining is None:
        yield
        return
    previous = _call_deadline.get()
    _call_deadline.set(time.monotonic() + time_remaining - reply_reserve(time_remaining))
    try:
        yield
    finally:
        # Not Token.reset: a stream's generator may be closed from another context.
        _call_deadline.set(previous)


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
