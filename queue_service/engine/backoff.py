"""The durable retries' backoff: how long a claim's next attempt waits (a release, a run's
settlement, a reserved run's cancel), stored as its `next_*_at` by `Statements.schedule_retry`.

Capped exponential with full jitter: attempt n (counted from 1) waits a uniform random time in
[0, min(cap, base * 2**(n-1))], so replicas that failed together spread out instead of retrying
in step. A call retried in place, within one request, keeps tenacity (`core_client`).
"""

from __future__ import annotations

import random
from typing import Protocol

# 2.0**1023 is the largest power of two a float holds: any attempt past it has reached the cap.
_LARGEST_EXPONENT = 1023


class UniformSource(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def backoff_window(attempt: int, *, base: float, cap: float) -> float:
    """The upper end of attempt `attempt`'s wait; attempts below 1 count as the first."""
    exponent = min(max(1, attempt) - 1, _LARGEST_EXPONENT)
    return min(cap, base * 2.0**exponent)


def full_jitter_backoff(attempt: int, *, base: float = 1.0, cap: float, rng: UniformSource | None = None) -> float:
    """Seconds attempt `attempt` waits: uniform over [0, `backoff_window`]. `rng` draws the
    jitter (the process-wide `random` when None)."""
    draw = rng.uniform if rng is not None else random.uniform
    return draw(0.0, backoff_window(attempt, base=base, cap=cap))
