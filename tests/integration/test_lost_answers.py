"""Lost and late answers from the core: every call can be applied and its answer lost or late.

One test per defect of the "lost and late answers" review, through the public gRPC API against
real PostgreSQL, with the dev core's answer faults (`AnswerFault`): `lose` (applied, answer
lost), `late` (applied, answered after the caller's deadline), `late_arrival` (the request is
applied late, after the caller gave up). The rule they hold (docs/design.md, "Settled runs"): a
user's slot is free for the next job only once the core has confirmed the previous run settled,
and an outcome we never learned is treated as maybe applied.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.dev.core import AnswerFault
from queue_service.dev.embedded_postgres import free_port
from tests.faults import LISTENER
from tests.harness import (
    REPO_ROOT,
    InvariantChecker,
    S,
    Stubs,
    cancel_left_unanswered,
    end_failed_as_a_previous_version,
    error_info,
    eventually,
    new_user,
    one_running_job,
    wait_serving,
)
from tests.machine.world import forget_faketime_segments, skewed_clock_environment

HELD, JUDGING, CANCELED = core_pb2.RUN_STATE_HELD, core_pb2.RUN_STATE_JUDGING, core_pb2.RUN_STATE_CANCELED


def _live_runs_of(core, user: str) -> list[str]:
    return [r.run_id for r in core.live_runs().values() if r.user_id == user]


async def cancel(stubs: Stubs, job_id: str, user: str):
    return (await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job_id, user_id=user), timeout=10)).job


# -- 1. a release given up after lost answers -------------------------------------------------


async def test_a_release_given_up_after_lost_answers_cancels_the_run_before_the_next_job_starts(services, database_url: str) -> None:
    """Defect 1: ReleaseRun applied, every answer lost until the window closed. The job fails and
    is refunded at once, its run is canceled at the core, and only then does the next job start:
    the core never judges two of the user's runs."""
    core = await services.core()
    core.answer_faults["ReleaseRun"] = AnswerFault("lose")
    service = await services.start(core, release_window_seconds=0.8, release_backoff_max_seconds=0.1)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    failed = await stubs.wait_for(first.job_id, S.JOB_STATUS_FAILED)
    assert "release gave up" in failed.last_error and failed.refunded
    assert core.runs[first.run_id].state == JUDGING or core.runs[first.run_id].state == CANCELED
    core.answer_faults.clear()
    running = await stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
    assert running.status == S.JOB_STATUS_RUNNING
    assert core.runs[first.run_id].state == CANCELED
    assert core.max_concurrent_judging[user] == 1
    assert InvariantChecker(database_url).all_violations() == []


async def test_the_next_job_waits_until_the_core_confirms_the_given_up_run(services, database_url: str) -> None:
    """Defect 1, the core also losing CancelRun's answers: the next job stays QUEUED (the slot is
    not free while the first run may judge) until a CancelRun answer confirms, then starts."""
    core = await services.core()
    core.answer_faults["ReleaseRun"] = AnswerFault("lose")
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    service = await services.start(
        core, release_window_seconds=0.8, release_backoff_max_seconds=0.1, sweep_interval_seconds=0.2, release_lease_seconds=0.3
    )
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    failed = await stubs.wait_for(first.job_id, S.JOB_STATUS_FAILED)
    assert failed.refunded  # the user is told at once
    await asyncio.sleep(1.0)  # several sweeps, each CancelRun applied but unanswered
    assert (await stubs.job(second.job_id)).status == S.JOB_STATUS_QUEUED
    assert core.faults_injected["CancelRun:lose"] >= 2
    core.answer_faults.clear()
    await stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
    assert core.max_concurrent_judging[user] == 1
    assert InvariantChecker(database_url).all_violations() == []


# -- 2. cancelling a pending job whose release is in flight ------------------------------------


async def test_cancelling_a_pending_job_whose_release_is_in_flight_ends_it_canceled(services) -> None:
    """Defect 2: the release reaches the core just after the cancel did, and the core's refusal
    (FAILED_PRECONDITION, canceled) is read before the cancel's own answer arrives. The job ends
    CANCELED, refunded, and CancelJob returns it (not JOB_ALREADY_FINISHED, not FAILED)."""
    core = await services.core()
    core.answer_faults["ReleaseRun"] = AnswerFault("late_arrival", seconds=0.5)
    service = await services.start(core)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    job = await stubs.admit(user)
    assert job.status == S.JOB_STATUS_PENDING
    await eventually(lambda: core.faults_injected["ReleaseRun:late_arrival"] == 1, what="the release in flight")
    core.answer_faults["CancelRun"] = AnswerFault("late", seconds=1.0)  # applied now, answered after the release
    canceled = await cancel(stubs, job.job_id, user)
    assert canceled.status == S.JOB_STATUS_CANCELED
    await asyncio.sleep(1.0)  # the late release arrives and is refused
    final = await stubs.job(job.job_id)
    assert (final.status, final.refunded) == (S.JOB_STATUS_CANCELED, True)
    assert core.runs[job.run_id].state == CANCELED
    assert await stubs.balance(user) == 1


# -- 3. cancelling a queued job while the core cannot cancel -----------------------------------


async def test_cancelling_a_queued_job_the_core_cannot_cancel_never_starts_it(services, database_url: str) -> None:
    """Defect 3: CancelRun's answers are lost; the job ahead completes meanwhile. The canceled job
    is never promoted or released (its run never judges), the next job starts, and the held run is
    canceled once the core answers."""
    core = await services.core()
    service = await services.start(core, sweep_interval_seconds=0.2, release_lease_seconds=0.3)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    third = await stubs.admit(user)
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    canceled = await cancel(stubs, second.job_id, user)
    assert (canceled.status, canceled.refunded) == (S.JOB_STATUS_CANCELED, True)
    await core.finish(first.run_id)
    await stubs.wait_for(third.job_id, S.JOB_STATUS_RUNNING)
    assert second.run_id not in {run_id for run_id, _ in core.release_log}  # never released
    assert core.max_concurrent_judging[user] == 1
    core.answer_faults.clear()
    await eventually(lambda: core.runs[second.run_id].state == CANCELED, what="the held run canceled")
    with psycopg.connect(database_url) as conn:  # confirmed: nothing left to settle
        await eventually(
            lambda: (
                conn.execute("SELECT count(*) FROM analysis_jobs WHERE run_settle_due_at IS NOT NULL AND user_id = %s", (user,)).fetchone()[
                    0
                ]
                == 0
            ),
            what="the cancel confirmed",
        )
    assert InvariantChecker(database_url).all_violations() == []


# -- 4. CreateRun whose outcome is unknown ----------------------------------------------------


@pytest.mark.parametrize("fault", [AnswerFault("lose"), AnswerFault("late", seconds=1.5)], ids=["lost", "late"])
async def test_a_create_run_whose_answer_never_came_leaves_no_held_run(services, database_url: str, fault: AnswerFault) -> None:
    """Defect 4 (I5): the core created the run but its answer was lost or came after the deadline.
    Admit answers CORE_UNAVAILABLE, the run is canceled, and a retry with the same key admits one
    job with one live run."""
    core = await services.core()
    core.answer_faults["CreateRun"] = fault
    service = await services.start(core, core_deadline_seconds=0.5, sweep_interval_seconds=0.2, release_lease_seconds=0.3)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs.admit(user, "click-1")
    assert error_info(refused.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE")
    assert core.faults_injected[f"CreateRun:{fault.kind}"] >= 1
    created = {r.run_id for r in core.runs.values() if r.user_id == user}
    assert created  # the core did create it
    core.answer_faults.clear()
    await eventually(lambda: _live_runs_of(core, user) == [], what="the orphaned run canceled")
    job = await stubs.admit(user, "click-1")
    assert job.status == S.JOB_STATUS_PENDING
    await eventually(lambda: _live_runs_of(core, user) == [job.run_id], what="one live run")
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM run_reservations WHERE user_id = %s AND settled_at IS NULL", (user,)).fetchone()[0] == 0
    assert await stubs.balance(user) == 0


async def test_a_create_run_arriving_after_its_cancel_never_becomes_a_live_run(services) -> None:
    """Defect 4, the request itself late: CreateRun reaches the core after the admit gave up and
    after the admit's CancelRun. The core keeps the canceled id (the contract), so the late
    CreateRun finds the canceled run instead of creating a live one: nothing is left held."""
    core = await services.core()
    core.answer_faults["CreateRun"] = AnswerFault("late_arrival", seconds=1.5)
    service = await services.start(core, core_deadline_seconds=0.5, sweep_interval_seconds=0.2, release_lease_seconds=0.3)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs.admit(user, "click-1")
    assert error_info(refused.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE")
    core.answer_faults.clear()
    await eventually(lambda: not core._late_applications, what="the late CreateRun to arrive")
    assert _live_runs_of(core, user) == []
    assert await stubs.balance(user) == 1


# -- 5. a delta judged before its admit commits ------------------------------------------------


async def test_deltas_judged_faster_than_their_admit_commits_all_complete(services) -> None:
    """Defect 5: deltas start judging at CreateRun; with instant judging the core calls back
    before the admit has committed. The completion answers RUN_NOT_YET_ADMITTED, the core retries,
    and every delta ends SUCCEEDED long before reconciliation would notice."""
    core = await services.core(manual=False, judging_seconds=0.01)
    core.delta_judging_seconds = 0
    service = await services.start(core, max_active_deltas_per_user=100, max_free_admits_per_user_per_hour=100)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    base = await stubs.admit(user)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_SUCCEEDED)
    deltas = [await stubs.admit(user, uri="", delta_of=base.job_id) for _ in range(30)]
    for delta in deltas:
        await stubs.wait_for(delta.job_id, S.JOB_STATUS_SUCCEEDED, timeout=30)


async def test_a_delta_judged_before_its_failed_admit_gave_it_up_never_becomes_a_job(services, database_url: str) -> None:
    """I5 with the core as the second copy: a delta judges at CreateRun, whose answer is lost, so
    the Admit answers CORE_UNAVAILABLE and the admit's clean-up finds the run already finished.
    The core keeps retrying its CompleteRun; a run no job owns is otherwise taken for a job lost in
    a failover and adopted. The failed admit's run is remembered as abandoned instead: no job, no
    charge, ever (the torture run found the adoption on one starved core)."""
    core = await services.core(manual=False, judging_seconds=0.01)
    core.delta_judging_seconds = 0
    service = await services.start(core, core_deadline_seconds=0.5, delta_price=1, sweep_interval_seconds=0.2)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    base = await stubs.admit(user)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_SUCCEEDED)
    core.answer_faults["CreateRun"] = AnswerFault("lose")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs.admit(user, "delta-1", uri="", delta_of=base.job_id)
    assert error_info(refused.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE")
    core.answer_faults.clear()
    delta_runs = [r for r in core.runs.values() if r.user_id == user and r.run_id != base.run_id]
    assert len(delta_runs) == 1 and delta_runs[0].state == core_pb2.RUN_STATE_SUCCEEDED  # judged to the end

    def live_reservation() -> bool:
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM run_reservations WHERE run_id = %s AND cancel_after < 'infinity'", (delta_runs[0].run_id,)
            ).fetchone()
        return bool(row and row[0])

    await eventually(lambda: not live_reservation(), what="the failed admit's clean-up done")
    # The core retries its CompleteRun for a minute (pauses up to 2 s): for 4 s after the
    # clean-up, no retry may turn the run into a job.
    for _ in range(20):
        assert [job.job_id for job in await stubs.jobs(user)] == [base.job_id]
        await asyncio.sleep(0.2)
    assert await stubs.balance(user) == 1  # the base's charge only


# -- 6. WatchJobs after a gap ------------------------------------------------------------------


async def test_a_watch_stream_reports_jobs_that_ended_while_its_listener_was_away(services, database_url: str) -> None:
    """Defect 6 (I11): the replica's LISTEN connection drops; a job ends meanwhile. After the
    reconnect the stream resyncs with that job's terminal state (marked `resync_complete`), the
    snapshot marker is sent once, and the last message per job equals GetJob."""
    service = await services.start()
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    stream = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user))
    messages: list[queue_pb2.WatchJobsResponse] = []

    async def read() -> None:
        async for message in stream:
            messages.append(message)

    reader = asyncio.create_task(read())
    try:
        await eventually(lambda: any(m.snapshot_complete for m in messages), what="the snapshot")
        hub = service.app.hub
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {LISTENER} AND datname = current_database()")
        await eventually(lambda: not hub.listening.is_set(), what="the listener to notice")
        await stubs.complete(first.run_id)  # committed while nobody listens
        await eventually(lambda: any(m.resync_complete for m in messages), what="a resync")
        await stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
        await service.core.finish(second.run_id)
        await stubs.wait_for(second.job_id, S.JOB_STATUS_SUCCEEDED)
        last = {}
        await eventually(lambda: _last_per_job(messages, last).get(second.job_id, None) == S.JOB_STATUS_SUCCEEDED, what="the last change")
    finally:
        stream.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    assert sum(m.snapshot_complete for m in messages) == 1
    last_messages = {m.job.job_id: m.job for m in messages if m.HasField("job")}
    for job_id in (first.job_id, second.job_id):
        assert last_messages[job_id] == await stubs.job(job_id)
    assert last_messages[first.job_id].status == S.JOB_STATUS_SUCCEEDED


def _last_per_job(messages, into):
    for message in messages:
        if message.HasField("job"):
            into[message.job.job_id] = message.job.status
    return into


# -- 7. a replica whose clock runs ahead -------------------------------------------------------


@pytest.mark.skipif(shutil.which("faketime") is None, reason="needs Debian's faketime (CI installs it)")
async def test_a_replica_whose_clock_runs_ahead_does_not_spin(services, database_url: str, tmp_path) -> None:
    """Defect 7: the dispatcher waits for the next due release in the database's clock. A replica
    whose own clock runs 30 s ahead sleeps like any other, instead of claiming in a busy loop."""
    core = await services.core()
    core.fail_releases = True
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "QUEUE_CORE_ADDR": f"127.0.0.1:{core.port}",
        "QUEUE_LISTEN_ADDR": f"127.0.0.1:{port}",
        "QUEUE_MIGRATE_ON_START": "false",
        "QUEUE_SWEEP_INTERVAL_SECONDS": "0",
        "QUEUE_LOG_LEVEL": "warning",
        # faketime's library on the replica itself (no wrapper process to stop, and none killed
        # before its clean-up, which would leave its shared memory behind).
        **skewed_clock_environment(),
    }
    log_path = str(tmp_path / "replica.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "queue_service.cli", "serve"],
            env=env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    stubs = services.stubs(f"127.0.0.1:{port}")
    try:
        await wait_serving(stubs, process=process, log_path=log_path, timeout=60)
        user = new_user()
        await stubs.grant(user, 1)
        job = await stubs.admit(user)
        await eventually(lambda: core.release_log, what="a first release attempt")
        with psycopg.connect(database_url, autocommit=True) as conn:
            # The next attempt is due in 20 s (database time).
            conn.execute(
                "UPDATE analysis_jobs SET next_release_at = clock_timestamp() + interval '20 seconds' WHERE job_id = %s", (job.job_id,)
            )
            await asyncio.sleep(1.0)
            before = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]
            await asyncio.sleep(2.0)
            after = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]
        # A spinning dispatcher commits thousands of claims in 2 s; a waiting one a handful.
        assert after - before < 50, f"{after - before} transactions in 2 s"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
            forget_faketime_segments(process.pid)


# -- 8. no core call under the user lock -------------------------------------------------------


async def test_a_slow_cancel_of_a_spare_run_does_not_hold_the_users_queue(services) -> None:
    """Defect 8: two admits race for the last place in the user's queue; the loser, refused
    USER_QUEUE_FULL under the lock after the core created its held run, cancels that spare run,
    and the core answers that cancel slowly. That never happens under the user's lock: the
    user's CompleteRun meanwhile succeeds instead of answering LOCK_TIMEOUT. (Two admits with one
    key no longer make a spare run: the second waits for the first's outcome, migration 0033.)"""
    core = await services.core()
    service = await services.start(core, lock_timeout_ms=300, max_queued_per_user=1)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    running = await stubs.admit(user)
    await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
    core.slow_seconds = 0.2  # both admits pass the pre-check before either commits
    core.answer_faults["CancelRun"] = AnswerFault("late", seconds=2.0)
    racing = asyncio.gather(stubs.admit(user, "first-key"), stubs.admit(user, "second-key"), return_exceptions=True)
    await eventually(lambda: core.faults_injected["CancelRun:late"] >= 1, what="the spare run's cancel")
    core.slow_seconds = 0
    completed = await stubs.complete(running.run_id)
    assert completed.status == S.JOB_STATUS_SUCCEEDED
    answers = await racing
    refused = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
    assert len(refused) == 1 and error_info(refused[0])[1] == "USER_QUEUE_FULL", answers


# -- also reported: reconciliation, cancel races, page tokens, the delta limit -----------------


async def test_a_run_the_core_no_longer_knows_frees_the_slot_only_once_cancel_confirms(services, database_url: str) -> None:
    """A single NOT_FOUND from GetRun no longer frees the slot: the job fails and is refunded,
    and the next job starts once CancelRun confirms (NOT_FOUND there counts: the core has no such run)."""
    core = await services.core()
    service = await services.start(core, reconcile_after_seconds=0.2, sweep_interval_seconds=0.2, release_lease_seconds=0.3)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    core._stop_judging(core.runs[first.run_id])
    del core.runs[first.run_id]  # the core forgot the run
    failed = await stubs.wait_for(first.job_id, S.JOB_STATUS_FAILED)
    assert failed.refunded and "does not know" in failed.last_error
    await asyncio.sleep(0.8)
    assert (await stubs.job(second.job_id)).status == S.JOB_STATUS_QUEUED
    core.answer_faults.clear()
    await stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
    assert InvariantChecker(database_url).all_violations() == []


async def test_a_running_job_whose_run_the_core_still_holds_is_released_again(services) -> None:
    """Reconciliation of a RUNNING job whose run the core reports HELD (it lost the release)
    releases it again instead of leaving it held forever."""
    core = await services.core()
    service = await services.start(core, reconcile_after_seconds=0.2, sweep_interval_seconds=0.2)
    stubs, user, job = await one_running_job(service)
    core._stop_judging(core.runs[job.run_id])
    core.runs[job.run_id].state = HELD  # the core lost the release
    await eventually(lambda: core.runs[job.run_id].state == JUDGING, what="a second release")
    await core.finish(job.run_id)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED)


async def test_a_cancel_the_core_reports_as_a_failure_is_still_refunded(services) -> None:
    """The core ends a run it was asked to cancel with CompleteRun(FAILED, refund_credit=false),
    before answering the cancel. A job the user canceled is refunded all the same."""
    core = await services.core()
    core.fail_canceled_runs = True
    service = await services.start(core)
    stubs, user, job = await one_running_job(service)
    with pytest.raises(grpc.aio.AioRpcError) as finished:
        await cancel(stubs, job.job_id, user)
    assert error_info(finished.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_ALREADY_FINISHED")
    final = await stubs.job(job.job_id)
    assert (final.status, final.refunded) == (S.JOB_STATUS_FAILED, True)
    assert await stubs.balance(user) == 1


async def test_cancelling_a_job_the_core_already_finished_keeps_its_charge(services) -> None:
    """The completion callback was lost; the run had SUCCEEDED at the core. CancelJob learns that
    from the core's answer: the job ends SUCCEEDED, keeps its charge, and the caller hears
    JOB_ALREADY_FINISHED."""
    core = await services.core()
    service = await services.start(core)
    stubs, user, job = await one_running_job(service)
    core.drop_callbacks = True
    await core.finish(job.run_id)
    with pytest.raises(grpc.aio.AioRpcError) as finished:
        await cancel(stubs, job.job_id, user)
    assert error_info(finished.value)[:3] == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "JOB_ALREADY_FINISHED",
        {"jobId": job.job_id, "status": "SUCCEEDED"},
    )
    final = await stubs.job(job.job_id)
    assert (final.status, final.refunded) == (S.JOB_STATUS_SUCCEEDED, False)
    assert await stubs.balance(user) == 0


async def test_page_tokens_carry_no_global_sequence(service) -> None:
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    jobs = [await stubs.admit(user) for _ in range(3)]
    page = await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user, page_size=2), timeout=5)
    token = json.loads(base64.urlsafe_b64decode(page.next_page_token + "=" * (-len(page.next_page_token) % 4)))
    assert set(token) == {"a", "f"} and token["a"] == jobs[1].job_id  # the page's last job, the caller's own
    rest = await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user, page_size=2, page_token=page.next_page_token), timeout=5)
    assert [j.job_id for j in rest.jobs] == [jobs[0].job_id] and rest.next_page_token == ""


async def test_deltas_beyond_the_users_limit_are_refused(services) -> None:
    core = await services.core()
    service = await services.start(core, max_active_deltas_per_user=2)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    base = await stubs.admit(user)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_RUNNING)
    await core.finish(base.run_id)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_SUCCEEDED)
    for _ in range(2):
        await stubs.admit(user, uri="", delta_of=base.job_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs.admit(user, uri="", delta_of=base.job_id)
    assert error_info(refused.value)[:3] == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "USER_DELTA_LIMIT",
        {"maxActiveDeltas": "2", "activeDeltas": "2"},
    )
    assert _live_runs_of(core, user) and len([r for r in core.runs.values() if r.user_id == user]) == 3


# -- a cancel whose answer is lost: the recorded intent decides the credit ---------------------


def _refund_reasons(database_url: str, job_id: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [r for (r,) in conn.execute("SELECT reason FROM credit_ledger WHERE job_id = %s AND kind = 'refund'", (job_id,))]


async def test_a_cancel_whose_answer_is_lost_after_the_core_failed_the_run_is_refunded(services, database_url: str) -> None:
    """The core ends the run it was asked to cancel with CompleteRun(FAILED, refund_credit=false)
    and the CancelRun answer is lost: CancelJob answers CORE_UNAVAILABLE, yet the job is refunded
    (the intent was recorded before the core was asked, and the callback applied it), and the
    retry answers JOB_ALREADY_FINISHED with nothing left charged."""
    core = await services.core()
    core.fail_canceled_runs = True
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    service = await services.start(core)
    stubs, user, job = await one_running_job(service)
    await cancel_left_unanswered(stubs, job.job_id, user)
    assert core.faults_injected["CancelRun:lose"] >= 1
    ended = await stubs.job(job.job_id)
    assert (ended.status, ended.refunded) == (S.JOB_STATUS_FAILED, True)
    with pytest.raises(grpc.aio.AioRpcError) as retried:
        await cancel(stubs, job.job_id, user)
    assert error_info(retried.value)[:3] == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "JOB_ALREADY_FINISHED",
        {"jobId": job.job_id, "status": "FAILED"},
    )
    assert await stubs.balance(user) == 1
    assert _refund_reasons(database_url, job.job_id) == ["cancel"]
    assert InvariantChecker(database_url).all_violations() == []


async def test_a_cancel_retried_after_the_job_ended_failed_without_the_intent_applied_refunds_it(services, database_url: str) -> None:
    """The job was ended FAILED without a refund after its user asked to cancel (by a replica of
    the previous version, which neither sets nor reads the intent: emulated with its statement).
    The retry of CancelJob applies the recorded intent: refunded, then JOB_ALREADY_FINISHED."""
    core = await services.core()
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    service = await services.start(core)
    stubs, user, job = await one_running_job(service)
    await cancel_left_unanswered(stubs, job.job_id, user)
    end_failed_as_a_previous_version(database_url, job.job_id)
    assert (await stubs.job(job.job_id)).refunded is False
    with pytest.raises(grpc.aio.AioRpcError) as retried:
        await cancel(stubs, job.job_id, user)
    assert error_info(retried.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_ALREADY_FINISHED")
    assert (await stubs.job(job.job_id)).refunded is True
    assert await stubs.balance(user) == 1
    assert _refund_reasons(database_url, job.job_id) == ["cancel"]


async def test_a_run_that_succeeded_before_a_cancel_with_a_lost_answer_keeps_its_charge(services, database_url: str) -> None:
    """The intent does not refund a run that succeeded: the completion came before the cancel
    reached the core, whose answer (SUCCEEDED) was lost. The job stays SUCCEEDED and charged."""
    core = await services.core()
    service = await services.start(core)
    stubs, user, job = await one_running_job(service)
    core.drop_callbacks = True
    await core.finish(job.run_id)
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    await cancel_left_unanswered(stubs, job.job_id, user)
    completed = await stubs.complete(job.run_id)  # the core's retried callback gets through
    assert (completed.status, completed.refunded) == (S.JOB_STATUS_SUCCEEDED, False)
    assert await stubs.balance(user) == 0
    assert _refund_reasons(database_url, job.job_id) == []


async def test_a_failure_learned_without_the_cores_refund_verdict_is_refunded(services, database_url: str) -> None:
    """The decision of docs/design.md ("Refunds of failed runs"): GetRun's answer says a run
    FAILED but not whether the user is at fault (only CompleteRun's `refund_credit` does), and the
    queue asks only because the completion was lost on the way. The job is refunded; the core's
    verdict arriving afterwards (refund_credit=false) changes nothing, the refund stays."""
    core = await services.core()
    service = await services.start(core, reconcile_after_seconds=0.2, sweep_interval_seconds=0.2)
    stubs, user, job = await one_running_job(service)
    core.drop_callbacks = True
    await core.finish(job.run_id, succeeded=False, message="the provider timed out")
    reconciled = await stubs.wait_for(job.job_id, S.JOB_STATUS_FAILED)
    assert (reconciled.refunded, reconciled.last_error) == (True, "the provider timed out")
    late = await stubs.complete(job.run_id, succeeded=False, refund=False)
    assert (late.status, late.refunded) == (S.JOB_STATUS_FAILED, True)
    assert await stubs.balance(user) == 1
    assert _refund_reasons(database_url, job.job_id) == ["reconcile"]


async def test_a_pending_job_whose_cancel_never_reached_the_core_is_canceled_not_released(services, database_url: str) -> None:
    """The user cancels a PENDING job while the core is unreachable (the cancel never reaches
    it): CancelJob answers CORE_UNAVAILABLE and the job stays PENDING. Its next release attempt
    does not start a run its user asked to cancel: it cancels the run, and the job ends CANCELED
    and refunded without any further call from the user."""
    core = await services.core()
    core.fail_releases = True
    service = await services.start(core, release_backoff_max_seconds=0.2)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    job = await stubs.admit(user)
    assert job.status == S.JOB_STATUS_PENDING
    core.unavailable = True
    await cancel_left_unanswered(stubs, job.job_id, user)
    assert core.runs[job.run_id].state == HELD
    core.unavailable = False
    core.fail_releases = False
    canceled = await stubs.wait_for(job.job_id, S.JOB_STATUS_CANCELED, S.JOB_STATUS_RUNNING)
    assert (canceled.status, canceled.refunded) == (S.JOB_STATUS_CANCELED, True)
    assert core.runs[job.run_id].state == CANCELED
    assert user not in core.judging_now or not core.judging_now[user]
    assert await stubs.balance(user) == 1
    assert InvariantChecker(database_url).all_violations() == []


async def test_a_running_job_whose_cancel_never_reached_the_core_is_canceled_by_the_sweeper(services, database_url: str) -> None:
    """The user cancels a RUNNING job while the core is unreachable: CancelJob answers
    CORE_UNAVAILABLE. The recorded intent makes the job due for the sweeper, which asks the core
    to cancel again once it answers: CANCELED and refunded long before a lost completion would
    be reconciled, without any further call from the user."""
    core = await services.core()
    service = await services.start(core, sweep_interval_seconds=0.2, release_lease_seconds=0.3)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    job = await stubs.admit(user)
    queued = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    core.unavailable = True
    await cancel_left_unanswered(stubs, job.job_id, user)
    assert core.runs[job.run_id].state == JUDGING
    core.unavailable = False
    canceled = await stubs.wait_for(job.job_id, S.JOB_STATUS_CANCELED)
    assert canceled.refunded
    assert core.runs[job.run_id].state == CANCELED
    await stubs.wait_for(queued.job_id, S.JOB_STATUS_RUNNING)
    assert core.max_concurrent_judging[user] == 1
    assert InvariantChecker(database_url).all_violations() == []
