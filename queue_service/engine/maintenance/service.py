"""What every maintenance service is: one concern of the sweeper's pass, in two steps.

Each service declares how often it is due (`interval_seconds`): the promotions a lost answer
skipped at every pass, the pruner and the feed's trim less often.

`find` reads or claims its rows on the pass's connection (every service's reads happen first, in
the services' order, so what one service changes is found by the next pass, not by this one); it
returns the service's `work`, run after every read in the same order. A row's step that fails is
logged and skipped (`guarded`): the next pass retries it, so one bad row never stops the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from queue_service import errors
from queue_service.store import Statements

T = TypeVar("T")

log = logging.getLogger("queue_service.engine.sweeper")

# Rows one service claims per pass (the rest waits for the next pass).
BATCH = 500
# Steps that ask the core run side by side, this many at once, so a slow core costs one deadline
# per pass, not one per row.
CORE_CALLS_AT_ONCE = 16

Work = Callable[[], Awaitable[int]]


async def nothing_to_do() -> int:
    return 0


# The interval of a service due at every pass of the sweeper.
EVERY_PASS = 0.0


class MaintenanceService(Protocol):
    """One concern of the pass. `action` names what `work` counts: the SweepReport field and the
    `queue.sweep.rows` metric's action (None: the service reports its own).

    `interval_seconds` is how long after a run of the service it is due again: the sweeper's
    loop runs it at its first pass from then on (`EVERY_PASS`: at every pass; never more often
    than the sweeper runs). Read after its work, so a service that stopped at its per-pass bound
    with rows left answers `EVERY_PASS` until it caught up: a backlog drains at the sweeper's
    pace, not at the service's."""

    @property
    def action(self) -> str | None: ...

    @property
    def interval_seconds(self) -> float: ...

    async def find(self, db: Statements) -> Work: ...


async def guarded(step: Coroutine[Any, Any, T], default: T) -> T:
    """Runs one row's step; a failure is logged and the pass goes on."""
    try:
        return await step
    except errors.QueueError as exc:
        log.warning("sweeper step failed: %s", exc.message)
        return default


async def count_each_asking_core(steps: list[Coroutine[Any, Any, bool]]) -> int:
    """Runs the steps at most CORE_CALLS_AT_ONCE at a time; returns how many succeeded."""
    gate = asyncio.Semaphore(CORE_CALLS_AT_ONCE)

    async def gated(step: Coroutine[Any, Any, bool]) -> int:
        async with gate:
            return int(await guarded(step, False))

    return sum(await asyncio.gather(*(gated(step) for step in steps)))
