"""Coalescing of one kind of statement: requests that arrive while one runs go out together next.

A lone request runs at once, in its caller's own task (its deadline, its context); under a
burst, every request that arrived while a statement ran shares the next one: one round trip, one
commit and one WAL flush for all of them. This is group commit done by the caller.

No library fits: DataLoader-style batchers (aiodataloader) collect for one turn of the event
loop and cache by key; here a batch is whatever waited for the statement in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Hashable, Iterator
from typing import Any, Generic, TypeVar

from queue_service import deadline, errors, telemetry

Item = TypeVar("Item", bound=Hashable)
Result = TypeVar("Result")

# An item waits for the statement in flight at most this share of what is left of its deadline.
_PATIENCE_SHARE = 0.5

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class _RunAlone(Exception):
    """The statement of the item's batch failed as a whole: its caller runs the item alone (the
    cause is chained)."""


class Coalescer(Generic[Item, Result]):
    """Runs `run_batch` over one item at once when nothing is in flight, else over the items
    submitted while the previous batch ran (at most `max_batch`, in arrival order). A subclass
    writes the statement: its `run_batch` answers every item of its batch or raises (the
    subclasses: `completions.CompletionBatcher`, `releases.ReleaseMarker`). An error goes to the items
    of that batch only. When the batch had several items, or the subclass `applies_alone`, each
    caller then applies its own item alone, with `run_alone` (by default `run_batch` over it
    alone), in its own task, within its own deadline and outside the coalescer: one item that
    cannot be applied (a user's lock held elsewhere, say) fails or waits for itself only.
    Otherwise a lone item's caller hears its statement's error.

    `run_batch` should wait for no one long (a user's lock only briefly, `run_alone` then
    waits as the caller's deadline allows): while it runs, the next items wait for it. They wait
    at most half of what is left of their own deadline; an item still waiting then is
    withdrawn and its caller applies it alone.

    The batches of waiting items run in a task of their own, started with `spawn` (the caller's
    background work, outside any call's deadline): a caller that gives up neither fails the
    others nor withdraws its item."""

    # Whether a caller whose batch failed always applies its item alone (`run_alone`), a batch of
    # one included; else a lone item's caller hears its statement's error.
    applies_alone = False

    def __init__(self, *, max_batch: int, spawn: Spawn, name: str) -> None:
        self._max_batch = max_batch
        self._spawn = spawn
        self._name = name
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._busy = False

    async def run_batch(self, items: list[Item]) -> dict[Item, Result]:
        """The statement over a batch: every item's result, or an error for them all."""
        raise NotImplementedError

    async def run_alone(self, item: Item) -> Result:
        """One item by itself, after its batch failed or its caller stopped waiting for it."""
        return (await self.run_batch([item]))[item]

    async def submit(self, item: Item) -> Result:
        """The item's result once the statement of its batch returned."""
        if self._busy:
            return await self._wait_for_batch(item)
        self._busy = True
        try:
            return (await self.run_batch([item]))[item]
        except Exception as exc:
            if not self.applies_alone:
                raise
            batch_error = exc
        finally:
            self._hand_on()
        return await self._alone(item, batch_error)

    async def _wait_for_batch(self, item: Item) -> Result:
        answer: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        entry = (item, answer)
        self._waiting.append(entry)
        try:
            left = deadline.remaining()
            await asyncio.wait({answer}, timeout=None if left is None else max(0.0, left * _PATIENCE_SHARE))
            waiting_at = next((at for at, waiting in enumerate(self._waiting) if waiting is entry), None)
            if not answer.done() and waiting_at is not None:
                # The statement in flight is slow: this caller does not wait for it any longer.
                del self._waiting[waiting_at]
                answer.cancel()
                return await self._alone(item)
            return await answer
        except _RunAlone as failed:
            return await self._alone(item, failed.__cause__)
        except asyncio.CancelledError:
            answer.cancel()
            raise

    async def _alone(self, item: Item, batch_error: BaseException | None = None) -> Result:
        """The item applied by itself, after its batch failed or its caller stopped waiting for
        the batch in flight: the caller hears this attempt's own result or error, except that
        when the batch's outcome was unknown (it may have applied the item) and this attempt
        could not reach the database in time, the caller hears that the outcome is unknown:
        "unavailable" would say nothing was applied."""
        try:
            return await self.run_alone(item)
        except (errors.DatabaseUnavailable, errors.LockTimeout) as exc:
            if isinstance(batch_error, errors.OutcomeUnknown):
                raise batch_error from exc
            raise

    def _hand_on(self) -> None:
        if self._waiting:
            self._spawn(self._drain(), self._name)
        else:
            self._busy = False

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[: self._max_batch], self._waiting[self._max_batch :]
                await self._answer(batch)
        finally:
            self._busy = False
            # Stopped with items still waiting (the service is shutting down): their callers
            # hear it instead of waiting for ever.
            stranded, self._waiting = self._waiting, []
            for _, answer in stranded:
                answer.cancel()

    async def _answer(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            results = await self.run_batch([item for item, _ in batch])
        except BaseException as exc:  # the items of this batch hear it; the next batch still runs
            for _, answer in batch:
                if answer.done():
                    continue
                if isinstance(exc, Exception):
                    if len(batch) > 1 or self.applies_alone:
                        failed = _RunAlone(f"a batch of {len(batch)} failed: {exc}")
                        failed.__cause__ = exc
                        answer.set_exception(failed)
                    else:
                        answer.set_exception(exc)
                else:
                    answer.cancel()
            if not isinstance(exc, Exception):
                raise
            return
        for item, answer in batch:
            if not answer.done():  # a caller that gave up cancelled its future
                answer.set_result(results[item])


@contextlib.contextmanager
def counting_batch(statement: str, items: int) -> Iterator[None]:
    """Counts a coalesced statement that applied its items, or one of several that failed."""
    try:
        yield
    except Exception:
        if items > 1:
            telemetry.metrics.statement_batch_failures.add(1, {"statement": statement})
        raise
    telemetry.metrics.statement_batch_size.record(items, {"statement": statement})
