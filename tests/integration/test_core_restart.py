"""A core that restarts without its runs (issue 48, item 8): a standalone core is stopped and a
fresh one started on the same port, knowing none of the runs the queue's jobs claim. The queue
notices within seconds (`engine/forgotten_runs.py`): the jobs whose run the core forgot fail with
a clear reason, refunded, the user's next job is promoted, and the operator's "Runs reconciling"
figure counts what is being reconciled meanwhile. An ordinary outage, a slow core, an admit racing
the listing and several replicas at once end nothing wrongly. Also: a held run the core let
expire (a long pause) and what its release answers."""

from __future__ import annotations

import asyncio
import time

import pytest

from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service.dev.core import AnswerFault, DevCore
from queue_service.model import FORGOTTEN_BY_CORE_MESSAGE
from tests.harness import S, ServiceFactory, eventually, new_user, nothing_in_flight, until

# The test's settings: a sweep and a look every 0.2 s, the core's runs listed (and a job's run
# probed) every second. The completion's own reconciliation stays at its default (900 s).
FAST = {"sweep_interval_seconds": 0.2, "core_reconcile_interval_seconds": 1.0}


@pytest.fixture(autouse=True)
def _fresh_fleet(database_url: str) -> None:
    """Tests of this module share a database, and each leaves jobs at a core it stopped (which the
    next test's replica would rightly find forgotten): each starts with nothing in flight."""
    nothing_in_flight(database_url)


async def _restarted_without_runs(services: ServiceFactory, core: DevCore, callback_addr: str) -> DevCore:
    """Stops `core` (its runs gone with it) and starts a fresh one on the same port."""
    port = core.port
    await core.stop()
    fresh = DevCore(manual=True, callback_addr=callback_addr)
    await fresh.start(f"127.0.0.1:{port}")
    services._cores.append(fresh)
    return fresh


async def _overview(channel) -> op_pb2.Overview:  # type: ignore[no-untyped-def]
    return (await op_grpc.OperatorServiceStub(channel).GetOverview(op_pb2.GetOverviewRequest(), timeout=10)).overview


async def test_a_core_restarted_without_its_runs_fails_and_refunds_them_within_seconds_and_promotes_the_next(
    services: ServiceFactory,
) -> None:
    core = await services.core()
    # Two replicas doing it at once: one ending and one refund per job.
    one = await services.start(core, **FAST, release_backoff_max_seconds=0.5)
    other = await services.start(core, **FAST, release_backoff_max_seconds=0.5)
    stubs = one.stubs
    user = new_user()
    await stubs.grant(user, 10)
    judging = await stubs.admit(user)
    await stubs.wait_for(judging.job_id, S.JOB_STATUS_RUNNING)
    queued = await stubs.admit(user)
    assert queued.status == S.JOB_STATUS_QUEUED
    assert await stubs.balance(user) == 8

    fresh = await _restarted_without_runs(services, core, one.address)
    # The fresh core loses CancelRun's answers for now: the lost job's run cannot be confirmed
    # settled yet, so its seat stays taken and the overview counts it as being reconciled.
    fresh.answer_faults["CancelRun"] = AnswerFault("lose")
    restarted = time.monotonic()
    after_restart = await stubs.admit(user)
    assert after_restart.status == S.JOB_STATUS_QUEUED

    ended = await stubs.wait_for(judging.job_id, S.JOB_STATUS_FAILED, timeout=30)
    noticed = time.monotonic() - restarted
    print(f"a lost run noticed {noticed:.2f}s after the core restarted (test settings)")
    assert ended.last_error == FORGOTTEN_BY_CORE_MESSAGE
    forgotten_held = await stubs.wait_for(queued.job_id, S.JOB_STATUS_FAILED, timeout=30)
    assert "core" in forgotten_held.last_error
    # Refunded once each, although two replicas found them.
    await eventually(lambda: _balance_is(stubs, user, 9), timeout=10, what="both lost jobs refunded once")

    # While the core has not confirmed the lost run settled, it holds the seat and is counted.
    await until(lambda: _reconciling(one.stubs.channel, at_least=1), within=10, what="the overview to count the reconciliation")
    assert (await stubs.job(after_restart.job_id)).status == S.JOB_STATUS_QUEUED

    # The core answers again: the run is confirmed settled, the user's next job starts.
    del fresh.answer_faults["CancelRun"]
    await stubs.wait_for(after_restart.job_id, S.JOB_STATUS_RUNNING, timeout=30)
    await until(lambda: _reconciling(one.stubs.channel, at_most=0), within=10, what="the overview to count nothing reconciling")
    assert await stubs.balance(user) == 9
    # One refund each, made as a reconciliation's (the user did not cause it); the held one's may
    # be its release's instead, when its promotion's release met the fresh core first.
    assert await _refunds(stubs, user, judging.job_id) == [("reconcile", "system:reconcile")]
    assert await _refunds(stubs, user, queued.job_id) in ([("reconcile", "system:reconcile")], [("release", "system:release")])
    del other


async def _refunds(stubs, user: str, job_id: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    request = op_pb2.ListLedgerEntriesRequest(user_id=user, job_id=job_id, page_size=10)
    entries = (await op_grpc.OperatorServiceStub(stubs.channel).ListLedgerEntries(request, timeout=10)).entries
    return [(e.reason, e.actor) for e in entries if e.kind == op_pb2.LEDGER_ENTRY_KIND_REFUND]


async def _balance_is(stubs, user: str, expected: int) -> bool:  # type: ignore[no-untyped-def]
    return bool(await stubs.balance(user) == expected)


async def _reconciling(channel, *, at_least: int = 0, at_most: int | None = None) -> bool:  # type: ignore[no-untyped-def]
    count = (await _overview(channel)).runs_reconciling
    return count >= at_least and (at_most is None or count <= at_most)


async def test_a_core_outage_or_a_slow_core_ends_no_job(services: ServiceFactory) -> None:
    core = await services.core()
    service = await services.start(core, **FAST, core_deadline_seconds=0.5)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 10)
    judging = await stubs.admit(user)
    await stubs.wait_for(judging.job_id, S.JOB_STATUS_RUNNING)
    queued = await stubs.admit(user)

    # Down and back with its runs, for several probes and listings.
    core.toggle_serving()
    listed = core.list_calls
    await asyncio.sleep(3)
    core.toggle_serving()
    await eventually(lambda: core.list_calls > listed + 1, timeout=15, what="listings after the outage")
    # Slower than the queue's deadline: no answer, so nothing is decided.
    core.slow_seconds = 1.0
    await asyncio.sleep(3)
    core.slow_seconds = 0.0
    listed = core.list_calls
    await eventually(lambda: core.list_calls > listed + 1, timeout=15, what="listings after the slow spell")

    assert (await stubs.job(judging.job_id)).status == S.JOB_STATUS_RUNNING
    assert (await stubs.job(queued.job_id)).status == S.JOB_STATUS_QUEUED
    assert await stubs.balance(user) == 8


async def test_a_job_admitted_while_the_core_lists_its_runs_is_not_taken_for_lost(services: ServiceFactory) -> None:
    core = await services.core()
    service = await services.start(core, **FAST)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 10)
    # The listing is read at once and answered a second later: a run created meanwhile is not in it.
    core.answer_faults["ListRuns"] = AnswerFault("late", 1.0)
    listed = core.list_calls
    await eventually(lambda: core.list_calls > listed, timeout=15, what="a listing to begin")
    admitted = await stubs.admit(user)
    queued = await stubs.admit(user)
    listed = core.list_calls
    await eventually(lambda: core.list_calls > listed + 2, timeout=20, what="more listings")
    del core.answer_faults["ListRuns"]
    assert (await stubs.job(admitted.job_id)).status == S.JOB_STATUS_RUNNING
    assert (await stubs.job(queued.job_id)).status == S.JOB_STATUS_QUEUED
    assert await stubs.balance(user) == 8


async def test_a_job_held_longer_than_the_core_keeps_a_held_run_fails_refunded_once_the_core_lets_it_go(services: ServiceFactory) -> None:
    """Also examined (d): nothing refreshes a held run (the core's contract has no call for it), so
    a job paused (or queued) longer than the core keeps a held run (`hold_expiry_seconds`; a day at
    the real core) has no run any more: the core lists it no more and answers GetRun NOT_FOUND,
    and the listing fails the job with that reason, refunded, while it is still paused (I10: no
    live job without a run), without blocking the user's next job."""
    core = await services.core(hold_expiry_seconds=1.0)
    service = await services.start(core, **FAST)
    stubs = service.stubs
    operator = op_grpc.OperatorServiceStub(stubs.channel)
    user = new_user()
    await stubs.grant(user, 10)
    await operator.SetReleasesPaused(op_pb2.SetReleasesPausedRequest(paused=True, user_id=user), timeout=10)
    held = await stubs.admit(user)
    assert held.status in (S.JOB_STATUS_QUEUED, S.JOB_STATUS_PENDING)
    failed = await stubs.wait_for(held.job_id, S.JOB_STATUS_FAILED, timeout=30)
    assert "no longer knows" in failed.last_error, failed.last_error
    await eventually(lambda: _balance_is(stubs, user, 10), timeout=10, what="the refund")

    await operator.SetReleasesPaused(op_pb2.SetReleasesPausedRequest(paused=False, user_id=user), timeout=10)
    following = await stubs.admit(user)
    await stubs.wait_for(following.job_id, S.JOB_STATUS_RUNNING, timeout=30)


async def test_a_job_waiting_for_the_fleets_capacity_whose_held_run_the_core_forgot_fails_refunded(services: ServiceFactory) -> None:
    core = await services.core()
    service = await services.start(core, **FAST)
    stubs = service.stubs
    operator = op_grpc.OperatorServiceStub(stubs.channel)
    await operator.SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=1), timeout=10)
    first, second = new_user(), new_user()
    for user in (first, second):
        await stubs.grant(user, 5)
    judging = await stubs.admit(first)
    await stubs.wait_for(judging.job_id, S.JOB_STATUS_RUNNING)
    waiting = await stubs.admit(second)
    assert waiting.status == S.JOB_STATUS_PENDING and waiting.capacity_position == 1, waiting

    await _restarted_without_runs(services, core, service.address)
    for job_id in (judging.job_id, waiting.job_id):
        ended = await stubs.wait_for(job_id, S.JOB_STATUS_FAILED, timeout=30)
        assert ended.last_error == FORGOTTEN_BY_CORE_MESSAGE, ended.last_error
    await eventually(lambda: _balance_is(stubs, second, 5), timeout=10, what="the waiting job refunded")
    # The seat and the slot are free again: the next click starts at the fresh core.
    following = await stubs.admit(second)
    await stubs.wait_for(following.job_id, S.JOB_STATUS_RUNNING, timeout=30)
