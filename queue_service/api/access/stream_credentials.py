"""A stream's credentials hold for as long as the stream does, on both listeners.

A call is authorized when it opens; a unary call ends soon after, but a WatchJobs or
WatchOverview stream may stay open for hours. So while a stream is open, its road re-runs the
checks of its opening every RECHECK_SECONDS: the caller's token or certificate against the auth
file in force, and the request's user assertion (`user_assertions`). The first that fails ends
the stream with that refusal, as it would refuse a new call: UNAUTHENTICATED (a revoked token,
`USER_ASSERTION_INVALID` `expired` for an assertion past its `exp`) or PERMISSION_DENIED with its
reason. So a token revoked by a reload (SIGHUP, or the file watch) loses its open streams within
RECHECK_SECONDS of the reload, and a stream opened with an assertion ends within RECHECK_SECONDS
of the assertion's expiry plus QUEUE_USER_ASSERTION_LEEWAY_SECONDS: a `web` caller that streams
for long reconnects with a fresh assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from queue_service.errors import QueueError

log = logging.getLogger(__name__)

RECHECK_SECONDS = 5.0

_Message = TypeVar("_Message")


async def while_authorized(
    method: str, messages: AsyncIterator[_Message], recheck: Callable[[], Awaitable[None]], interval: float = RECHECK_SECONDS
) -> AsyncIterator[_Message]:
    """Yields `messages` while `recheck` passes, run every `interval` seconds whether messages
    flow or not; its QueueError ends the stream (and reaches the road, which maps it)."""
    loop = asyncio.get_running_loop()
    # The handler's steps run in tasks of their own (so a recheck never interrupts one), all in
    # one copy of the call's context: what a step sets, the next still sees.
    context = contextvars.copy_context()

    async def next_message() -> _Message:
        return await anext(messages)

    step: asyncio.Task[_Message] | None = None
    next_check = loop.time() + interval
    try:
        while True:
            if step is None:
                step = asyncio.create_task(next_message(), context=context)
            done, _ = await asyncio.wait({step}, timeout=max(0.0, next_check - loop.time()))
            if done:
                finished, step = step, None
                try:
                    message = finished.result()
                except StopAsyncIteration:
                    return
                yield message
            if loop.time() >= next_check:
                try:
                    await recheck()
                except QueueError as refused:
                    log.info("%s: stream ended, its credentials no longer hold: %s", method, refused.message)
                    raise
                next_check = loop.time() + interval
    finally:
        if step is not None:
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
        aclose = getattr(messages, "aclose", None)
        if aclose is not None:
            await aclose()
