"""The soak's arithmetic (bench/soak_analysis.py): slopes after the warm-up, the promotion gap read
from the dev core's record, and the hand-written SVG plots."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench.soak_analysis import least_squares, promotion_gaps, svg_chart, trend

MS = 1_000_000


def test_least_squares_finds_the_line() -> None:
    slope, intercept = least_squares([0, 1, 2, 3], [1, 3, 5, 7])
    assert slope == pytest.approx(2) and intercept == pytest.approx(1)
    assert least_squares([5], [9]) == (0.0, 9)


def test_the_trend_leaves_out_the_warm_up_and_reads_growth_per_hour() -> None:
    # Flat at 100 after a climb in the first minute; then +10 an hour.
    seconds = [0, 30, 60, 90, 120, 150]
    values = [10, 60, 100, 100 + 10 * 30 / 3600, 100 + 10 * 60 / 3600, 100 + 10 * 90 / 3600]
    fit = trend(seconds, values, warmup_seconds=60)
    assert fit["samples"] == 4
    assert fit["slope_per_hour"] == pytest.approx(10, rel=1e-3)
    assert fit["slope_pct_of_mean_per_hour"] == pytest.approx(10 / fit["mean"] * 100, rel=1e-2)
    assert trend([0, 1], [None, 2], warmup_seconds=0)["slope_per_hour"] is None


def _event(kind: str, run: str, user: str, at_ms: float, **extra: object) -> dict[str, object]:
    return {"event": kind, "run_id": run, "user_id": user, "mono_ns": int(at_ms * MS), **extra}


def test_the_promotion_gap_pairs_a_completion_with_the_users_next_waiting_release() -> None:
    events = [
        # u1: a running, b queued behind it; b released 3 ms after a's CompleteRun returned.
        _event("create", "a", "u1", 0),
        _event("release_received", "a", "u1", 1),
        _event("create", "b", "u1", 2),
        _event("complete_returned", "a", "u1", 100),
        _event("release_received", "b", "u1", 103),
        # u2: d released before c's CompleteRun answer is back: a negative gap.
        _event("create", "c", "u2", 0),
        _event("release_received", "c", "u2", 1),
        _event("create", "d", "u2", 2),
        _event("release_received", "d", "u2", 99),
        _event("complete_returned", "c", "u2", 100),
        # u3: nothing waiting when e completed; f admitted later is no promotion.
        _event("create", "e", "u3", 0),
        _event("release_received", "e", "u3", 1),
        _event("complete_returned", "e", "u3", 100),
        _event("create", "f", "u3", 200),
        _event("release_received", "f", "u3", 201),
        # u4: a delta re-check (not first pass) released under the capacity frees no slot.
        _event("create", "g", "u4", 0),
        _event("release_received", "g", "u4", 1),
        _event("create", "h", "u4", 2, first_pass=False),
        _event("release_received", "h", "u4", 3),
        _event("create", "i", "u4", 4),
        _event("complete_returned", "h", "u4", 50),
        _event("complete_returned", "g", "u4", 100),
        _event("release_received", "i", "u4", 110),
    ]
    gaps = promotion_gaps(events, t0_ns=0, window_seconds=30)
    window = gaps["per_window"]["0"]
    assert window["count"] == 3
    assert gaps["all"]["max"] == pytest.approx(10)
    assert window["p50"] == pytest.approx(3)
    assert gaps["all"]["mean"] == pytest.approx((3 - 1 + 10) / 3)


def test_a_gap_across_a_pause_is_counted_apart() -> None:
    events = [
        _event("create", "a", "u1", 0),
        _event("release_received", "a", "u1", 1),
        _event("create", "b", "u1", 2),
        _event("complete_returned", "a", "u1", 100),
        _event("release_received", "b", "u1", 5100),
        _event("create", "c", "u2", 0),
        _event("release_received", "c", "u2", 1),
        _event("create", "d", "u2", 2),
        _event("complete_returned", "c", "u2", 100),
        _event("release_received", "d", "u2", 2100),
    ]
    fleet = promotion_gaps(events, t0_ns=0, window_seconds=30, fleet_pauses=[(50 * MS, 5000 * MS)])
    assert fleet["held_by_pause"] == 2 and fleet["all"]["count"] == 0
    user = promotion_gaps(events, t0_ns=0, window_seconds=30, user_pauses=[("u1", 50 * MS, 5000 * MS)])
    assert user["held_by_pause"] == 1 and user["all"]["count"] == 1


def test_the_chart_is_well_formed_svg_with_a_line_per_series(tmp_path: Path) -> None:
    path = tmp_path / "rss.svg"
    series = {"replica1": [(0.0, 80.0), (0.5, 82.0), (1.0, None), (1.5, 83.0)], "replica2": [(0.0, 81.0), (1.5, 81.5)]}
    svg_chart(path, "RSS & more <of each>", "MB", series, warmup_minutes=0.5, fits={"replica1": (60.0, 81.0)})
    root = ET.parse(path).getroot()
    tags = [element.tag.rsplit("}", 1)[-1] for element in root.iter()]
    assert tags.count("polyline") == 2
    assert "RSS &amp; more &lt;of each&gt;" in path.read_text()
