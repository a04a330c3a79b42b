"""The core's health: one replica's reading at each heartbeat (`RecentCoreCalls`) and the fleet's
(`combined_core_health`), without a core or a database."""

from __future__ import annotations

import dataclasses
import datetime as dt

from queue_service.core_client import RecentCoreCalls
from queue_service.model import CoreHealthReport, CoreMinute, CoreState, combined_core_health
from queue_service.store.rows import core_health_of_json, core_health_to_json

NOW = dt.datetime(2026, 12, 3, 12, 0, 30, tzinfo=dt.UTC)


def test_a_replica_reads_unreachable_only_when_nothing_answered_since_its_previous_beat() -> None:
    calls = RecentCoreCalls()
    assert calls.beat().state is CoreState.UNKNOWN and calls.reachable()
    calls.answered(0.003)
    calls.unanswered("UNAVAILABLE")
    assert calls.beat().state is CoreState.DEGRADED  # an answer in the period: not unreachable
    assert calls.reachable()
    calls.unanswered("UNAVAILABLE")
    assert calls.reachable()  # estimates stay until a heartbeat reads the core as unreachable
    report = calls.beat()
    assert report.state is CoreState.UNREACHABLE and report.last_failure_reason == "UNAVAILABLE"
    assert not calls.reachable() and not calls.heard_since_beat
    calls.answered(0.002)
    assert calls.reachable() and calls.heard_since_beat  # the next answer brings estimates back
    assert calls.beat().state is CoreState.DEGRADED
    minute = report.minutes[-1]
    assert (minute.answered, minute.unknown, sum(minute.latency_counts)) == (1, 2, 1)


def test_refusals_of_service_read_refusing_until_a_run_is_created() -> None:
    calls = RecentCoreCalls()
    calls.refused_service("PROVIDER_BUDGET_EXHAUSTED", 0.004)
    calls.answered(0.001)  # the abandoned run's cancel: the core answers, but takes no run
    assert calls.beat().state is CoreState.REFUSING
    calls.answered(0.001, created_run=True)
    assert calls.beat().state is CoreState.DEGRADED


def _report(state: CoreState, *, answered: int = 0, latency_counts: tuple[int, ...] = (), max_ms: float = 0.0) -> CoreHealthReport:
    minute = CoreMinute(minute=NOW.replace(second=0), answered=answered, latency_counts=latency_counts, latency_max_ms=max_ms)
    return CoreHealthReport(state=state, last_success_at=NOW, last_failure_at=None, last_failure_reason="", minutes=(minute,))


def test_the_fleet_is_unreachable_only_when_no_replica_reaches_the_core() -> None:
    healthy, unreachable = _report(CoreState.HEALTHY), _report(CoreState.UNREACHABLE)
    assert combined_core_health([], NOW).state is CoreState.UNKNOWN
    assert combined_core_health([healthy, healthy], NOW).state is CoreState.HEALTHY
    mixed = combined_core_health([healthy, unreachable], NOW)
    assert (mixed.state, mixed.replicas_reporting, mixed.replicas_reaching) == (CoreState.DEGRADED, 2, 1)
    assert combined_core_health([unreachable, unreachable], NOW).state is CoreState.UNREACHABLE
    assert combined_core_health([_report(CoreState.REFUSING), unreachable], NOW).state is CoreState.REFUSING


def test_latency_percentiles_add_the_replicas_buckets_and_old_minutes_leave_the_window() -> None:
    # 98 answers within 2 ms on one replica, 2 within 500 ms on the other (the largest 300 ms).
    fast = _report(CoreState.HEALTHY, answered=98, latency_counts=(0, 98), max_ms=1.9)
    slow = _report(CoreState.HEALTHY, answered=2, latency_counts=(0, 0, 0, 0, 0, 0, 0, 0, 2), max_ms=300.0)
    health = combined_core_health([fast, slow], NOW)
    assert (health.answered, health.latency_p50_ms, health.latency_p99_ms) == (100, 2.0, 300.0)
    old = dataclasses.replace(fast.minutes[0], minute=NOW.replace(second=0) - dt.timedelta(minutes=5))
    assert combined_core_health([dataclasses.replace(fast, minutes=(old,))], NOW).latency_p50_ms is None


def test_calls_are_summed_by_method_across_replicas_and_survive_the_heartbeat_row() -> None:
    failing, answering = RecentCoreCalls(), RecentCoreCalls()
    failing.unanswered("UNAVAILABLE", method="ReleaseRun")
    failing.answered(0.003, created_run=True, method="CreateRun")
    answering.unanswered("DEADLINE_EXCEEDED", method="ReleaseRun")
    answering.answered(0.002, refused=True, method="CreateRun", reason="CORE_REJECTED")
    reports = [core_health_of_json(core_health_to_json(calls.beat())) for calls in (failing, answering)]
    # A replica of an older version names no method.
    older = core_health_of_json({"state": "healthy", "minutes": [{"minute": NOW.replace(second=0).isoformat(), "answered": 4}]})
    health = combined_core_health([r for r in (*reports, older) if r is not None], dt.datetime.now(dt.UTC))
    methods = {m.method: m for m in health.methods}
    assert list(methods) == ["CreateRun", "ReleaseRun"]
    assert (methods["ReleaseRun"].unknown, methods["ReleaseRun"].last_failure_reason) == (2, "DEADLINE_EXCEEDED")
    assert (methods["CreateRun"].answered, methods["CreateRun"].refused, methods["CreateRun"].last_failure_reason) == (
        1,
        1,
        "CORE_REJECTED",
    )
