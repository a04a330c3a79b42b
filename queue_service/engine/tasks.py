"""The engine's tasks that a call does not wait for, or that must not end with it.

`QueueEngine` owns one `BackgroundTasks` (`engine.tasks`); admission and releases use it too, so
stopping the engine waits for (then cancels) every clean-up and every change that outlived its
caller, whichever room started it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from queue_service import audit, deadline, errors

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# How long stopping waits for background clean-ups (they are durable: the sweeper finishes any
# that do not get done).
BACKGROUND_STOP_SECONDS = 2.0


class BackgroundTasks:
    def __init__(self, *, stop_seconds: float = BACKGROUND_STOP_SECONDS) -> None:
        self._stop_seconds = stop_seconds
        self._running: set[asyncio.Task[Any]] = set()

    def in_background(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[None]:
        """Runs clean-up work detached from the current call (its deadline, its cancellation, its
        caller: what it does is the system's own, `audit`)."""
        task = deadline.spawn_detached(audit.as_system(_logged(work, name)), name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def outliving_the_caller(self, change: Coroutine[Any, Any, T], name: str) -> T:
        """Runs a change and the follow-up its commit owes (the hand-over of a promoted job's
        release, a settlement) in a task the caller's cancellation does not reach: the caller hears
        the result while it listens, and a caller that gives up (or whose answer is lost) no longer
        takes the follow-up of a committed change with it. The task keeps the call's context: its
        deadline budget (so its waits stay bounded) and its caller (`audit`)."""
        task = asyncio.get_running_loop().create_task(change, name=name, context=contextvars.copy_context())
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        task.add_done_callback(_forget_outlived)
        return await asyncio.shield(task)

    async def stop(self) -> None:
        """Waits a moment for what is running, then cancels what is left."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=self._stop_seconds)
        for task in list(self._running):
            task.cancel()


async def _logged(work: Coroutine[Any, Any, Any], name: str) -> None:
    try:
        await work
    except errors.QueueError as exc:
        log.warning("%s did not finish (%s); the sweeper retries it", name, exc.message)
    except Exception:
        log.exception("%s failed; the sweeper retries it", name)


def _forget_outlived(task: asyncio.Task[Any]) -> None:
    """Retrieves the outcome of a change whose caller stopped listening (nobody else will); its
    errors reached the caller, or were the caller's to hear and are logged by the store's retry
    paths (the sweeper), so only unexpected ones are logged here."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, errors.QueueError):
        log.debug("%s failed after its caller stopped listening: %r", task.get_name(), exc)


async def each_at_most(at_once: int, items: Sequence[T], work: Callable[[T], Awaitable[R]]) -> list[R | errors.QueueError]:
    """Runs `work` for every item, at most `at_once` at a time (bulk cancel, bulk retry: each may
    call the core); per item, in order, its result or the refusal it raised."""
    slots = asyncio.Semaphore(at_once)

    async def one(item: T) -> R | errors.QueueError:
        async with slots:
            try:
                return await work(item)
            except errors.QueueError as error:
                return error

    return list(await asyncio.gather(*(one(item) for item in items)))
