"""Coalescing of one kind of statement: requests that arrive while one runs go out together next.

A lone request runs at once, in its caller's own task (its deadline, its context); under a
burst, every request that arrived while a statement ran shares the next one: one round trip, one
commit and one WAL flush for all of them. This is group commit done by the caller.

No library fits: DataLoader-style batchers (aiodataloader) collect for one turn of the event
loop and cache by key; here a batch is whatever waited for the statement in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

Item = TypeVar("Item", bound=Hashable)
Result = TypeVar("Result")

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class _SharedStatementFailed(Exception):
    """The statement of a batch of several items failed as a whole (its cause is chained)."""


class Coalescer(Generic[Item, Result]):
    """Runs `run_batch` over one item at once when nothing is in flight, else over the items
    submitted while the previous batch ran (at most `max_batch`, in arrival order). `run_batch`
    answers every item of its batch or raises. An error goes to the items of that batch only: a
    lone item's caller hears it; when the batch had several, each caller runs `run_batch` over its
    own item alone, in its own task and within its own deadline, so one item that cannot be
    applied (a user's lock held elsewhere, say) fails or waits for itself only.

    The batches of waiting items run in a task of their own, started with `spawn` (the caller's
    background work, outside any call's deadline): a caller that gives up neither fails the
    others nor withdraws its item."""

    def __init__(
        self, run_batch: Callable[[list[Item]], Awaitable[dict[Item, Result]]], *, max_batch: int, spawn: Spawn, name: str
    ) -> None:
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._spawn = spawn
        self._name = name
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._busy = False

    async def submit(self, item: Item) -> Result:
        """The item's result once the statement of its batch returned."""
        if self._busy:
            answer: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
            self._waiting.append((item, answer))
            try:
                return await answer
            except _SharedStatementFailed:
                return (await self._run_batch([item]))[item]
        self._busy = True
        try:
            return (await self._run_batch([item]))[item]
        finally:
            self._hand_on()

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
            results = await self._run_batch([item for item, _ in batch])
        except BaseException as exc:  # the items of this batch hear it; the next batch still runs
            for _, answer in batch:
                if answer.done():
                    continue
                if isinstance(exc, Exception):
                    if len(batch) > 1:
                        failed = _SharedStatementFailed(f"a batch of {len(batch)} failed: {exc}")
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
