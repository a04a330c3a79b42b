"""The durable retries' formula (`engine.backoff`): attempt n waits uniform over
[0, min(cap, base * 2**(n-1))] seconds, attempts below 1 counting as the first."""

from __future__ import annotations

import random

import pytest

from queue_service.engine.backoff import backoff_window, full_jitter_backoff


class HighEnd:
    """Draws the upper end of every range: the window itself."""

    def uniform(self, a: float, b: float) -> float:
        return b


class LowEnd:
    def uniform(self, a: float, b: float) -> float:
        return a


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(-3, 1.0), (0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (8, 60.0), (1024, 60.0), (10**6, 60.0)],
)
def test_the_window_doubles_per_attempt_up_to_the_cap(attempt: int, expected: float) -> None:
    assert backoff_window(attempt, base=1.0, cap=60.0) == expected
    assert full_jitter_backoff(attempt, cap=60.0, rng=HighEnd()) == expected


def test_the_base_scales_the_window_and_the_cap_bounds_it() -> None:
    assert backoff_window(1, base=0.5, cap=60.0) == 0.5
    assert backoff_window(4, base=0.5, cap=60.0) == 4.0
    assert backoff_window(1, base=1.0, cap=0.5) == 0.5
    # A huge base or attempt never overflows: the cap holds.
    assert backoff_window(10**9, base=1e300, cap=3600.0) == 3600.0


@pytest.mark.parametrize("attempt", [-1, 1, 3, 10**6])
def test_the_lower_end_is_zero(attempt: int) -> None:
    assert full_jitter_backoff(attempt, cap=60.0, rng=LowEnd()) == 0.0


@pytest.mark.parametrize("attempt", [1, 4, 12])
def test_draws_stay_within_the_bounds_and_spread_over_them(attempt: int) -> None:
    rng = random.Random(attempt)
    high = backoff_window(attempt, base=1.0, cap=60.0)
    draws = [full_jitter_backoff(attempt, cap=60.0, rng=rng) for _ in range(300)]
    assert all(0.0 <= draw <= high for draw in draws)
    # Uniform over [0, high]: both halves are hit (each miss has odds of 2**-300).
    assert min(draws) < high / 2 < max(draws)
