"""The release and settle retry backoff: capped exponential with full jitter.

Attempt n waits a uniform random time in [0, min(cap, 2**(n-1))] seconds. The engine's
constructor does no I/O, so it is built here with stand-ins for the store and the core that any
call would fail on (the backoff uses neither).
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from tenacity import wait as tenacity_wait

from queue_service.config import Config
from queue_service.engine.capacity import FleetCapacity
from queue_service.engine.engine import QueueEngine, QueueEngineSettings
from queue_service.engine.owed_releases import OwedReleases
from queue_service.engine.parts import SharedParts
from queue_service.engine.ports import ReleaseHandoff
from queue_service.engine.tasks import BackgroundTasks

CAP = 60.0


class Unreachable:
    """A collaborator the backoff must not touch."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the backoff used {name!r} of the store or the core")


def engine(cap: float = CAP) -> QueueEngine:
    config = Config.from_env({}, release_backoff_max_seconds=cap)
    store, core, handoff, tasks = cast(Any, Unreachable()), cast(Any, Unreachable()), ReleaseHandoff(), BackgroundTasks()
    parts = SharedParts(
        store=store,
        core=core,
        tasks=tasks,
        capacity=FleetCapacity(wake_grant=handoff.request_grant, probe_interval_seconds=1.0),
        starter=handoff,
        owed_releases=OwedReleases(store, handoff, lease_seconds=1.0, spawn=tasks.in_background),
        wake_dispatcher=lambda: None,
    )
    return QueueEngine(parts, QueueEngineSettings.from_config(config))


def window(attempt: int, cap: float = CAP) -> float:
    """The upper end of attempt `attempt`'s wait; attempts below 1 count as the first."""
    return float(min(cap, 2 ** (max(1, attempt) - 1)))


@pytest.mark.parametrize("attempt", [-3, 0, 1, 2, 3, 6, 7, 8, 100, 10**6])
def test_the_window_doubles_per_attempt_up_to_the_cap(attempt: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The jitter drawn at its upper end shows the window itself.
    monkeypatch.setattr(tenacity_wait.random, "uniform", lambda low, high: high)
    assert engine().backoff_seconds(attempt) == window(attempt)


def test_the_cap_is_the_configured_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tenacity_wait.random, "uniform", lambda low, high: high)
    assert engine(cap=5.0).backoff_seconds(4) == 5.0
    assert engine(cap=5.0).backoff_seconds(3) == 4.0
    assert engine(cap=0.5).backoff_seconds(1) == 0.5


@pytest.mark.parametrize("attempt", [1, 4, 12])
def test_full_jitter_spreads_waits_over_the_whole_window(attempt: int) -> None:
    backoff = engine()
    draws = [backoff.backoff_seconds(attempt) for _ in range(300)]
    high = window(attempt)
    assert all(0 <= draw <= high for draw in draws)
    # Uniform over [0, high]: both halves are hit (each miss has odds of 2**-300).
    assert min(draws) < high / 2 < max(draws)
    assert len(set(draws)) > 250
