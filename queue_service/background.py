"""Stopping the background loops (dispatcher, sweeper, notification hub) reliably."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task[None] | None, timeout: float = 5.0) -> None:
    """Cancels a background loop and waits, at most `timeout`, for it to end.

    A library may turn a cancellation into an ordinary error (psycopg reports a statement it
    cancelled on the server as QueryCanceled), which a loop's error handling then survives; so
    the cancellation is repeated until the task has really ended.
    """
    if task is None:
        return
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + timeout
    while not task.done() and loop.time() < give_up_at:
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.done():
        log.error("background task %s did not stop within %.1fs", task.get_name(), timeout)
    elif not task.cancelled() and task.exception() is not None:
        log.error("background task %s had failed", task.get_name(), exc_info=task.exception())
