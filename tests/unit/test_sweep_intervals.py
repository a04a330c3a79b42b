"""Each maintenance service's declared interval: the sweeper's loop runs a service at its first
pass once it is due, a service left behind at the next pass, and a pass run at once every one.
The sweeper is built with a stand-in store whose connection nothing reads (the stand-in services
read nothing), so no database is needed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

from queue_service.config import Config
from queue_service.engine.maintenance.service import EVERY_PASS, Work
from queue_service.engine.sweeper import Sweeper, SweeperSettings
from queue_service.store import Statements


class Unreachable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the pass used {name!r}")


class StandInStore:
    @contextlib.asynccontextmanager
    async def statements(self) -> AsyncIterator[Any]:
        yield Unreachable()


class Counting:
    """A service that counts its runs; `behind` makes it ask for the next pass."""

    action = None

    def __init__(self, interval_seconds: float) -> None:
        self._interval_seconds = interval_seconds
        self.runs = 0
        self.behind = False

    @property
    def interval_seconds(self) -> float:
        return EVERY_PASS if self.behind else self._interval_seconds

    async def find(self, db: Statements) -> Work:
        async def work() -> int:
            self.runs += 1
            return 0

        return work


def sweeper_with(*services: Counting) -> Sweeper:
    sweeper = Sweeper(
        cast(Any, Unreachable()), cast(Any, StandInStore()), SweeperSettings.from_config(Config.from_env({})), wake_dispatcher=lambda: None
    )
    sweeper.services = services
    sweeper._due_at = [0.0] * len(services)
    return sweeper


async def test_the_loop_runs_a_service_once_due_and_every_pass_services_every_pass() -> None:
    every_pass, hourly = Counting(EVERY_PASS), Counting(3600.0)
    sweeper = sweeper_with(every_pass, hourly)
    for _ in range(3):
        await sweeper.sweep_once(due_only=True)
    assert (every_pass.runs, hourly.runs) == (3, 1)


async def test_a_service_left_behind_runs_at_the_next_pass_until_it_caught_up() -> None:
    hourly = Counting(3600.0)
    sweeper = sweeper_with(hourly)
    hourly.behind = True
    await sweeper.sweep_once(due_only=True)
    await sweeper.sweep_once(due_only=True)
    hourly.behind = False
    await sweeper.sweep_once(due_only=True)  # caught up in this run: due again in an hour
    await sweeper.sweep_once(due_only=True)
    assert hourly.runs == 3


async def test_a_pass_run_at_once_runs_every_service() -> None:
    hourly = Counting(3600.0)
    sweeper = sweeper_with(hourly)
    await sweeper.sweep_once(due_only=True)
    await sweeper.sweep_once()
    await sweeper.sweep_once()
    assert hourly.runs == 3
