"""The core as the second copy (design I14): what an asynchronous PostgreSQL failover lost is
rebuilt from the core's live runs.

No Patroni here: the lost-commit case is simulated by deleting, directly in the database, what a
failover to a lagging standby would have lost (the jobs' rows, their ledger entries and balance
movements, their reservations and feed rows), while the dev core still holds or judges their
runs. Then, through the public API: the orphaned runs are adopted back into their jobs with their
charges (or canceled and recorded when the click was admitted again), no user has two first-pass
runs judging at the core (the dev core counts), a completion of a lost run ends up applied, and
after reconciliation every live core run belongs to a live job (I10).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.dev.core import AnswerFault
from queue_service.model import DatabaseIdentity
from queue_service.store import Statements
from tests.harness import InvariantChecker, S, eventually, new_user, nothing_in_flight

HELD, JUDGING, CANCELED = core_pb2.RUN_STATE_HELD, core_pb2.RUN_STATE_JUDGING, core_pb2.RUN_STATE_CANCELED


def lose_commits(database_url: str, job_ids: list[str], *, reservations_survive_for: float | None = None) -> None:
    """What a failover to a standby that had not received these jobs' commits leaves: no job, no
    charge (the balance as before), no reservation, no feed row. With `reservations_survive_for`
    the standby had received the runs' reservations (written before CreateRun) but not the
    admits' commits that consumed them: each comes back, its grace ending that many seconds from
    now (negative: over already). A failover begins a history the queue has not reconciled with
    the core, so the record of the current one goes too."""
    ids = [uuid.UUID(j) for j in job_ids]
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        conn.execute("DELETE FROM core_reconciled_histories")
        owners = conn.execute("SELECT run_id, user_id FROM analysis_jobs WHERE job_id = ANY(%s)", (ids,)).fetchall()
        runs = [row[0] for row in owners]
        conn.execute(
            """UPDATE credit_accounts c SET balance = c.balance - s.total
                 FROM (SELECT user_id, sum(amount) AS total FROM credit_ledger WHERE job_id = ANY(%s) GROUP BY user_id) s
                WHERE c.user_id = s.user_id""",
            (ids,),
        )
        conn.execute("DELETE FROM credit_ledger WHERE job_id = ANY(%s)", (ids,))
        conn.execute("DELETE FROM analysis_job_feed WHERE job_id = ANY(%s)", (ids,))
        conn.execute("DELETE FROM analysis_jobs WHERE job_id = ANY(%s)", (ids,))
        conn.execute("DELETE FROM run_reservations WHERE run_id = ANY(%s)", (runs,))
        if reservations_survive_for is not None:
            conn.cursor().executemany(
                "INSERT INTO run_reservations (run_id, user_id, cancel_after) VALUES (%s, %s, clock_timestamp() + make_interval(secs => %s))",
                [(run_id, user_id, reservations_survive_for) for run_id, user_id in owners],
            )


def orphans(core, database_url: str) -> list[str]:
    """Live runs at the core that no live job owns (I10)."""
    live = list(core.live_runs())
    with psycopg.connect(database_url, autocommit=True) as conn:
        owned = {
            str(row[0])
            for row in conn.execute(
                "SELECT run_id FROM analysis_jobs WHERE run_id = ANY(%s::uuid[]) AND status IN ('queued', 'pending', 'running')", (live,)
            ).fetchall()
        }
    return [run_id for run_id in live if run_id not in owned]


async def test_lost_jobs_are_adopted_back_with_their_charges_and_the_core_never_judges_two(services, database_url: str) -> None:
    """A RUNNING job (its run judging) and a QUEUED one (its run held) are lost; the user admits
    again on the "new primary", whose free slot goes to the new job. Its release is held back
    while the core judges the lost run (I9 at the core); reconciliation adopts both lost runs
    with their original job ids and charges; everything then runs to the end, one at a time."""
    core = await services.core()
    service = await services.start(core, release_backoff_max_seconds=0.1)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 5)
    running = await stubs.admit(user)
    queued = await stubs.admit(user)
    await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
    assert core.runs[running.run_id].state == JUDGING and core.runs[queued.run_id].state == HELD
    assert await stubs.balance(user) == 3

    lose_commits(database_url, [running.job_id, queued.job_id])
    assert await stubs.balance(user) == 5
    with pytest.raises(grpc.aio.AioRpcError) as lost:
        await stubs.job(running.job_id)
    assert lost.value.code() == grpc.StatusCode.NOT_FOUND

    # After the failover: a new click takes the slot the new primary thinks is free.
    later = await stubs.admit(user)
    assert later.status == S.JOB_STATUS_PENDING
    await asyncio.sleep(0.5)  # the dispatcher tries to release it meanwhile
    assert core.runs[later.run_id].state == HELD, "released while the core judged the user's lost run (I9)"
    assert core.max_concurrent_judging[user] == 1

    # The held-back release adopted the judging run already; reconciliation adopts the held one.
    report = await service.app.reconciler.reconcile()
    assert report.orphans == report.adopted and report.adopted >= 1, report
    adopted_running = await stubs.job(running.job_id)
    adopted_queued = await stubs.job(queued.job_id)
    assert adopted_running.status == S.JOB_STATUS_RUNNING and adopted_running.run_id == running.run_id
    assert adopted_queued.status == S.JOB_STATUS_QUEUED and adopted_queued.run_id == queued.run_id
    assert await stubs.balance(user) == 2  # three clicks acknowledged, three charges
    assert orphans(core, database_url) == []
    # Reconciling again (another replica, the next pass) changes nothing.
    again = await service.app.reconciler.reconcile()
    assert again.orphans == 0

    # Everything runs to the end, one at a time at the core.
    core.judging_seconds = 0.05
    core.start_judging()
    for job in (running, later, queued):
        await stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED, timeout=20)
    assert core.max_concurrent_judging[user] == 1
    assert await stubs.balance(user) == 2
    checker = InvariantChecker(database_url)
    assert checker.i3_ledger() == [] and checker.i1_slot_limit() == []
    assert orphans(core, database_url) == []


async def test_a_judging_run_whose_reservation_outlived_its_lost_job_holds_the_next_release_and_is_adopted(
    services, database_url: str
) -> None:
    """The standby had the run's reservation but not the admit's commit that consumed it (the job
    was acknowledged and released on the old primary). A first-pass run judges only once its job
    committed, so the core judging it means the job was lost, not that an admit is in flight: the
    user's next release waits while it judges (I9 at the core) and the run is adopted back, its
    reservation consumed, long before the reservation's grace would have canceled it."""
    core = await services.core()
    service = await services.start(core, release_backoff_max_seconds=0.1)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 5)
    lost = await stubs.admit(user)
    await stubs.wait_for(lost.job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, [lost.job_id], reservations_survive_for=3600)

    later = await stubs.admit(user)
    assert later.status == S.JOB_STATUS_PENDING
    await asyncio.sleep(0.5)  # the dispatcher tries to release it meanwhile
    assert core.runs[later.run_id].state == HELD, "released while the core judged the user's lost run (I9)"
    assert core.max_concurrent_judging[user] == 1
    adopted = await eventually(lambda: _status(stubs, lost.job_id), what="the lost judging run adopted")
    assert adopted == S.JOB_STATUS_RUNNING
    assert core.runs[lost.run_id].state == JUDGING
    assert _reserved(database_url, lost.run_id) == 0
    assert await stubs.balance(user) == 3  # two clicks acknowledged, two charges

    core.judging_seconds = 0.05
    core.start_judging()
    for job in (lost, later):
        await stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED, timeout=20)
    assert core.max_concurrent_judging[user] == 1
    assert InvariantChecker(database_url).i3_ledger() == []
    assert orphans(core, database_url) == []


@pytest.mark.parametrize("capacity", [0, 1000], ids=["unlimited", "capacity-limited"])
async def test_an_adopted_judging_run_keeps_the_users_next_job_from_the_core_once_the_history_is_recorded(
    services, database_url: str, capacity: int
) -> None:
    """After an asynchronous failover the user's new click takes the slot the new primary thinks
    free while the core still judges her lost run. Reconciliation adopts that run RUNNING, then
    records the history as reconciled: from then on releases no longer ask the core, so the
    database alone must keep her new job from the core until the adopted run settles (I9, I14).
    The job goes back to the head of her queue (with a capacity set, its grant and her turn
    given back), and its release window does not run out while the adopted run judges: it is
    released once that run ends, one run at a time at the core."""
    core = await services.core()
    window = 6.0
    # The sweeper adopts the lost run and, past the straggler bound (the core deadline, 2 s, and
    # a second), records the history.
    service = await services.start(core, release_backoff_max_seconds=0.1, release_window_seconds=window, sweep_interval_seconds=0.5)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 5)
    lost = await stubs.admit(user)
    await stubs.wait_for(lost.job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, [lost.job_id])
    try:
        await _set_capacity(stubs, capacity)
        await _the_adopted_run_keeps_the_next_job_back(service, database_url, user, lost, window, capacity_limited=capacity > 0)
    finally:
        await _set_capacity(stubs, 0)


async def _set_capacity(stubs, capacity: int) -> None:
    operator = op_grpc.OperatorServiceStub(stubs.channel)
    await operator.SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=capacity, unlimited=capacity == 0), timeout=10)


async def _the_adopted_run_keeps_the_next_job_back(
    service, database_url: str, user: str, lost, window: float, *, capacity_limited: bool
) -> None:
    core, stubs = service.core, service.stubs
    checks_before = core.user_list_calls
    later = await stubs.admit(user)
    assert later.status == S.JOB_STATUS_PENDING
    # Its release was tried (with a capacity set: granted, her turn recorded) and held back by
    # the core's count: the lost run judges.
    await eventually(lambda: core.user_list_calls > checks_before, what="the release to ask the core")
    window_over_at = time.monotonic() + window
    assert await eventually(lambda: _status(stubs, lost.job_id), what="the lost judging run adopted") == S.JOB_STATUS_RUNNING
    await eventually(lambda: _replica_knows_reconciled(service), what="the history recorded as reconciled", timeout=15)
    # Releases go straight to the core now; the dispatcher has its turns until past the window.
    await asyncio.sleep(max(0.0, window_over_at - time.monotonic()) + 1.0)
    assert core.runs[later.run_id].state == HELD, "released while the core judged the user's adopted run (I9)"
    assert core.max_concurrent_judging[user] == 1
    held_back = await stubs.job(later.job_id)
    assert held_back.status == S.JOB_STATUS_QUEUED and held_back.queue_position == 1, held_back
    if capacity_limited:
        assert _turns_of(database_url, user) == 0, "the grant taken back kept the user's turn"
    assert InvariantChecker(database_url).i1_slot_limit() == []
    # Another click queues behind it.
    third = await stubs.admit(user)
    assert third.status == S.JOB_STATUS_QUEUED and third.queue_position == 2

    assert await core.finish(lost.run_id) is not None
    await stubs.wait_for(later.job_id, S.JOB_STATUS_RUNNING, timeout=15)
    assert core.runs[third.run_id].state == HELD
    core.judging_seconds = 0.05
    core.start_judging()
    for job in (later, third):
        await stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED, timeout=20)
    assert core.max_concurrent_judging[user] == 1
    assert await stubs.balance(user) == 2  # three clicks acknowledged, three charges
    checker = InvariantChecker(database_url)
    assert checker.i3_ledger() == [] and checker.i1_slot_limit() == []
    assert checker.i2_fifo(exempt_adopted_judging=True) == []
    assert orphans(core, database_url) == []


async def test_the_sweeper_adopts_a_judging_run_whose_reservation_outlived_its_lost_job_rather_than_cancel_it(
    services, database_url: str
) -> None:
    """The reservation's grace is over when the sweeper finds it: a held run would be canceled (its
    admit is gone), but a judging first-pass run's admit committed and was acknowledged on the
    lost primary, so it is adopted, never canceled."""
    core = await services.core()
    service = await services.start(core)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    job = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, [job.job_id], reservations_survive_for=-1)
    claim = await _claim_reservation(service, job.run_id)

    assert await service.app.recovery.cancel_reserved_run(claim) is True
    assert core.runs[job.run_id].state == JUDGING, "the sweeper canceled an acknowledged, judging run"
    assert (await stubs.job(job.job_id)).status == S.JOB_STATUS_RUNNING
    assert _reserved(database_url, job.run_id) == 0
    assert await stubs.balance(user) == 2
    assert InvariantChecker(database_url).i3_ledger() == []


async def test_a_reservation_claimed_before_its_run_was_adopted_does_not_cancel_the_adopted_run(services, database_url: str) -> None:
    """Another replica's sweeper (or a failed admit's clean-up) claimed the stale reservation;
    reconciliation adopts the judging run meanwhile; the claim's cancel then finds a job owning
    the run and leaves it judging."""
    core = await services.core()
    service = await services.start(core)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    job = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, [job.job_id], reservations_survive_for=-1)
    claim = await _claim_reservation(service, job.run_id)
    report = await service.app.reconciler.reconcile()
    assert report.adopted == 1, report

    assert await service.app.recovery.cancel_reserved_run(claim) is True
    assert core.runs[job.run_id].state == JUDGING, "a stale claim canceled the adopted run"
    assert (await stubs.job(job.job_id)).status == S.JOB_STATUS_RUNNING
    assert _reserved(database_url, job.run_id) == 0
    assert await stubs.balance(user) == 2


@pytest.mark.parametrize("earlier_timeline", [True, False], ids=["earlier-timeline", "same-timeline"])
async def test_a_held_run_whose_reservation_an_earlier_timeline_wrote_is_adopted_and_one_of_this_timeline_canceled(
    services, database_url: str, earlier_timeline: bool
) -> None:
    """A QUEUED job (its run held) is lost but its reservation survived. Written on an earlier
    timeline than the current primary's, the reservation's admit ran on a primary a failover
    replaced: the sweeper adopts the run back into its job (QUEUED, with its charge) instead of
    canceling it. Written on the current timeline, it is an admit that failed: canceled (I5)."""
    core = await services.core()
    service = await services.start(core)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    running = await stubs.admit(user)
    queued = await stubs.admit(user)
    await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
    assert core.runs[queued.run_id].state == HELD
    lose_commits(database_url, [queued.job_id], reservations_survive_for=-1)
    if earlier_timeline:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("UPDATE run_reservations SET timeline_id = queue_current_timeline() - 1 WHERE run_id = %s", (queued.run_id,))
    claim = await _claim_reservation(service, queued.run_id)

    assert await service.app.recovery.cancel_reserved_run(claim) is True
    assert _reserved(database_url, queued.run_id) == 0
    if earlier_timeline:
        assert core.runs[queued.run_id].state == HELD, "the sweeper canceled the run of an acknowledged admit"
        assert (await stubs.job(queued.job_id)).status == S.JOB_STATUS_QUEUED
        assert await stubs.balance(user) == 1
    else:
        assert core.runs[queued.run_id].state == CANCELED
        assert await _status(stubs, queued.job_id) is None
        assert await stubs.balance(user) == 2
    assert InvariantChecker(database_url).i3_ledger() == []


async def _status(stubs, job_id: str):
    try:
        return (await stubs.job(job_id)).status
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


async def _claim_reservation(service, run_id: str):
    """Claims the run's reservation as the sweeper would (its grace over); exactly one."""
    async with service.app.store.statements() as db:
        claims = [c for c in await db.claim_due_run_reservations(lease_seconds=30, batch_size=100) if str(c.run_id) == run_id]
    assert len(claims) == 1
    return claims[0]


def _turns_of(database_url: str, user: str) -> int:
    """The user's recorded turns at the core's capacity (0 or 1)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM user_capacity_turns WHERE user_id = %s", (user,)).fetchone()[0])


def _reserved(database_url: str, run_id: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM run_reservations WHERE run_id = %s AND settled_at IS NULL", (run_id,)).fetchone()[0])


async def test_a_completion_of_a_lost_run_is_adopted_and_applied(services, database_url: str) -> None:
    """The core finishes a run whose job the failover lost: its CompleteRun is not refused for
    good; the run is adopted from the core's record and the completion applied, with the charge."""
    core = await services.core()
    service = await services.start(core)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    job = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, [job.job_id])

    answer = await core.finish(job.run_id, succeeded=True)
    assert answer is not None, "the completion of the lost run was refused"
    finished = await stubs.job(job.job_id)
    assert finished.status == S.JOB_STATUS_SUCCEEDED and finished.run_id == job.run_id
    assert await stubs.balance(user) == 2
    assert InvariantChecker(database_url).i3_ledger() == []
    # The user's next click runs at once: the adopted job's slot was freed by its completion.
    following = await stubs.admit(user)
    assert (await stubs.wait_for(following.job_id, S.JOB_STATUS_RUNNING)).run_id == following.run_id


async def test_a_completion_racing_reconciliation_on_two_replicas_applies_once(services, database_url: str) -> None:
    """The core's CompleteRun of lost runs reaches one replica while another reconciles the same
    runs: each run is adopted once (under its user's lock), each completion applied once, each
    user charged once."""
    core = await services.core()
    one = await services.start(core)
    other = await services.start(core)
    core.set_callback_addr(one.address)
    users = [new_user() for _ in range(5)]
    lost = []
    for user in users:
        await one.stubs.grant(user, 2)
        lost.append(await one.stubs.admit(user))
    for job in lost:
        await one.stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, [job.job_id for job in lost])

    # Every GetRun answered 0.3 s late: the reconciliation has seen the runs judging and is
    # about to adopt them when the completions arrive and adopt them too.
    core.answer_faults["GetRun"] = AnswerFault("late", 0.3)
    listed_before = core.list_calls
    reconciling = asyncio.ensure_future(other.app.reconciler.reconcile())
    await eventually(lambda: core.list_calls > listed_before, what="the reconciliation to list the runs")
    await asyncio.sleep(0.1)
    answers = await asyncio.gather(*(core.finish(job.run_id) for job in lost))
    report = await reconciling
    assert all(answer is not None for answer in answers), "a completion of a lost run was refused"
    assert report.orphans == len(lost), report
    for job, user in zip(lost, users, strict=True):
        assert (await other.stubs.job(job.job_id)).status == S.JOB_STATUS_SUCCEEDED
        assert await other.stubs.balance(user) == 1
    checker = InvariantChecker(database_url)
    assert checker.i3_ledger() == []
    assert checker.count(f"SELECT count(*) FROM credit_ledger WHERE kind = 'charge' AND user_id = ANY(ARRAY{users})") == len(users)
    assert orphans(core, database_url) == []


async def test_a_lost_run_whose_click_was_admitted_again_is_canceled_and_recorded(services, database_url: str) -> None:
    """The user retried her click (same idempotency key) on the new primary before reconciliation:
    the retry's job holds the key, so the lost run is canceled at the core (never judged beside
    the retry's) and its loss recorded for the operator; she is charged once."""
    core = await services.core()
    service = await services.start(core, release_backoff_max_seconds=0.1)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    key = uuid.uuid4().hex
    first = await stubs.admit(user, key)
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, [first.job_id])

    retry = await stubs.admit(user, key)
    assert retry.job_id != first.job_id  # the new primary never saw the first
    # The retry's release waits for the lost run, which the release gate settles at once.
    running = await stubs.wait_for(retry.job_id, S.JOB_STATUS_RUNNING, timeout=15)
    assert running.run_id == retry.run_id
    assert core.runs[first.run_id].state == CANCELED
    assert core.max_concurrent_judging[user] == 1
    assert await stubs.balance(user) == 2
    rows = InvariantChecker(database_url).rows(
        f"SELECT reason, core_state, idempotency_key FROM core_runs_lost WHERE run_id = '{first.run_id}'"
    )
    assert rows == [("key_taken", "judging", key)]
    assert orphans(core, database_url) == []


async def test_two_replicas_reconciling_at_once_adopt_each_run_once(services, database_url: str) -> None:
    """Adoption is idempotent across replicas: both reconcile the same orphans at the same time;
    each lost job comes back once, charged once."""
    core = await services.core()
    one = await services.start(core)
    other = await services.start(core)
    users = [new_user() for _ in range(6)]
    lost: list[str] = []
    for user in users:
        await one.stubs.grant(user, 2)
        lost.append((await one.stubs.admit(user)).job_id)
    for job_id in lost:
        await one.stubs.wait_for(job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, lost)
    # The core's list comes a page at a time: every live run, once, whatever the page size.
    listed = await one.app.core.list_runs(page_size=4)
    assert sorted(str(run.run_id) for run in listed) == sorted(core.live_runs()) and core.list_calls >= 2

    reports = await asyncio.gather(one.app.reconciler.reconcile(), other.app.reconciler.reconcile())
    assert sum(r.adopted for r in reports) == len(lost), reports
    for job_id, user in zip(lost, users, strict=True):
        assert (await other.stubs.job(job_id)).status == S.JOB_STATUS_RUNNING
        assert await other.stubs.balance(user) == 1
    assert InvariantChecker(database_url).i3_ledger() == []
    assert orphans(core, database_url) == []


async def test_the_sweeper_reconciles_and_reads_the_database_identity(services, database_url: str) -> None:
    """The sweeper's pass runs the reconciliation (the first pass of a replica always does), and
    the database's identity (its timeline) is readable, so a failover is noticed."""
    core = await services.core()
    service = await services.start(core)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    job = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    lose_commits(database_url, [job.job_id])
    report = await service.app.sweeper.sweep_once()
    assert report.runs_adopted == 1
    assert (await stubs.job(job.job_id)).status == S.JOB_STATUS_RUNNING
    async with service.app.store.statements() as db:
        identity = await db.database_identity()
    assert identity.timeline_id is not None and identity.timeline_id >= 1 and identity.system_identifier
    assert await service.app.reconciler.database_replaced() is False


async def test_the_identity_watch_takes_the_health_probes_reading_of_the_database(services, monkeypatch) -> None:
    """Health commits its probe every QUEUE_HEALTH_INTERVAL_SECONDS and reads the database's
    identity in the same statement: the identity watch's looks, every 2 s, take that reading
    instead of a statement of their own, and see the same history the database reports."""
    core = await services.core()
    service = await services.start(core, sweep_interval_seconds=60.0)
    own_reads = 0
    read_alone = Statements.database_identity

    async def counted(self: Statements) -> DatabaseIdentity:
        nonlocal own_reads
        own_reads += 1
        return await read_alone(self)

    await asyncio.sleep(1.0)  # the watch's first look, and the first probes
    monkeypatch.setattr(Statements, "database_identity", counted)
    looks_before = service.app.sweeper.identity_watch.looks
    await asyncio.sleep(5.0)
    looks = service.app.sweeper.identity_watch.looks - looks_before
    assert looks >= 2, looks
    # A look reads on its own only when health's last probe is not fresh (a loaded machine).
    assert own_reads <= looks // 2, (own_reads, looks)
    async with service.app.store.statements() as db:
        identity = await read_alone(db)
    assert service.app.reconciler.identity == identity and identity.timeline_id is not None
    assert await service.app.reconciler.database_replaced() is False


def forget_reconciled_histories(database_url: str) -> None:
    """What a failover or a restore means for the record: the history now written is not one the
    queue reconciled."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM core_reconciled_histories")


def reconciled_histories(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM core_reconciled_histories").fetchone()
    assert row is not None
    return int(row[0])


async def test_releases_ask_the_core_only_until_the_database_history_is_reconciled(services, database_url: str) -> None:
    """I9 at the core costs a call per release only while it can matter: on a history the queue
    has not reconciled (a fresh one here, as after a failover), every first-pass release asks the
    core first; once a reconciliation begun past the straggler bound (the core deadline and a
    second) went through whole, the history is recorded and releases go straight to the core; a
    history that is no longer the recorded one (its record gone) is asked about again, for at least
    the straggler bound from when the replica noticed, and then recorded again."""
    forget_reconciled_histories(database_url)
    core = await services.core()
    core.judging_seconds = 0.05
    # A straggler bound of 4 s: each phase's two jobs end well inside it, also on a slow machine.
    service = await services.start(core, core_deadline_seconds=3.0, sweep_interval_seconds=1.0, release_backoff_max_seconds=0.1)
    stubs = service.stubs

    async def run_two_jobs() -> int:
        """A new user's two jobs, the second promoted when the first ends: the release checks
        the core made meanwhile."""
        user = new_user()
        await stubs.grant(user, 2)
        checks_before = core.user_list_calls
        jobs = [await stubs.admit(user) for _ in range(2)]
        for job in jobs:
            await stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED, timeout=20)
        assert core.max_concurrent_judging[user] == 1
        return core.user_list_calls - checks_before

    core.start_judging()
    assert await run_two_jobs() == 2, "a release on an unreconciled history must ask the core"
    await eventually(lambda: _replica_knows_reconciled(service), what="the history recorded as reconciled", timeout=15)
    assert reconciled_histories(database_url) == 1
    assert await run_two_jobs() == 0, "a release on the reconciled history asked the core"

    forget_reconciled_histories(database_url)
    # The sweeper's next look notices the record gone, and does not record the history again
    # at once (a release begun before may still reach the core): the releases ask meanwhile.
    await eventually(lambda: not _replica_knows_reconciled(service), what="the record's loss noticed", timeout=15)
    assert await run_two_jobs() == 2, "a release on a history no longer recorded must ask the core"
    await eventually(lambda: _replica_knows_reconciled(service), what="the history recorded again", timeout=15)
    assert reconciled_histories(database_url) == 1
    assert orphans(core, database_url) == []


def _replica_knows_reconciled(service) -> bool:
    identity = service.app.reconciler.identity
    return identity is not None and identity.reconciled


async def test_a_watch_stream_learns_that_a_job_vanished(services, database_url: str) -> None:
    """A stream announced a job the new primary does not have: after the failover (the database
    replaced: the stream resyncs) its last message for the job says it vanished, as GetJob's
    NOT_FOUND does (I11)."""
    core = await services.core()
    service = await services.start(core)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    kept = await stubs.admit(user)
    gone = await stubs.admit(user)
    call = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user))
    seen: dict[str, object] = {}
    vanished: list[str] = []

    async def read() -> None:
        async for message in call:
            if message.vanished:
                vanished.append(message.job.job_id)
            elif message.HasField("job"):
                seen[message.job.job_id] = message.job.status

    reader = asyncio.ensure_future(read())
    try:
        await eventually(lambda: gone.job_id in seen and kept.job_id in seen, what="the snapshot")
        lose_commits(database_url, [gone.job_id])
        service.app.hub.database_replaced()
        await eventually(lambda: gone.job_id in vanished, what="the vanished marker")
        assert kept.job_id not in vanished
    finally:
        call.cancel()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    with pytest.raises(grpc.aio.AioRpcError):
        await stubs.job(gone.job_id)


def _replay_caught_up(primary_dsn: str, standby_dsn: str) -> bool:
    with psycopg.connect(primary_dsn, autocommit=True) as primary, psycopg.connect(standby_dsn, autocommit=True) as standby:
        written = primary.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        return bool(standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(written),)).fetchone()[0])


async def test_an_asynchronous_failover_is_noticed_and_what_it_lost_is_adopted(services) -> None:
    """A real failover without Patroni: a primary and a streaming standby (pg_basebackup), the
    service behind a proxy that follows the primary. The standby stops receiving WAL, the service
    admits (acknowledged, never replicated), the primary dies and the standby is promoted (a new
    timeline). Without any call to the service's internals: the replica notices the new timeline,
    reconciles with the core's runs and adopts the lost jobs with their charges, and asks the core
    at once about running jobs (a completion acknowledged by the old primary was lost); the core
    never judges two runs of the user; a WatchJobs stream converges on what GetJob says (I11)."""
    from queue_service.dev.embedded_postgres import EmbeddedPostgres
    from tests.faults import TcpProxy

    # Not under pytest's tmp_path: another pytest session resets its base folder to 0700, and the
    # embedded server may run as its own system user.
    state = Path(tempfile.mkdtemp(prefix="acurio-queue-failover-"))
    primary = EmbeddedPostgres(state / "primary", durable=False, max_connections=100)
    primary.start()
    standby: EmbeddedPostgres | None = None
    proxy = TcpProxy(primary.dsn("queue"))
    try:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE queue")
        await proxy.up()
        core = await services.core()
        service = await services.start(core, database_url=proxy.dsn(), migrate_on_start=True, sweep_interval_seconds=3600.0)
        stubs = service.stubs
        survivor_user, user = new_user(), new_user()
        await stubs.grant(survivor_user, 2)
        await stubs.grant(user, 5)
        kept = await stubs.admit(survivor_user)
        await stubs.wait_for(kept.job_id, S.JOB_STATUS_RUNNING)

        # The standby: a base backup that streams, then stops receiving (lagging without bound).
        standby = EmbeddedPostgres(state / "standby", durable=False, max_connections=100)
        standby.data_dir.mkdir(mode=0o700)
        if primary._run_as is not None:
            account = pwd.getpwnam(primary._run_as)
            os.chown(standby.data_dir, account.pw_uid, account.pw_gid)
        primary._pg("pg_basebackup", "-D", str(standby.data_dir), "-d", primary.dsn(), "-X", "stream", "-R", "-c", "fast", timeout=120)
        standby.start()
        await eventually(lambda: _replay_caught_up(primary.dsn(), standby.dsn()), timeout=30, what="the standby to catch up")
        with psycopg.connect(standby.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
        await asyncio.sleep(1.0)

        # Acknowledged on the primary only: a completion of a surviving job, and two admits.
        assert await core.finish(kept.run_id) is not None
        assert (await stubs.job(kept.job_id)).status == S.JOB_STATUS_SUCCEEDED
        running = await stubs.admit(user)
        queued = await stubs.admit(user)
        await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
        assert core.runs[running.run_id].state == JUDGING and core.runs[queued.run_id].state == HELD
        assert await stubs.balance(user) == 3
        call = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user))
        last: dict[str, object] = {}

        async def read() -> None:
            async for message in call:
                if message.HasField("job") and message.job.job_id:
                    last[message.job.job_id] = "vanished" if message.vanished else message.job.status

        reader = asyncio.ensure_future(read())
        try:
            await eventually(lambda: running.job_id in last and queued.job_id in last, what="the stream's snapshot")

            # The primary's node dies; the standby is promoted; the proxy follows it.
            primary.stop(mode="immediate")
            proxy.retarget(standby.dsn("queue"))
            await proxy.cut()
            with psycopg.connect(standby.dsn("queue"), autocommit=True) as conn:
                assert conn.execute("SELECT pg_promote(true, 60)").fetchone()[0] is True, "the standby was not promoted in 60 s"
                assert conn.execute("SELECT count(*) FROM analysis_jobs WHERE job_id = %s", (uuid.UUID(running.job_id),)).fetchone()[0] == 0

            async def adopted() -> bool:
                try:
                    return (await stubs.job(running.job_id)).status == S.JOB_STATUS_RUNNING and (
                        await stubs.job(queued.job_id)
                    ).status == S.JOB_STATUS_QUEUED
                except grpc.aio.AioRpcError:
                    return False

            promoted_at = time.monotonic()
            try:
                await eventually(adopted, timeout=30, what="the lost jobs to be adopted after the failover")
            except AssertionError as exc:
                watch, known = service.app.sweeper.identity_watch, service.app.reconciler.identity
                raise AssertionError(f"{exc}; the replica's identity watch: {watch}, identity last seen: {known}") from None
            print(f"lost jobs adopted {time.monotonic() - promoted_at:.2f} s after the standby's promotion")
            # The surviving job whose completion was lost is asked about at the core at once,
            # not QUEUE_RECONCILE_AFTER_SECONDS (15 min) after its start. On one starved core a
            # statement of that reconciliation sometimes stalls mid-exchange after the failover
            # (the server waiting for the rest of the request, the client for the answer); it is
            # given up after the statement timeout and a second (11 s), and the reconciliation is
            # tried again within its pass: the wait allows for that once.
            await stubs.wait_for(kept.job_id, S.JOB_STATUS_SUCCEEDED, timeout=20)
            print(f"lost completion reconciled {time.monotonic() - promoted_at:.2f} s after the standby's promotion")
            assert await stubs.balance(user) == 3
            assert core.max_concurrent_judging[user] == 1
            assert orphans(core, standby.dsn("queue")) == []

            # The rest runs to the end, one at a time; the stream converges on GetJob.
            core.judging_seconds = 0.05
            core.start_judging()
            for job in (running, queued):
                await stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED, timeout=20)
            assert core.max_concurrent_judging[user] == 1
            await eventually(lambda: last.get(queued.job_id) == S.JOB_STATUS_SUCCEEDED, what="the stream to converge")
            assert last[running.job_id] == S.JOB_STATUS_SUCCEEDED
            assert InvariantChecker(standby.dsn("queue")).all_violations() == []
        finally:
            call.cancel()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    finally:
        await proxy.down()
        if standby is not None:
            standby.stop(mode="immediate")
        primary.stop(mode="immediate")
        shutil.rmtree(state, ignore_errors=True)


async def test_an_adopted_judging_run_never_takes_back_a_job_whose_release_the_core_may_have_applied(services, database_url: str) -> None:
    """A user with two slots and a capacity of 3: W judges; Y's release is applied at the core but
    every answer is lost, so Y stays PENDING retrying (its run judging). A third job X, released on
    a primary that held a higher limit, judges too, and the failover loses it. Y's next retry asks
    the core (the history is not reconciled), which reports X: X is adopted RUNNING, and with no
    slot free it would take back the user's PENDING job. Y's release may have been applied (here
    it was), so Y is not sent back to her queue, where it would wait again uncounted under the
    capacity while its run judges: it keeps its slot and its capacity, and X takes a slot past her
    limit until one of them ends. Y starts (RUNNING) once the core counts fewer than her limit."""
    nothing_in_flight(database_url)  # the module's earlier tests leave runs that would take the capacity
    core = await services.core()
    service = await services.start(core, release_backoff_max_seconds=0.3)
    stubs, user = service.stubs, new_user()
    operator = op_grpc.OperatorServiceStub(stubs.channel)
    await _set_capacity(stubs, 3)
    try:
        await operator.SetUserQueueLimit(op_pb2.SetUserQueueLimitRequest(user_id=user, max_active=2), timeout=10)
        await stubs.grant(user, 5)
        w = await stubs.wait_for((await stubs.admit(user)).job_id, S.JOB_STATUS_RUNNING)
        core.answer_faults["ReleaseRun"] = AnswerFault("lose")
        y = await stubs.admit(user)
        await eventually(lambda: core.runs[y.run_id].state == JUDGING, what="Y's release applied at the core")
        await operator.SetUserQueueLimit(op_pb2.SetUserQueueLimitRequest(user_id=user, max_active=3), timeout=10)
        x = await stubs.admit(user)
        await eventually(lambda: core.runs[x.run_id].state == JUDGING, what="X's release applied at the core")
        lose_commits(database_url, [x.job_id])
        await operator.SetUserQueueLimit(op_pb2.SetUserQueueLimitRequest(user_id=user, max_active=2), timeout=10)

        assert await eventually(lambda: _status(stubs, x.job_id), what="the lost judging run adopted") == S.JOB_STATUS_RUNNING
        kept = await stubs.job(y.job_id)
        assert (kept.status, kept.capacity_position) == (S.JOB_STATUS_PENDING, 0), kept
        overview = (await operator.GetOverview(op_pb2.GetOverviewRequest(), timeout=10)).overview
        assert overview.capacity_in_use == 3

        core.answer_faults.clear()
        await core.finish(w.run_id)
        await stubs.wait_for(w.job_id, S.JOB_STATUS_SUCCEEDED)
        await stubs.wait_for(y.job_id, S.JOB_STATUS_RUNNING, timeout=10)
        for job in (x, y):
            await core.finish(job.run_id)
            await stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED)
        assert orphans(core, database_url) == []
    finally:
        await _set_capacity(stubs, 0)
