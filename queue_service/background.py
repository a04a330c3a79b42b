"""The background loops: one supervised shape for every loop that repeats a step (the
maintenance services, the dispatcher, the heartbeat, the credentials watch, the watch hub's
feed reader and hint listener), and stopping them reliably."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

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


class SupervisedLoop:
    """Runs one step of background work over and over, on one shape for every loop of the
    service: the step, then a wait (the interval, jittered, or the seconds the step returned),
    until `stop`; a step that calls `again_at_once` is followed by the next without a wait. A failure never ends the loop: one of the `expected`
    kinds (the database or the core away) is logged as a warning, anything else with its
    traceback, and the next step waits the interval, or a doubling back-off when one is given.

    `wake`, when given, ends a wait early (the step is due now: `woken_by` says "event"); it may
    be a function naming the event for each wait (a loop woken by different things as its state
    changes), and `wake_ends_backoff=False` leaves the wait after a failure to the timer (a loop
    whose failed step does not clear its event would otherwise retry at once, over and over);
    `wait_first` waits the interval before the first step too. A step that holds something open
    for long (a connection it listens on) calls `recovered` once it got through what fails, so
    its next failure backs off from the first wait again."""

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[float | None]],
        *,
        interval_seconds: float,
        expected: tuple[type[Exception], ...],
        jitter: tuple[float, float] = (1.0, 1.0),
        wait_first: bool = False,
        wake: asyncio.Event | Callable[[], asyncio.Event] | None = None,
        wake_ends_backoff: bool = True,
        backoff_seconds: tuple[float, float] | None = None,
        failure_log: tuple[str, str] | None = None,
    ) -> None:
        self.name = name
        self._step = step
        self.interval_seconds = interval_seconds
        self._expected = expected
        self._jitter = jitter
        self._wait_first = wait_first
        self._wake = wake
        self._wake_ends_backoff = wake_ends_backoff
        # (first, most): the wait after the n-th failure in a row is min(most, first * 2**n).
        self._backoff = backoff_seconds
        # What a failure logs: an expected one (with `%s`, the error), anything else (with the
        # traceback). Operators search the logs for these words (docs/operations.md).
        self._failure_log = failure_log or (f"{name} failed (%s); retrying", f"{name} failed; retrying")
        # How the current step was started: "start", "event" (woken), "timer", "at_once".
        self.woken_by = "start"
        self.failures_in_a_row = 0
        self._at_once = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=self.name)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def recovered(self) -> None:
        """Called by a step that got through what fails (and goes on, holding it open): the
        failures in a row end here."""
        self.failures_in_a_row = 0

    def again_at_once(self) -> None:
        """Called by a step with more to do: the next step starts without a wait."""
        self._at_once = True

    async def run(self) -> None:
        """The loop itself (`start` runs it in a task of its own)."""
        if self._wait_first:
            await self._wait(self._jittered())
        while True:
            self._at_once = False
            failed = True
            try:
                due_in = await self._step()
                self.failures_in_a_row = 0
                failed = False
            except self._expected as exc:
                self.failures_in_a_row += 1
                log.warning(self._failure_log[0], exc)
                due_in = self._after_failure()
            except Exception:
                self.failures_in_a_row += 1
                log.exception(self._failure_log[1])
                due_in = self._after_failure()
            if self._at_once:
                self.woken_by = "at_once"
                continue
            await self._wait(self._jittered() if due_in is None else due_in, wakeable=not failed or self._wake_ends_backoff)

    def _jittered(self) -> float:
        return self.interval_seconds * random.uniform(*self._jitter)

    def _after_failure(self) -> float | None:
        if self._backoff is None:
            return None
        first, most = self._backoff
        return float(min(most, first * 2**self.failures_in_a_row))

    async def _wait(self, seconds: float, *, wakeable: bool = True) -> None:
        wake = self._wake() if callable(self._wake) else self._wake
        if wake is None or not wakeable:
            await asyncio.sleep(seconds)
            self.woken_by = "timer"
            return
        try:
            await asyncio.wait_for(wake.wait(), timeout=seconds)
            self.woken_by = "event"
        except TimeoutError:
            self.woken_by = "timer"
