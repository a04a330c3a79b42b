"""What bench/soak.py makes of its samples: each series' slope after the warm-up, the promotion
gap per window from the dev core's record, and a plot of each series (SVG written by hand: the
project's lock has no plotting library, and a line chart needs nothing more)."""

from __future__ import annotations

import bisect
import collections
import html
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.measure import Latency


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through the points; slope 0 for fewer than 2
    distinct xs."""
    n = len(xs)
    if n < 2:
        return 0.0, (ys[0] if ys else 0.0)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0, mean_y
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return slope, mean_y - slope * mean_x


def trend(seconds: Sequence[float], values: Sequence[float | None], warmup_seconds: float) -> dict[str, Any]:
    """The slope of a series after the warm-up: per hour, and as a share of its mean per hour
    (growth an hour, extrapolated), with the mean, first and last value it is read from."""
    points = [(t, v) for t, v in zip(seconds, values, strict=True) if t >= warmup_seconds and v is not None and not math.isnan(v)]
    if len(points) < 2:
        return {"samples": len(points), "slope_per_hour": None, "mean": None, "slope_pct_of_mean_per_hour": None}
    xs, ys = [t / 3600 for t, _ in points], [v for _, v in points]
    slope, intercept = least_squares(xs, ys)
    mean = sum(ys) / len(ys)
    return {
        "samples": len(points),
        "from_second": round(points[0][0], 1),
        "slope_per_hour": _round(slope),
        "intercept": _round(intercept),
        "mean": _round(mean),
        "first": _round(ys[0]),
        "last": _round(ys[-1]),
        "slope_pct_of_mean_per_hour": round(100 * slope / mean, 2) if mean else None,
    }


def _round(value: float) -> float:
    return round(value, 6 if abs(value) < 10 else 3)


def _overlaps(start: int, end: int, intervals: Iterable[tuple[int, int]]) -> bool:
    return any(a <= end and (b == 0 or b >= start) for a, b in intervals)


def promotion_gaps(
    events: list[dict[str, Any]],
    *,
    t0_ns: int,
    window_seconds: float,
    fleet_pauses: Sequence[Sequence[int]] = (),
    user_pauses: Sequence[Sequence[Any]] = (),
) -> dict[str, Any]:
    """The promotion gap from the dev core's record, per window of its completion: for each
    first-pass run's CompleteRun returned, the user's next first-pass ReleaseRun after that run's
    own (one slot a user), when its run was created (admitted) before the completion, so waiting. A user with nothing waiting has no gap; a gap that
    overlaps a pause of the fleet's or that user's releases is not a promotion's latency and is
    counted apart (`held_by_pause`). The gap includes any wait for the fleet's capacity."""
    first_pass: dict[str, bool] = {}
    created: dict[str, int] = {}
    releases: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    completions: list[tuple[int, str, str]] = []
    released: set[str] = set()
    released_at: dict[str, int] = {}
    completed: set[str] = set()
    for event in sorted(events, key=lambda e: e["mono_ns"]):
        kind, run, user = event["event"], event["run_id"], event["user_id"]
        if kind == "create":
            created[run] = event["mono_ns"]
            first_pass[run] = bool(event.get("first_pass", True))
        elif kind == "release_received" and run not in released and first_pass.get(run):
            released.add(run)
            released_at[run] = event["mono_ns"]
            releases[user].append((event["mono_ns"], run))
        elif kind == "complete_returned" and run not in completed and first_pass.get(run) and run in released:
            completed.add(run)
            completions.append((event["mono_ns"], run, user))
    pauses_of: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for user, start, end in user_pauses:
        pauses_of[user].append((start, end))
    fleet = [(start, end) for start, end in fleet_pauses]
    window_ns = int(window_seconds * 1e9)
    by_window: dict[int, list[float]] = collections.defaultdict(list)
    held = collections.Counter[int]()
    for done_ns, run, user in completions:
        if done_ns < t0_ns:
            continue
        # One slot a user: her next first-pass release after this run's own is its successor's
        # (it may come before the CompleteRun's answer is back: a negative gap).
        times = releases[user]
        at = bisect.bisect_right(times, (released_at[run], run))
        if at >= len(times):
            continue
        release_ns, next_run = times[at]
        if created.get(next_run, release_ns) > done_ns:
            continue  # admitted after the completion: nothing was waiting
        window = (done_ns - t0_ns) // window_ns
        if _overlaps(done_ns, release_ns, fleet) or _overlaps(done_ns, release_ns, pauses_of[user]):
            held[window] += 1
            continue
        by_window[window].append((release_ns - done_ns) / 1e9)
    windows = sorted(set(by_window) | set(held))
    return {
        "per_window": {str(w): {**Latency.from_seconds(by_window[w]).as_dict(), "held_by_pause": held[w]} for w in windows},
        "all": Latency.from_seconds([g for gaps in by_window.values() for g in gaps]).as_dict(),
        "held_by_pause": sum(held.values()),
        "seconds_by_window": {str(w): gaps for w, gaps in by_window.items()},
    }


def pooled_p99_drift(
    seconds_by_window: dict[str, list[float]], *, window_seconds: float, warmup_seconds: float, span_seconds: float
) -> dict[str, Any]:
    """The p99 of the samples of the first `span_seconds` after warm-up against the p99 of the last
    `span_seconds`, each pooled over its windows. One 30-s window holds about a hundred samples, so
    its "p99" is its largest one or two: two such are two maxima, which one slow moment (a
    checkpoint, a capacity turn) decides. Pooled over minutes, each p99 stands on a thousand."""
    indexes = sorted(int(w) for w in seconds_by_window)
    steady = [w for w in indexes if w * window_seconds >= warmup_seconds]
    if not steady:
        return {"first_steady": None, "last": None, "ratio": None}
    # A short run compares its steady part's halves: the two spans never overlap.
    span = max(1, min(round(span_seconds / window_seconds), len(steady) // 2))
    first = Latency.from_seconds(g for w in steady[:span] for g in seconds_by_window[str(w)])
    last = Latency.from_seconds(g for w in steady[-span:] for g in seconds_by_window[str(w)])
    return {
        "span_minutes": round(span * window_seconds / 60, 2),
        "first_steady": round(first.p99, 3),
        "first_steady_samples": first.count,
        "last": round(last.p99, 3),
        "last_samples": last.count,
        "ratio": round(last.p99 / first.p99, 3) if first.p99 else None,
    }


def read_record(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- plots -----------------------------------------------------------------------------------------

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf", "#bcbd22")


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int(math.ceil((high - first) / step)) + 1)]


def _label(value: float) -> str:
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-2):
        return f"{value:.3g}"
    return f"{value:.6g}"


def svg_chart(
    path: Path,
    title: str,
    unit: str,
    series: dict[str, Sequence[tuple[float, float | None]]],
    *,
    warmup_minutes: float | None = None,
    fits: dict[str, tuple[float, float]] | None = None,
) -> None:
    """A line chart of each series over minutes, with the warm-up's end as a dashed line and, per
    series in `fits`, its least-squares line after it ((slope, intercept) per hour)."""
    width, height, left, right, top, bottom = 820, 360, 80, 190, 40, 45
    points = {name: [(x, y) for x, y in values if y is not None and not math.isnan(y)] for name, values in series.items()}
    xs = [x for values in points.values() for x, _ in values] or [0.0, 1.0]
    ys = [y for values in points.values() for _, y in values] or [0.0, 1.0]
    x_ticks = _ticks(min(0.0, min(xs)), max(xs))
    y_low = min(0.0, min(ys))
    y_ticks = _ticks(y_low, max(ys) * 1.05 if max(ys) > 0 else 1.0)
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">{html.escape(title)}</text>',
    ]
    for y in y_ticks:
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{_label(y)}</text>')
    for x in x_ticks:
        out.append(f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{top}" y2="{top + plot_h}" stroke="#f0f0f0"/>')
        out.append(f'<text x="{px(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{_label(x)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#555"/>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle">minutes</text>')
    out.append(
        f'<text x="16" y="{top + plot_h / 2}" text-anchor="middle" transform="rotate(-90 16 {top + plot_h / 2})">{html.escape(unit)}</text>'
    )
    if warmup_minutes is not None and x0 <= warmup_minutes <= x1:
        out.append(
            f'<line x1="{px(warmup_minutes):.1f}" x2="{px(warmup_minutes):.1f}" y1="{top}" y2="{top + plot_h}" stroke="#999" stroke-dasharray="4 4"/>'
        )
        out.append(f'<text x="{px(warmup_minutes) + 4:.1f}" y="{top + 12}" fill="#777">warm-up ends</text>')
    for index, (name, values) in enumerate(points.items()):
        colour = _COLOURS[index % len(_COLOURS)]
        if values:
            line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in values)
            out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.8"/>')
            if len(values) <= 60:
                out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.2" fill="{colour}"/>' for x, y in values]
        fit = (fits or {}).get(name)
        if fit is not None and values:
            slope, intercept = fit
            start = max(warmup_minutes or 0.0, values[0][0])
            end = values[-1][0]
            fy = [intercept + slope * m / 60 for m in (start, end)]
            out.append(
                f'<line x1="{px(start):.1f}" y1="{py(fy[0]):.1f}" x2="{px(end):.1f}" y2="{py(fy[1]):.1f}" stroke="{colour}" stroke-dasharray="6 3" stroke-width="1.2"/>'
            )
        ly = top + 14 + 18 * index
        out.append(
            f'<line x1="{left + plot_w + 12}" x2="{left + plot_w + 32}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + plot_w + 36}" y="{ly}">{html.escape(name)}</text>')
    out.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")
