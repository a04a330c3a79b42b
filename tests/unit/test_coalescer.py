"""The coalescer runs a lone request at once in its caller's task, and every request that arrived
while a batch ran in the next one; an error reaches the items of its own batch only, and the
callers of a failed shared statement each apply their item alone; a caller that gives up does not
withdraw its item or fail the others."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from queue_service import deadline
from queue_service.engine.coalescer import Coalescer, Spawn

_CALLER = contextvars.ContextVar("caller", default="")


class _Statements:
    """A statement per batch that runs until the test lets it return."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.run_for: list[str] = []  # whose context each batch ran in
        self.may_return: asyncio.Queue[Exception | None] = asyncio.Queue()

    async def run(self, items: list[int]) -> dict[int, int]:
        self.batches.append(items)
        self.run_for.append(_CALLER.get())
        failure = await self.may_return.get()
        if failure is not None:
            raise failure
        return {item: item * 10 for item in items}


def _coalescer(statements: _Statements, tasks: set[asyncio.Task[None]], max_batch: int = 64) -> Coalescer[int, int]:
    def spawn(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name, context=contextvars.Context())
        tasks.add(task)
        return task

    return _Coalescer(statements.run, max_batch=max_batch, spawn=spawn, name="test")


class _Coalescer(Coalescer[int, int]):
    """A coalescer whose statements are the test's functions."""

    def __init__(
        self,
        run: Callable[[list[int]], Awaitable[dict[int, int]]],
        *,
        max_batch: int,
        spawn: Spawn,
        name: str,
        run_alone: Callable[[int], Awaitable[int]] | None = None,
    ) -> None:
        super().__init__(max_batch=max_batch, spawn=spawn, name=name)
        self._run, self._run_one = run, run_alone
        self.applies_alone = run_alone is not None

    async def run_batch(self, items: list[int]) -> dict[int, int]:
        return await self._run(items)

    async def run_alone(self, item: int) -> int:
        return await self._run_one(item) if self._run_one is not None else await super().run_alone(item)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_lone_request_goes_out_at_once_and_a_burst_waits_for_the_next_statement() -> None:
    statements, tasks = _Statements(), set[asyncio.Task[None]]()
    coalescer = _coalescer(statements, tasks)

    _CALLER.set("first caller")
    first = asyncio.create_task(coalescer.submit(1))
    await _settle()
    assert statements.batches == [[1]]  # sent without waiting for company
    assert statements.run_for == ["first caller"]  # in the caller's own task: its deadline holds

    burst = [asyncio.create_task(coalescer.submit(item)) for item in (2, 3, 4)]
    await _settle()
    assert statements.batches == [[1]]  # the burst waits for the statement in flight

    statements.may_return.put_nowait(None)
    assert await first == 10
    await _settle()
    assert statements.batches == [[1], [2, 3, 4]]  # the whole burst in one statement
    assert statements.run_for[1] == ""  # the system's own work, not the first waiter's call
    statements.may_return.put_nowait(None)
    assert await asyncio.gather(*burst) == [20, 30, 40]

    later = asyncio.create_task(coalescer.submit(5))
    await _settle()
    assert statements.batches[-1] == [5]  # idle again: sent at once
    statements.may_return.put_nowait(None)
    assert await later == 50


async def test_batches_are_bounded_and_keep_arrival_order() -> None:
    statements, tasks = _Statements(), set[asyncio.Task[None]]()
    coalescer = _coalescer(statements, tasks, max_batch=2)
    submitted = [asyncio.create_task(coalescer.submit(item)) for item in range(6)]
    for _ in range(4):
        await _settle()
        statements.may_return.put_nowait(None)
    assert await asyncio.gather(*submitted) == [0, 10, 20, 30, 40, 50]
    assert statements.batches == [[0], [1, 2], [3, 4], [5]]  # the first alone: nothing was in flight


async def test_an_error_reaches_its_own_batch_only() -> None:
    statements, tasks = _Statements(), set[asyncio.Task[None]]()
    coalescer = _coalescer(statements, tasks)
    first = asyncio.create_task(coalescer.submit(1))
    await _settle()
    second = [asyncio.create_task(coalescer.submit(item)) for item in (2, 3)]
    await _settle()

    statements.may_return.put_nowait(RuntimeError("the database went away"))
    with pytest.raises(RuntimeError, match="went away"):
        await first  # alone: its own error
    statements.may_return.put_nowait(None)
    assert await asyncio.gather(*second) == [20, 30]

    third = asyncio.create_task(coalescer.submit(4))
    await _settle()
    _CALLER.set("a caller of a shared statement")
    fourth = [asyncio.create_task(coalescer.submit(item)) for item in (5, 6)]
    await _settle()
    statements.may_return.put_nowait(None)
    assert await third == 40
    await _settle()
    statements.may_return.put_nowait(RuntimeError("lock timeout"))
    await _settle()
    # Several shared the failed statement: each caller runs its own item alone, in its own task.
    assert statements.batches[-3:] == [[5, 6], [5], [6]]
    assert statements.run_for[-2:] == ["a caller of a shared statement"] * 2
    statements.may_return.put_nowait(None)
    statements.may_return.put_nowait(RuntimeError("the user's lock is still busy"))
    assert await fourth[0] == 50
    with pytest.raises(RuntimeError, match="still busy"):
        await fourth[1]  # alone, it hears its own error


async def test_a_caller_that_gives_up_neither_withdraws_its_item_nor_fails_the_others() -> None:
    statements, tasks = _Statements(), set[asyncio.Task[None]]()
    coalescer = _coalescer(statements, tasks)
    blocker = asyncio.create_task(coalescer.submit(0))
    await _settle()
    impatient = asyncio.create_task(coalescer.submit(1))
    patient = asyncio.create_task(coalescer.submit(2))
    await _settle()
    impatient.cancel()
    statements.may_return.put_nowait(None)
    await blocker
    await _settle()
    statements.may_return.put_nowait(None)
    assert await patient == 20
    assert statements.batches == [[0], [1, 2]]  # the item still ran: its work is the system's
    assert impatient.cancelled()


async def test_stopping_the_batches_cancels_the_callers_still_waiting() -> None:
    statements, tasks = _Statements(), set[asyncio.Task[None]]()
    coalescer = _coalescer(statements, tasks, max_batch=1)
    alone = asyncio.create_task(coalescer.submit(1))
    await _settle()
    in_flight = asyncio.create_task(coalescer.submit(2))
    waiting = asyncio.create_task(coalescer.submit(3))
    await _settle()
    statements.may_return.put_nowait(None)
    assert await alone == 10
    await _settle()
    assert statements.batches == [[1], [2]]
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)
    with pytest.raises(asyncio.CancelledError):
        await in_flight
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_with_run_alone_a_failed_statement_frees_the_coalescer_and_its_caller_goes_alone() -> None:
    statements, tasks = _Statements(), set[asyncio.Task[None]]()
    alone: list[int] = []
    may_finish_alone = asyncio.Event()

    async def run_alone(item: int) -> int:
        alone.append(item)
        await may_finish_alone.wait()  # the user's lock, held elsewhere, say
        return item * 100

    def spawn(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        tasks.add(task)
        return task

    coalescer = _Coalescer(statements.run, run_alone=run_alone, max_batch=64, spawn=spawn, name="test")
    busy = asyncio.create_task(coalescer.submit(1))
    await _settle()
    statements.may_return.put_nowait(RuntimeError("lock timeout"))  # the brief wait for the lock
    await _settle()
    assert alone == [1]
    # The busy item waits for itself only: the next one goes out at once.
    other = asyncio.create_task(coalescer.submit(2))
    await _settle()
    assert statements.batches == [[1], [2]]
    statements.may_return.put_nowait(None)
    assert await other == 20
    assert not busy.done()
    may_finish_alone.set()
    assert await busy == 100


async def test_a_waiting_item_waits_for_the_statement_in_flight_at_most_half_of_its_deadline() -> None:
    statements, tasks = _Statements(), set[asyncio.Task[None]]()
    coalescer = _coalescer(statements, tasks)
    slow = asyncio.create_task(coalescer.submit(1))
    await _settle()

    async def within_deadline(seconds: float) -> int:
        with deadline.call_budget(seconds):
            return await coalescer.submit(2)

    started = asyncio.get_running_loop().time()
    waiting = asyncio.create_task(within_deadline(0.4))
    await _settle()
    while len(statements.batches) < 2:  # withdrawn, then sent on its own
        await asyncio.sleep(0.01)
    waited = asyncio.get_running_loop().time() - started
    assert 0.1 < waited < 0.3, waited  # half of (0.4 s less the reply reserve)
    assert statements.batches == [[1], [2]]
    statements.may_return.put_nowait(None)
    statements.may_return.put_nowait(None)
    assert await waiting == 20
    assert await slow == 10
    assert statements.batches == [[1], [2]]  # nothing was left waiting for a batch
