"""After admit: release retries and the release window, completion, cancel, deltas, the
sweeper's recovery, the tooling RPCs, and a replica killed between promotion and release."""

from __future__ import annotations

import asyncio

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.dev.core import AnswerFault
from tests.harness import InvariantChecker, S, error_info, new_user


def _ledger(database_url: str, job_id: str) -> list[tuple[str, int]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT kind, amount FROM credit_ledger WHERE job_id = %s ORDER BY entry_id", (job_id,)).fetchall()


async def test_release_gives_up_after_the_window_refunds_once_and_promotes_the_next(services, database_url: str) -> None:
    core = await services.core()
    core.fail_releases = True
    service = await services.start(core, release_window_seconds=1.0, release_backoff_max_seconds=0.2)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 2)
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    failed = await stubs.wait_for(first.job_id, S.JOB_STATUS_FAILED, timeout=10)
    assert "release gave up" in failed.last_error and "UNAVAILABLE" in failed.last_error
    assert failed.release_attempts >= 2
    assert failed.refunded
    assert _ledger(database_url, first.job_id) == [("charge", -1), ("refund", 1)]
    # The next job is promoted once the core confirms the first run canceled (and, the core still
    # failing releases, retries in its own window).
    promoted = await stubs.wait_for(second.job_id, S.JOB_STATUS_PENDING, S.JOB_STATUS_FAILED)
    assert core.runs[first.run_id].state == 5  # RUN_STATE_CANCELED
    assert promoted.promote_time.seconds > 0
    core.fail_releases = False
    assert InvariantChecker(database_url).all_violations() == []


async def test_release_recovers_when_the_core_heals_inside_the_window(services, database_url: str) -> None:
    core = await services.core()
    core.fail_releases = True
    service = await services.start(core, release_window_seconds=30.0, release_backoff_max_seconds=0.2)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 1)
    job = await stubs.admit(user)
    await asyncio.sleep(0.6)
    waiting = await stubs.job(job.job_id)
    assert waiting.status == S.JOB_STATUS_PENDING and waiting.release_attempts >= 2
    assert "UNAVAILABLE" in waiting.last_error
    core.fail_releases = False
    running = await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING, timeout=5)
    assert running.last_error == "" and not running.refunded
    assert _ledger(database_url, job.job_id) == [("charge", -1)]


async def test_a_release_refused_for_good_fails_at_once_and_refunds(services, database_url: str) -> None:
    core = await services.core()
    core.refuse_releases = True
    service = await services.start(core)
    user = new_user()
    await service.stubs.grant(user, 1)
    job = await service.stubs.admit(user)
    failed = await service.stubs.wait_for(job.job_id, S.JOB_STATUS_FAILED)
    assert "release refused by the core" in failed.last_error and "NOT_FOUND" in failed.last_error
    assert failed.release_attempts == 1
    assert await service.stubs.balance(user) == 1


async def test_completion_is_idempotent_refunds_on_request_and_rejects_unknown_runs(service, database_url: str) -> None:
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 2)
    job = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    ended = await stubs.complete(job.run_id, succeeded=False, refund=True)
    assert ended.status == S.JOB_STATUS_FAILED and ended.refunded
    again = await stubs.complete(job.run_id, succeeded=True, refund=True)
    assert again.status == S.JOB_STATUS_FAILED
    assert _ledger(database_url, job.job_id) == [("charge", -1), ("refund", 1)]
    assert await stubs.balance(user) == 2

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.complete("00000000-0000-4000-8000-000000000000")
    assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND")
    queued_user = new_user()
    await stubs.grant(queued_user, 2)
    await stubs.admit(queued_user)
    queued = await stubs.admit(queued_user)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.complete(queued.run_id)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "RUN_NOT_RELEASED")


async def test_cancel_refunds_queued_and_running_jobs_and_promotes_the_next(service, database_url: str) -> None:
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 3)
    running, queued, last = [await stubs.admit(user) for _ in range(3)]
    await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)

    canceled = (await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=queued.job_id, user_id=user), timeout=5)).job
    assert canceled.status == S.JOB_STATUS_CANCELED and canceled.refunded
    assert (await stubs.job(last.job_id)).queue_position == 1

    canceled = (await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=running.job_id, user_id=user), timeout=5)).job
    assert canceled.status == S.JOB_STATUS_CANCELED and canceled.refunded
    assert service.core.runs[running.run_id].state == core_pb2.RUN_STATE_CANCELED
    await stubs.wait_for(last.job_id, S.JOB_STATUS_RUNNING)
    assert await stubs.balance(user) == 2

    again = (await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=running.job_id, user_id=user), timeout=5)).job
    assert again.status == S.JOB_STATUS_CANCELED
    assert await stubs.balance(user) == 2

    await service.core.finish(last.run_id)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=last.job_id, user_id=user), timeout=5)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_ALREADY_FINISHED")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=last.job_id, user_id=new_user()), timeout=5)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    assert InvariantChecker(database_url).all_violations() == []


async def test_cancel_of_a_running_job_needs_the_core(service) -> None:
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 1)
    job = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    service.core.unavailable = True
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=10)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE")
    service.core.unavailable = False
    assert (await stubs.job(job.job_id)).status == S.JOB_STATUS_RUNNING
    assert await stubs.balance(user) == 0


async def test_deltas_start_at_once_beside_a_queue_and_never_hold_a_slot(services, database_url: str) -> None:
    service = await services.start(delta_price=2)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 10)
    base = await stubs.admit(user)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_RUNNING)
    await service.core.finish(base.run_id)
    active = await stubs.admit(user)
    queued = await stubs.admit(user)
    delta = await stubs.admit(user, delta_of=base.job_id, uri="")
    assert delta.status == S.JOB_STATUS_RUNNING and delta.queue_position == 0
    assert delta.delta_of_job_id == base.job_id and delta.price == 2
    assert service.core.runs[delta.run_id].state == core_pb2.RUN_STATE_JUDGING
    assert (await stubs.job(queued.job_id)).queue_position == 1
    assert await stubs.balance(user) == 10 - 3 - 2
    await service.core.finish(delta.run_id)
    assert (await stubs.job(queued.job_id)).status == S.JOB_STATUS_QUEUED  # a delta ending frees no slot
    await service.core.finish(active.run_id)
    await stubs.wait_for(queued.job_id, S.JOB_STATUS_RUNNING)
    assert InvariantChecker(database_url).all_violations() == []


async def test_sweeper_promotes_what_a_lost_tail_call_left_and_reconciles_lost_completions(services, database_url: str) -> None:
    service = await services.start(reconcile_after_seconds=0.2)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 3)
    first, second, third = [await stubs.admit(user) for _ in range(3)]
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    # A replica that ended the job but died before its tail call (simulated in SQL).
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE analysis_jobs SET status = 'succeeded', end_time = now() WHERE job_id = %s", (first.job_id,))
    service.core.runs[first.run_id].state = core_pb2.RUN_STATE_SUCCEEDED
    checker = InvariantChecker(database_url)
    assert user in checker.users_waiting_with_free_slot()
    sweeper = service.app.sweeper
    report = await sweeper.sweep_once()
    assert report.promoted >= 1
    await stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
    assert user not in checker.users_waiting_with_free_slot()

    # The core finishes the second run but its callback is lost; the sweeper asks GetRun.
    service.core.drop_callbacks = True
    await service.core.finish(second.run_id)
    assert (await stubs.job(second.job_id)).status == S.JOB_STATUS_RUNNING
    await asyncio.sleep(0.3)
    report = await sweeper.sweep_once()
    assert report.reconciled == 1
    assert (await stubs.job(second.job_id)).status == S.JOB_STATUS_SUCCEEDED
    await stubs.wait_for(third.job_id, S.JOB_STATUS_RUNNING)

    # A run the core forgot: failed and refunded.
    service.core.runs.pop(third.run_id)
    await asyncio.sleep(0.3)
    await sweeper.sweep_once()
    forgotten = await stubs.job(third.job_id)
    assert forgotten.status == S.JOB_STATUS_FAILED and forgotten.refunded
    assert checker.all_violations() == []


async def test_sweeper_fails_pending_releases_whose_window_passed_while_no_replica_tried(services, database_url: str) -> None:
    service = await services.start(release_window_seconds=0.5)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 2)
    service.core.unavailable = False
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    await service.app.dispatcher.stop()  # no replica is releasing anything
    # Fake a promotion whose replica vanished long ago: pending, never attempted, window passed.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("""UPDATE analysis_jobs SET status = 'succeeded', end_time = now() WHERE job_id = %s;""", (first.job_id,))
        conn.execute(
            """UPDATE analysis_jobs SET status = 'pending', slot = 1, promote_time = now(),
                      next_release_at = now() - interval '1 minute', release_deadline = now() - interval '30 minutes'
                WHERE job_id = %s""",
            (second.job_id,),
        )
    report = await service.app.sweeper.sweep_once()
    assert report.gave_up == 1
    failed = await stubs.job(second.job_id)
    assert failed.status == S.JOB_STATUS_FAILED and "release window" in failed.last_error and failed.refunded


async def test_promote_and_release_rpcs_for_tooling(services) -> None:
    core = await services.core()
    core.fail_releases = True
    service = await services.start(core, release_window_seconds=60, release_backoff_max_seconds=30)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 2)
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    assert (await stubs.queue.Promote(queue_pb2.PromoteRequest(user_id=user), timeout=5)).HasField("job") is False
    await asyncio.sleep(0.2)  # the first release attempt failed; the next one is backing off
    core.fail_releases = False
    released = None
    for _ in range(50):
        try:
            released = (await stubs.queue.Release(queue_pb2.ReleaseRequest(job_id=first.job_id), timeout=5)).job
        except grpc.aio.AioRpcError as exc:
            assert error_info(exc)[1] == "JOB_NOT_PENDING"  # the dispatcher got there first
            released = await stubs.job(first.job_id)
        if released.status == S.JOB_STATUS_RUNNING:
            break
        await asyncio.sleep(0.05)
    assert released is not None and released.status == S.JOB_STATUS_RUNNING
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.queue.Release(queue_pb2.ReleaseRequest(job_id=second.job_id), timeout=5)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_NOT_PENDING")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.queue.Release(queue_pb2.ReleaseRequest(job_id="00000000-0000-4000-8000-000000000000"), timeout=5)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    # Free the slot behind the service's back: Promote fills it.
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        conn.execute("UPDATE analysis_jobs SET status = 'succeeded', end_time = now() WHERE job_id = %s", (first.job_id,))
    promoted = (await stubs.queue.Promote(queue_pb2.PromoteRequest(user_id=user), timeout=5)).job
    assert promoted.job_id == second.job_id and promoted.status in (S.JOB_STATUS_PENDING, S.JOB_STATUS_RUNNING)


async def test_a_replica_killed_between_promotion_and_release_is_covered_by_another(services, database_url: str) -> None:
    core = await services.core()
    lease = {"QUEUE_RELEASE_LEASE_SECONDS": "1"}
    doomed = await services.start_process(core, **lease)
    user = new_user()
    await doomed.stubs.grant(user, 2)
    first = await doomed.stubs.admit(user)
    second = await doomed.stubs.admit(user)
    await doomed.stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    # The next ReleaseRun is still in flight when the replica dies (only it: the release's check
    # of the user's judging runs at the core, ListRuns, answers at once).
    core.answer_faults["ReleaseRun"] = AnswerFault("late_arrival", 3.0)
    completing = asyncio.create_task(core.finish(first.run_id))
    for _ in range(200):
        if any(run_id == second.run_id for run_id, _ in core.release_log):
            break
        await asyncio.sleep(0.01)
    assert (await doomed.stubs.job(second.job_id)).status == S.JOB_STATUS_PENDING
    doomed.kill()
    core.answer_faults.clear()
    await completing
    survivor = await services.start_process(core, **lease)
    running = await survivor.stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING, timeout=10)
    assert running.release_attempts == 2
    assert InvariantChecker(database_url).all_violations() == []
