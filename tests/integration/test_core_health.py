"""The core's health on the Overview (OperatorService.GetOverview / WatchOverview): red within the
time docs/operations.md states when the core stops, admits it turned away counted, and estimated
start times that stop promising a start while the core is unreachable."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from queue_service._gen.acurio.queue.v1 import job_pb2 as S
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from tests.harness import error_info, new_user

# docs/operations.md: with the core stopped, the Overview's core health turns UNREACHABLE within
# 15 seconds (three heartbeats); WatchOverview adds its interval (1 second here).
RED_WITHIN_SECONDS = 15.0
WATCH_INTERVAL_MS = 1000


async def _overview(operator: op_grpc.OperatorServiceStub) -> op_pb2.Overview:
    return (await operator.GetOverview(op_pb2.GetOverviewRequest(window_minutes=5), timeout=10)).overview


async def _core_health_until(operator: op_grpc.OperatorServiceStub, ok, *, within: float, what: str) -> op_pb2.CoreHealth:  # type: ignore[no-untyped-def]
    give_up_at = time.monotonic() + within
    while True:
        health = (await _overview(operator)).core_health
        if ok(health):
            return health
        assert time.monotonic() < give_up_at, f"{what}: {health}"
        await asyncio.sleep(0.1)


async def test_with_the_core_stopped_the_overview_turns_unreachable_admits_are_counted_and_estimates_stop(services) -> None:  # type: ignore[no-untyped-def]
    core = await services.core()
    service = await services.start(core)
    stubs, operator = service.stubs, op_grpc.OperatorServiceStub(service.stubs.channel)
    user = new_user()
    await stubs.grant(user, 10)
    # One judged job gives the estimates their mean judging time; then one runs and one waits.
    first = await stubs.wait_for((await stubs.admit(user)).job_id, S.JOB_STATUS_RUNNING)
    await stubs.complete(first.run_id)
    running = await stubs.wait_for((await stubs.admit(user)).job_id, S.JOB_STATUS_RUNNING)
    queued = await stubs.admit(user)
    assert queued.status == S.JOB_STATUS_QUEUED
    assert (await stubs.job(queued.job_id)).HasField("estimated_start_time")

    healthy = await _core_health_until(
        operator,
        lambda h: h.state == op_pb2.CORE_STATE_HEALTHY and h.answered >= 3,  # the admits' calls, in the next heartbeat
        within=RED_WITHIN_SECONDS,
        what="the core healthy",
    )
    assert healthy.replicas_reporting >= 1 and healthy.replicas_reaching == healthy.replicas_reporting
    assert healthy.HasField("last_success_time") and healthy.latency_p50_ms > 0
    assert healthy.window_minutes == 5 and healthy.latency_p99_ms >= healthy.latency_p50_ms

    watch = operator.WatchOverview(op_pb2.WatchOverviewRequest(window_minutes=5, interval_ms=WATCH_INTERVAL_MS), timeout=60)
    await watch.read()
    try:
        # The core stops; nobody calls it: the replica's own probe finds out.
        await core.stop()
        stopped_at = time.monotonic()
        while True:
            message = await watch.read()
            assert message is not grpc.aio.EOF
            if message.overview.core_health.state == op_pb2.CORE_STATE_UNREACHABLE:
                break
        watched_after = time.monotonic() - stopped_at
    finally:
        watch.cancel()
    assert watched_after <= RED_WITHIN_SECONDS + WATCH_INTERVAL_MS / 1000, watched_after
    red = await _overview(operator)
    assert red.core_health.state == op_pb2.CORE_STATE_UNREACHABLE and red.core_health.replicas_reaching == 0
    assert red.core_health.unknown >= 1 and red.core_health.last_failure_reason == "UNAVAILABLE"
    assert red.core_health.last_failure_time.ToDatetime() > red.core_health.last_success_time.ToDatetime()
    # ListReplicas shows the replica's own reading.
    replicas = (await operator.ListReplicas(op_pb2.ListReplicasRequest(), timeout=10)).replicas
    mine = next(r for r in replicas if r.replica_id == service.app.replica_id)
    assert mine.core_health.state == op_pb2.CORE_STATE_UNREACHABLE and mine.core_health.replicas_reporting == 1

    # Estimates stop promising a start, on every read: GetJob, ListJobs, WatchJobs.
    assert not (await stubs.job(queued.job_id)).HasField("estimated_start_time")
    listed = {job.job_id: job for job in await stubs.jobs(user)}
    assert listed[queued.job_id].status == S.JOB_STATUS_QUEUED and not listed[queued.job_id].HasField("estimated_start_time")
    jobs_watch = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), timeout=30)
    try:
        shown: dict[str, S.Job] = {}
        while True:
            event = await jobs_watch.read()
            assert event is not grpc.aio.EOF
            if event.HasField("job"):
                shown[event.job.job_id] = event.job
            if event.snapshot_complete:
                break
        assert running.job_id in shown and queued.job_id in shown
    finally:
        jobs_watch.cancel()
    assert not shown[queued.job_id].HasField("estimated_start_time")

    # An admit the core cannot take fails CORE_UNAVAILABLE, and the Overview counts it.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs.admit(user)
    assert error_info(refused.value)[1] == "CORE_UNAVAILABLE"
    counted = await _core_health_until(
        operator, lambda h: h.admits_unavailable >= 1, within=RED_WITHIN_SECONDS, what="the refused admit counted"
    )
    assert counted.state == op_pb2.CORE_STATE_UNREACHABLE


async def test_a_core_that_only_refuses_service_shows_refusing_and_its_answers_bring_it_back(services) -> None:  # type: ignore[no-untyped-def]
    core = await services.core(daily_budget=0)
    service = await services.start(core)
    stubs, operator = service.stubs, op_grpc.OperatorServiceStub(service.stubs.channel)
    user = new_user()
    await stubs.grant(user, 50)

    async def admit_refused() -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stubs.admit(user)
        assert error_info(raised.value)[1] == "PROVIDER_BUDGET_EXHAUSTED"

    give_up_at = time.monotonic() + 3 * RED_WITHIN_SECONDS
    while (health := (await _overview(operator)).core_health).state != op_pb2.CORE_STATE_REFUSING:
        assert time.monotonic() < give_up_at, health
        await admit_refused()  # the core's only word between heartbeats is a refusal
        await asyncio.sleep(0.5)
    assert health.last_failure_reason == "PROVIDER_BUDGET_EXHAUSTED" and health.refused >= 1 and health.replicas_reaching >= 1

    # The budget back: the next admit is answered, and the state leaves REFUSING (degraded for
    # the minute after the last refusal).
    core.daily_budget = 1_000_000
    await stubs.admit(user)
    await _core_health_until(
        operator, lambda h: h.state == op_pb2.CORE_STATE_DEGRADED, within=RED_WITHIN_SECONDS, what="degraded after refusals"
    )


async def test_a_core_that_fails_releases_is_named_by_method_on_the_overview(services) -> None:  # type: ignore[no-untyped-def]
    """The core takes new runs but answers no release: the Overview's core health says which
    call fails (ReleaseRun, no answer, UNAVAILABLE), and that the admits' CreateRun is answered."""
    core = await services.core()
    service = await services.start(core, release_backoff_max_seconds=0.2)
    stubs, operator = service.stubs, op_grpc.OperatorServiceStub(service.stubs.channel)
    user = new_user()
    await stubs.grant(user, 5)
    core.fail_releases = True
    await stubs.admit(user)

    def releases_failing(health: op_pb2.CoreHealth) -> bool:
        methods = {m.method: m for m in health.methods}
        return "ReleaseRun" in methods and methods["ReleaseRun"].unknown >= 2 and "CreateRun" in methods

    health = await _core_health_until(operator, releases_failing, within=RED_WITHIN_SECONDS, what="ReleaseRun failing by method")
    assert health.state == op_pb2.CORE_STATE_DEGRADED
    methods = {m.method: m for m in health.methods}
    release = methods["ReleaseRun"]
    assert release.last_failure_reason == "UNAVAILABLE" and release.HasField("last_failure_time")
    assert release.answered == 0 and release.refused == 0
    assert methods["CreateRun"].answered >= 1
    # Only the releases fail; every other method's calls are answered.
    for other in (m for m in health.methods if m.method != "ReleaseRun"):
        assert (other.refused, other.unknown, other.last_failure_reason) == (0, 0, ""), other
        assert not other.HasField("last_failure_time"), other
    assert [m.method for m in health.methods] == [m for m in ("CreateRun", "ReleaseRun", "CancelRun", "GetRun", "ListRuns") if m in methods]
    # The fleet's counts are the methods' sums.
    assert health.unknown == sum(m.unknown for m in health.methods)
    assert health.answered == sum(m.answered for m in health.methods)
