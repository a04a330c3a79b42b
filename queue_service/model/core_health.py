"""The core's health as replicas read it and as the fleet combines it: its states, the calls per
minute and method, the latency buckets, and `combined_core_health`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum


class CoreState(enum.StrEnum):
    """The core's health as an operator reads it (`CoreHealth.state`)."""

    # No fresh report of any replica says anything about the core yet.
    UNKNOWN = "unknown"
    # The core answers every replica, and no call failed within the last minute.
    HEALTHY = "healthy"
    # The core answers, but some calls failed within the last minute, or some replicas do not reach it.
    DEGRADED = "degraded"
    # No replica's calls got an answer since its previous heartbeat, and the last got none.
    UNREACHABLE = "unreachable"
    # The core refuses new runs (the provider's budget used up): since its previous heartbeat, no
    # replica's CreateRun was taken, and some were refused.
    REFUSING = "refusing"


# Upper bounds, in milliseconds, of the latency buckets the core's answers are counted in (the
# last bucket, above the last bound, is open); fleet-wide percentiles add replicas' buckets.
CORE_LATENCY_BOUNDS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


# The recent window of the core's health: this many minutes, one bucket each.
CORE_WINDOW_MINUTES = 5


# A failure this recent still shows as DEGRADED after the core answers again.
CORE_DEGRADED_AFTER_FAILURE = dt.timedelta(seconds=60)


# The core's methods the queue calls, in the order the Overview lists them (the probe is a GetRun).
CORE_METHODS = ("CreateRun", "ReleaseRun", "CancelRun", "GetRun", "ListRuns")


@dataclasses.dataclass(frozen=True)
class CoreMethodCalls:
    """One core method's calls in one minute (or a window): answered, refused, outcome unknown."""

    method: str
    answered: int = 0
    refused: int = 0
    unknown: int = 0


@dataclasses.dataclass(frozen=True)
class CoreMethodFailure:
    """A core method's latest failure: no answer (the gRPC code) or a refusal (the reason)."""

    method: str
    at: dt.datetime
    reason: str


@dataclasses.dataclass(frozen=True)
class CoreMinute:
    """One minute of a replica's calls to the core (probes included): answered, refused (an
    answer too: the core works), outcome unknown, admits answered CORE_UNAVAILABLE, and the
    latency of answered and refused calls in `CORE_LATENCY_BOUNDS_MS` buckets (one more, open)."""

    minute: dt.datetime
    answered: int = 0
    refused: int = 0
    unknown: int = 0
    admits_unavailable: int = 0
    latency_counts: tuple[int, ...] = ()
    latency_max_ms: float = 0.0
    # The same calls by core method (only the methods called in the minute).
    methods: tuple[CoreMethodCalls, ...] = ()


@dataclasses.dataclass(frozen=True)
class CoreHealthReport:
    """A replica's view of the core, written in its heartbeat: the state it read at the beat,
    its last answer and last failure, and the recent minutes."""

    state: CoreState
    last_success_at: dt.datetime | None
    last_failure_at: dt.datetime | None
    last_failure_reason: str
    minutes: tuple[CoreMinute, ...]
    # Each method's latest failure (refusals of a request included), when it had one.
    method_failures: tuple[CoreMethodFailure, ...] = ()


@dataclasses.dataclass(frozen=True)
class CoreMethodHealth:
    """One core method's calls within the window, summed over the reports, and its latest
    failure within the window (None, "" without one)."""

    method: str
    answered: int
    refused: int
    unknown: int
    last_failure_at: dt.datetime | None
    last_failure_reason: str


@dataclasses.dataclass(frozen=True)
class CoreHealth:
    """The core's health fleet-wide (Overview.core_health), from the fresh heartbeats only."""

    state: CoreState
    replicas_reporting: int
    replicas_reaching: int
    last_success_at: dt.datetime | None
    last_failure_at: dt.datetime | None
    last_failure_reason: str
    answered: int
    refused: int
    unknown: int
    admits_unavailable: int
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    window_minutes: int = CORE_WINDOW_MINUTES
    # The methods called within the window, in `CORE_METHODS` order (an unknown name last).
    methods: tuple[CoreMethodHealth, ...] = ()


def _latency_quantile(counts: list[int], max_ms: float, quantile: float) -> float | None:
    """The upper bound of the bucket holding the quantile (the largest latency seen when lower,
    or in the open bucket)."""
    total = sum(counts)
    if total == 0:
        return None
    rank = quantile * total
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank and count:
            bound = CORE_LATENCY_BOUNDS_MS[index] if index < len(CORE_LATENCY_BOUNDS_MS) else max_ms
            return float(min(bound, max_ms))
    return max_ms


def combined_core_health(reports: list[CoreHealthReport], now: dt.datetime) -> CoreHealth:
    """The core's health from replicas' reports (the fleet's fresh ones, or one replica's):
    UNREACHABLE (or REFUSING) when no replica reaches it, DEGRADED when some do not or it failed
    recently, UNKNOWN without a report; the counts and latencies of the last
    `CORE_WINDOW_MINUTES` before `now`."""
    first_minute = now.replace(second=0, microsecond=0) - dt.timedelta(minutes=CORE_WINDOW_MINUTES - 1)
    minutes = [m for r in reports for m in r.minutes if m.minute >= first_minute]
    counts = [0] * (len(CORE_LATENCY_BOUNDS_MS) + 1)
    for minute in minutes:
        for index, count in enumerate(minute.latency_counts[: len(counts)]):
            counts[index] += count
    max_ms = max((m.latency_max_ms for m in minutes), default=0.0)
    states = [r.state for r in reports if r.state is not CoreState.UNKNOWN]
    reaching = sum(1 for state in states if state is not CoreState.UNREACHABLE)
    if not states:
        state = CoreState.UNKNOWN
    elif reaching == 0:
        state = CoreState.UNREACHABLE
    elif all(state in (CoreState.REFUSING, CoreState.UNREACHABLE) for state in states):
        state = CoreState.REFUSING
    elif any(state is not CoreState.HEALTHY for state in states):
        state = CoreState.DEGRADED
    else:
        state = CoreState.HEALTHY
    failures = [r for r in reports if r.last_failure_at is not None]
    latest_failure = max(failures, key=lambda r: r.last_failure_at or now, default=None)
    return CoreHealth(
        state=state,
        replicas_reporting=len(reports),
        replicas_reaching=reaching,
        last_success_at=max((r.last_success_at for r in reports if r.last_success_at is not None), default=None),
        last_failure_at=latest_failure.last_failure_at if latest_failure else None,
        last_failure_reason=latest_failure.last_failure_reason if latest_failure else "",
        answered=sum(m.answered for m in minutes),
        refused=sum(m.refused for m in minutes),
        unknown=sum(m.unknown for m in minutes),
        admits_unavailable=sum(m.admits_unavailable for m in minutes),
        latency_p50_ms=_latency_quantile(counts, max_ms, 0.5),
        latency_p99_ms=_latency_quantile(counts, max_ms, 0.99),
        methods=_methods_health(reports, minutes, first_minute),
    )


def _methods_health(reports: list[CoreHealthReport], minutes: list[CoreMinute], first_minute: dt.datetime) -> tuple[CoreMethodHealth, ...]:
    """Each method's calls within the window summed over the reports, with its latest failure
    of the window (so the Overview names the calls that fail, not only that some do)."""
    sums: dict[str, list[int]] = {}
    for minute in minutes:
        for calls in minute.methods:
            total = sums.setdefault(calls.method, [0, 0, 0])
            total[0] += calls.answered
            total[1] += calls.refused
            total[2] += calls.unknown
    latest: dict[str, CoreMethodFailure] = {}
    for report in reports:
        for failure in report.method_failures:
            if failure.at >= first_minute and (failure.method not in latest or failure.at > latest[failure.method].at):
                latest[failure.method] = failure
    order = {method: index for index, method in enumerate(CORE_METHODS)}
    return tuple(
        CoreMethodHealth(
            method=method,
            answered=answered,
            refused=refused,
            unknown=unknown,
            last_failure_at=latest[method].at if method in latest else None,
            last_failure_reason=latest[method].reason if method in latest else "",
        )
        for method, (answered, refused, unknown) in sorted(sums.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))
    )
