"""QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER is a share of QUEUE_MAX_CONCURRENT_CALLS: `0` reads as half
of them (at least one), and a share larger than the whole is refused at start."""

from __future__ import annotations

import pytest

from queue_service.config import Config, ConfigError


def test_the_default_share_is_half_of_the_replicas_calls() -> None:
    assert Config.from_env({}).unary_calls_per_caller == 8
    assert Config.from_env({"QUEUE_MAX_CONCURRENT_CALLS": "1"}).unary_calls_per_caller == 1
    assert Config.from_env({"QUEUE_MAX_CONCURRENT_CALLS": "40", "QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER": "30"}).unary_calls_per_caller == 30


def test_a_share_larger_than_the_replicas_calls_is_refused() -> None:
    with pytest.raises(ConfigError, match="QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER must not exceed QUEUE_MAX_CONCURRENT_CALLS"):
        Config.from_env({"QUEUE_MAX_CONCURRENT_CALLS": "4", "QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER": "5"})
