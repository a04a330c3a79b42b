"""The fleet-wide capacity at the core, through the public API against real PostgreSQL: jobs wait
for it with their place in line, two replicas never exceed it together (I12, counted at the dev
core), capacity goes to users in fair order (I13), the core's RESOURCE_EXHAUSTED is a place in
line rather than a failure, and the operator's change takes effect on every replica."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.core.v1 import run_service_pb2 as run_pb
from queue_service._gen.acurio.queue.v1 import (
    job_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    operator_service_pb2 as op_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    operator_service_pb2_grpc as op_grpc,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2 as queue_pb2,
)
from queue_service.dev.core import AnswerFault, DevCore
from tests.harness import ServiceFactory, Stubs, error_info, eventually, insert_jobs, new_user, nothing_in_flight

S = job_pb2


def _operator(stubs: Stubs) -> op_grpc.OperatorServiceStub:
    return op_grpc.OperatorServiceStub(stubs.channel)


@pytest.fixture(autouse=True)
def _fresh_fleet(database_url: str) -> None:
    """Tests of this module share a database: each starts with nothing in flight, unlimited."""
    nothing_in_flight(database_url)


async def _set_capacity(stubs: Stubs, capacity: int) -> op_pb2.SetCoreCapacityResponse:
    request = op_pb2.SetCoreCapacityRequest(capacity=capacity, unlimited=capacity == 0)
    return await _operator(stubs).SetCoreCapacity(request, timeout=10)


async def _overview(stubs: Stubs) -> op_pb2.Overview:
    return (await _operator(stubs).GetOverview(op_pb2.GetOverviewRequest(), timeout=10)).overview


async def _admitted(stubs: Stubs, users: list[str], *, jobs_each: int = 1) -> dict[str, list[job_pb2.Job]]:
    admitted: dict[str, list[job_pb2.Job]] = {}
    for user in users:
        await stubs.grant(user, jobs_each + 5)
        admitted[user] = [await stubs.admit(user) for _ in range(jobs_each)]
    return admitted


async def _judging_at(core: DevCore, count: int, *, timeout: float = 10) -> list[str]:
    """Waits until exactly `count` first-pass runs judge at the core; their run ids."""
    deadline = time.monotonic() + timeout
    while True:
        runs = [run_id for runs in core.judging_now.values() for run_id in runs]
        if len(runs) == count:
            return runs
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(runs)} runs judging at the core, expected {count}")
        await asyncio.sleep(0.02)


async def test_a_job_waits_for_capacity_with_its_place_and_starts_when_capacity_frees(service) -> None:
    stubs, core = service.stubs, service.core
    change = (await _set_capacity(stubs, 1)).change
    assert (change.setting, change.new_value, change.actor) == ("core_capacity", 1, "anonymous")
    first, second, third = new_user(), new_user(), new_user()
    jobs = await _admitted(stubs, [first, second, third])
    running = await stubs.wait_for(jobs[first][0].job_id, S.JOB_STATUS_RUNNING)
    await _judging_at(core, 1)

    waiting = [await stubs.job(jobs[user][0].job_id) for user in (second, third)]
    # Each holds its user's slot (PENDING) but waits for the core, in the fleet-wide order.
    assert [job.status for job in waiting] == [S.JOB_STATUS_PENDING, S.JOB_STATUS_PENDING]
    assert [job.capacity_position for job in waiting] == [1, 2]
    assert running.capacity_position == 0 and waiting[0].release_attempts == 0
    overview = await _overview(stubs)
    assert (overview.capacity_in_use, overview.capacity_limit) == (1, 1)
    assert (overview.capacity_waiting_jobs, overview.capacity_waiting_users) == (2, 2)
    assert overview.HasField("oldest_capacity_wait_time")

    # A delta re-check waits for a turn like any run (it never waits for its user's slot): its
    # user has no run in use, as few as the third user, and has no precedence of its own: the
    # third user has waited longer since her last start (she never started).
    finished = await core.finish(running.run_id)
    assert finished is not None
    base = finished.job
    assert base.status == S.JOB_STATUS_SUCCEEDED
    await stubs.wait_for(jobs[second][0].job_id, S.JOB_STATUS_RUNNING)
    delta = await stubs.admit(first, delta_of=base.job_id, uri="")
    assert (delta.status, delta.capacity_position) == (S.JOB_STATUS_PENDING, 2)
    assert core.runs[delta.run_id].state == run_pb.RUN_STATE_HELD
    assert (await _overview(stubs)).capacity_in_use == 1
    assert (await stubs.job(jobs[third][0].job_id)).capacity_position == 1

    # Capacity frees when the runs end: the third user's turn, then the delta's.
    second_job = await stubs.job(jobs[second][0].job_id)
    await core.finish(second_job.run_id)
    started = await stubs.wait_for(jobs[third][0].job_id, S.JOB_STATUS_RUNNING)
    assert started.capacity_position == 0
    assert (await stubs.job(delta.job_id)).capacity_position == 1
    await core.finish(started.run_id)
    await stubs.wait_for(delta.job_id, S.JOB_STATUS_RUNNING)
    assert (core.most_first_pass_judging, core.most_judging) == (1, 1)


async def test_capacity_goes_to_users_in_fair_order(service) -> None:
    """A user with five slots and five jobs waiting does not take the capacity from users with one
    job each: round-robin across users by their last turn (I13)."""
    stubs, core = service.stubs, service.core
    operator = _operator(stubs)
    await _set_capacity(stubs, 1)
    blocker, heavy = new_user(), new_user()
    lights = [new_user() for _ in range(3)]
    limit = await operator.SetUserQueueLimit(op_pb2.SetUserQueueLimitRequest(user_id=heavy, max_active=5), timeout=10)
    assert (limit.change.setting, limit.change.user_id, limit.change.new_value, limit.change.actor) == (
        "user_max_active",
        heavy,
        5,
        "anonymous",
    )
    await _admitted(stubs, [blocker])
    (blocking,) = await _judging_at(core, 1)
    # The heavy user's five jobs wait first (all five hold her slots), then one job of each other user.
    await _admitted(stubs, [heavy], jobs_each=5)
    await _admitted(stubs, lights)
    heavy_jobs = list(await stubs.jobs(heavy))
    assert [job.status for job in heavy_jobs] == [S.JOB_STATUS_PENDING] * 5
    assert sorted(job.capacity_position for job in heavy_jobs) == [1, 2, 3, 4, 5]

    # Two runs' worth of capacity at once: the heavy user waited longest and gets one; the second
    # goes to the next user in line, not to the heavy user's next job (her turn is now the newest).
    await _set_capacity(stubs, 3)
    pair = await _judging_at(core, 3)
    pair_users = {core.runs[run_id].user_id for run_id in pair if run_id != blocking}
    assert pair_users == {heavy, lights[0]}, pair_users

    # From here on, one run at a time: every other user is served before the heavy user's next job.
    await _set_capacity(stubs, 1)
    order = []
    for run_id in [blocking, *pair]:
        await core.finish(run_id)
    for _ in range(6):
        (run_id,) = await _judging_at(core, 1)
        order.append(core.runs[run_id].user_id)
        await core.finish(run_id)
    assert order == [lights[1], lights[2], heavy, heavy, heavy, heavy], order
    assert core.most_first_pass_judging == 3


async def test_a_user_with_runs_in_use_yields_to_users_with_fewer(service) -> None:
    """Max-min: a user with several slots gets another concurrent run only while no user with fewer
    runs in use waits, even when her job has waited longer and she never had a turn."""
    stubs, core = service.stubs, service.core
    heavy = new_user()
    lights = [new_user() for _ in range(3)]
    await _operator(stubs).SetUserQueueLimit(op_pb2.SetUserQueueLimitRequest(user_id=heavy, max_active=5), timeout=10)
    # Two runs of hers start while the capacity is unlimited (no turn of hers is recorded).
    await _admitted(stubs, [heavy], jobs_each=2)
    heavy_runs = await _judging_at(core, 2)
    await _set_capacity(stubs, 2)
    # Her three more jobs wait first, then one job of each other user.
    await stubs.grant(heavy, 5)
    for _ in range(3):
        await stubs.admit(heavy)
    await _admitted(stubs, lights)

    await _set_capacity(stubs, 3)
    await _judging_at(core, 3)
    assert core.start_order[-1] == lights[0]  # not her third job: she has two runs in use
    # One run ends at a time: a user with fewer runs in use goes first, else the longest waiting.
    light_run = next(run_id for run_id in core.judging_all if core.runs[run_id].user_id == lights[0])
    order = []
    for run_id in [heavy_runs[0], heavy_runs[1], light_run]:
        seen = len(core.start_order)
        await core.finish(run_id)
        order.append(await _next_start(core, seen))
    assert order == [lights[1], heavy, lights[2]], order
    assert core.most_first_pass_judging == 3


async def test_a_waiting_user_is_passed_over_at_most_once_by_each_other_user(services) -> None:
    """I13 exactly, through two replicas sharing a capacity of one: the eager user began to wait
    first, so she passes the patient user once; her next job (waiting since her run ended) does not
    pass her again, also while a queued job the patient user canceled still has its run held at
    the core (the core's answers to CancelRun are lost). That held run was never released: it
    takes no capacity and does not rank its user behind others."""
    core = await services.core()
    first, second = await services.start(core), await services.start(core)
    await _set_capacity(first.stubs, 1)
    blocker, eager, patient = new_user(), new_user(), new_user()
    for user in (blocker, eager, patient):
        await first.stubs.grant(user, 10)

    await first.stubs.admit(blocker)
    (blocking,) = await _judging_at(core, 1)
    eager_first = await first.stubs.admit(eager)
    patient_first = await second.stubs.admit(patient)
    patient_queued = await second.stubs.admit(patient)
    eager_second = await first.stubs.admit(eager)
    assert [(await second.stubs.job(job.job_id)).capacity_position for job in (eager_first, patient_first)] == [1, 2]
    assert (patient_queued.status, eager_second.status) == (S.JOB_STATUS_QUEUED, S.JOB_STATUS_QUEUED)

    # The eager user has waited longer: she goes first (one pass).
    seen = len(core.start_order)
    await core.finish(blocking)
    assert await _next_start(core, seen) == eager
    running = await first.stubs.wait_for(eager_first.job_id, S.JOB_STATUS_RUNNING)
    assert (await second.stubs.job(patient_first.job_id)).capacity_position == 1

    # The patient user cancels her queued job and the core's answer is lost: the job is canceled,
    # its held run unsettled until the core confirms.
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    canceled = (
        await second.stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=patient_queued.job_id, user_id=patient), timeout=10)
    ).job
    assert canceled.status == S.JOB_STATUS_CANCELED
    assert (await _overview(second.stubs)).capacity_in_use == 1  # the eager user's run only

    # Capacity frees; the eager user's next job begins to wait behind the patient user's.
    seen = len(core.start_order)
    await core.finish(running.run_id)
    assert await _next_start(core, seen) == patient
    started = await second.stubs.wait_for(patient_first.job_id, S.JOB_STATUS_RUNNING)
    waiting = await first.stubs.wait_for(eager_second.job_id, S.JOB_STATUS_PENDING)
    assert waiting.capacity_position == 1
    assert patient_queued.run_id not in {run_id for run_id, _ in core.release_log}  # never released
    core.answer_faults.clear()
    seen = len(core.start_order)
    await core.finish(started.run_id)
    assert await _next_start(core, seen) == eager
    assert core.start_order == [blocker, eager, patient, eager]
    assert core.most_first_pass_judging == 1


async def test_a_users_deltas_count_toward_her_rank_and_have_no_precedence(service) -> None:
    """Every run a user has at the core counts toward her place, re-checks included (max-min on
    all runs): a user with a re-check judging ranks behind a user with nothing in use; among users
    with equally few runs in use a waiting re-check has no precedence of its own: the user who has
    waited longest since her last start goes first. The core never judges more runs than the
    capacity, re-checks included (I12)."""
    stubs, core = service.stubs, service.core
    light, heavy, blocker = new_user(), new_user(), new_user()
    await _admitted(stubs, [blocker])
    await stubs.grant(light, 10)
    await stubs.grant(heavy, 10)
    # The light user's first job finishes while the capacity is unlimited: the base of re-checks.
    base = await stubs.admit(light)
    await _judging_at(core, 2)
    await core.finish(base.run_id)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_SUCCEEDED)
    for job in await stubs.jobs(blocker):
        await core.finish(job.run_id)
    await _judging_at(core, 0)

    await _set_capacity(stubs, 2)
    judging_delta = await stubs.admit(light, delta_of=base.job_id, uri="")  # granted at once
    await stubs.wait_for(judging_delta.job_id, S.JOB_STATUS_RUNNING)
    blocking = await stubs.admit(blocker)
    await stubs.wait_for(blocking.job_id, S.JOB_STATUS_RUNNING)
    light_waiting = await stubs.admit(light)
    heavy_waiting = await stubs.admit(heavy)
    waiting_delta = await stubs.admit(blocker, delta_of=(await _succeeded_base(stubs, core, blocker)).job_id, uri="")
    overview = await _overview(stubs)
    assert (overview.capacity_in_use, overview.capacity_waiting_jobs) == (2, 3), overview
    # heavy has nothing in use; blocker and light one run each, and light began to wait first:
    # blocker's re-check waits behind light's first-pass job.
    assert [(await stubs.job(job.job_id)).capacity_position for job in (heavy_waiting, light_waiting, waiting_delta)] == [1, 2, 3]
    # The re-check ends: light has nothing in use either, and has waited longer for her turn.
    seen = len(core.start_order)
    await core.finish(judging_delta.run_id)
    assert await _next_start(core, seen) == light
    assert [(await stubs.job(job.job_id)).capacity_position for job in (heavy_waiting, waiting_delta)] == [1, 2]
    # blocker's first-pass run ends: she and heavy have nothing in use, and heavy waited longer.
    seen = len(core.start_order)
    await core.finish(blocking.run_id)
    assert await _next_start(core, seen) == heavy
    assert (await stubs.job(waiting_delta.job_id)).capacity_position == 1
    await core.finish((await stubs.job(light_waiting.job_id)).run_id)
    await stubs.wait_for(waiting_delta.job_id, S.JOB_STATUS_RUNNING)
    assert core.most_judging == 2


@pytest.mark.parametrize(("capacity", "delta_price"), [(1, 0), (1, 1), (2, 0), (2, 1)])
async def test_a_user_re_checking_in_a_loop_never_passes_a_waiting_click(services, capacity: int, delta_price: int) -> None:
    """A user re-checks in a loop (each re-check admitted while her previous one judges) while
    another user's first-pass job waits for capacity: when her judging re-check ends, she has no
    run in use, as few as the waiting user, but her new re-check began to wait after the click, so
    the click takes the freed turn (a re-check has no precedence of its own, I13). With capacity 2
    a third user's run holds the other unit throughout. Free and paid re-checks alike."""
    core = await services.core()
    service = await services.start(core, delta_price=delta_price, max_free_admits_per_user_per_hour=10_000)
    stubs = service.stubs
    looper, clicker, holder = new_user(), new_user(), new_user()
    for user in (looper, clicker, holder):
        await stubs.grant(user, 10)
    base = await stubs.admit(looper)
    await _judging_at(core, 1)
    await core.finish(base.run_id)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_SUCCEEDED)
    await _set_capacity(stubs, capacity)
    if capacity == 2:
        await stubs.wait_for((await stubs.admit(holder)).job_id, S.JOB_STATUS_RUNNING)
    judging = await stubs.admit(looper, delta_of=base.job_id, uri="")
    await stubs.wait_for(judging.job_id, S.JOB_STATUS_RUNNING)
    click = await stubs.admit(clicker)
    assert (await stubs.job(click.job_id)).capacity_position == 1

    passes = 0
    for _ in range(3):
        waiting = await stubs.admit(looper, delta_of=base.job_id, uri="")
        assert (await stubs.job(waiting.job_id)).capacity_position == 2
        await core.finish(judging.run_id)
        await stubs.wait_for(judging.job_id, S.JOB_STATUS_SUCCEEDED)
        await eventually(lambda w=waiting: _started(stubs, click.job_id, w.job_id), what="the freed turn granted")
        if (await stubs.job(click.job_id)).capacity_position == 0:  # the click was granted
            break
        passes += 1
        judging = await stubs.wait_for(waiting.job_id, S.JOB_STATUS_RUNNING)
    assert passes == 0, f"the looping user's re-checks passed the waiting click {passes} times"
    await stubs.wait_for(click.job_id, S.JOB_STATUS_RUNNING)
    assert (await stubs.job(waiting.job_id)).capacity_position == 1
    assert core.most_judging == capacity


async def test_a_capacity_set_while_re_check_admits_are_in_flight_costs_one_run_past_it_per_admit(service) -> None:
    """The admit decides from the capacity it reads before CreateRun whether a re-check's run is
    created judging. Three re-check admits read it unlimited, their CreateRun answers come late,
    and the capacity is set to 1 meanwhile: all three commit RUNNING, their runs already judging
    (one past the new capacity per admit in flight, not one in all). Each counts in use: a
    first-pass job waits until all three have ended, then takes the capacity alone."""
    stubs, core = service.stubs, service.core
    users = [new_user() for _ in range(3)]
    clicker = new_user()
    bases = []
    for user in [*users, clicker]:
        await stubs.grant(user, 5)
    for user in users:
        base = await stubs.admit(user)
        await stubs.wait_for(base.job_id, S.JOB_STATUS_RUNNING)
        await core.finish(base.run_id)
        bases.append(await stubs.wait_for(base.job_id, S.JOB_STATUS_SUCCEEDED))
    core.answer_faults["CreateRun"] = AnswerFault("late", seconds=1.0)
    admits = [asyncio.ensure_future(stubs.admit(user, delta_of=base.job_id, uri="")) for user, base in zip(users, bases, strict=True)]
    await eventually(lambda: sum(run.first_pass is False for run in core.runs.values()) == 3, what="the three re-check runs created")
    await _set_capacity(stubs, 1)
    core.answer_faults.clear()
    deltas = await asyncio.gather(*admits)
    assert [delta.status for delta in deltas] == [S.JOB_STATUS_RUNNING] * 3
    assert core.most_judging == 3
    assert (await _overview(stubs)).capacity_in_use == 3

    click = await stubs.admit(clicker)
    for delta in deltas[:2]:
        await core.finish(delta.run_id)
        await stubs.wait_for(delta.job_id, S.JOB_STATUS_SUCCEEDED)
        assert (await stubs.job(click.job_id)).capacity_position == 1
    await core.finish(deltas[2].run_id)
    await stubs.wait_for(click.job_id, S.JOB_STATUS_RUNNING)
    assert core.first_pass_judging() == 1 and len(core.judging_all) == 1


async def _started(stubs: Stubs, *job_ids: str) -> bool:
    """Whether one of the jobs left the wait for capacity (granted)."""
    positions = [(await stubs.job(job_id)).capacity_position for job_id in job_ids]
    return 0 in positions


async def _succeeded_base(stubs: Stubs, core: DevCore, user: str) -> job_pb2.Job:
    """The user's most recent succeeded job (the base of a re-check)."""
    return next(job for job in await stubs.jobs(user) if job.status == S.JOB_STATUS_SUCCEEDED)


async def _next_start(core: DevCore, seen: int, timeout: float = 10) -> str:
    """The user of the first first-pass run to start judging after the first `seen` starts."""
    deadline = time.monotonic() + timeout
    while len(core.start_order) <= seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"no run started after the first {seen}")
        await asyncio.sleep(0.02)
    return core.start_order[seen]


async def test_a_completion_grants_the_capacity_it_freed_in_its_own_commit(service, database_url: str) -> None:
    """The completion that frees a run's capacity hands it to the next in line in the same
    transaction (no grant statement of its own after it): the next user's turn is written by the
    transaction that ended the finished job, and her job starts. The grant rides with the
    completion only when the capacity lock is free at that instant (`Store.end_runs_then_grant`);
    the dispatcher's own grant pass may hold it, and then the grant follows in a statement of its
    own, as designed (a pinned, loaded run met that once). So the crossing is tried up to three
    times and must happen; every try's next job must start either way."""
    stubs, core = service.stubs, service.core
    await _set_capacity(stubs, 1)
    written_by: list[tuple[str, str]] = []
    for _ in range(3):
        first, second = new_user(), new_user()
        jobs = await _admitted(stubs, [first, second])
        running = await stubs.wait_for(jobs[first][0].job_id, S.JOB_STATUS_RUNNING)
        await _judging_at(core, 1)
        assert (await stubs.job(jobs[second][0].job_id)).capacity_position == 1

        await core.finish(running.run_id)
        granted = await stubs.wait_for(jobs[second][0].job_id, S.JOB_STATUS_RUNNING)
        with psycopg.connect(database_url, autocommit=True) as conn:
            (ended_by,) = conn.execute("SELECT xmin::text FROM analysis_jobs WHERE job_id = %s", (running.job_id,)).fetchone()
            (turn_by,) = conn.execute("SELECT xmin::text FROM user_capacity_turns WHERE user_id = %s", (second,)).fetchone()
        written_by.append((ended_by, turn_by))
        assert core.most_first_pass_judging == 1
        if turn_by == ended_by:
            break
        # Free the capacity for the next try.
        await core.finish(granted.run_id)
        await stubs.wait_for(granted.job_id, S.JOB_STATUS_SUCCEEDED)
    assert written_by[-1][0] == written_by[-1][1], f"no try granted in the completion's commit (ended by, turn by): {written_by}"


async def test_a_completion_of_a_run_waiting_for_capacity_ends_nothing(service, database_url: str) -> None:
    """A job waiting for the fleet's capacity never had its run released: the core holds it, so a
    CompleteRun naming it (a confused or forged caller) is RUN_NOT_RELEASED, as for a QUEUED job.
    Ending the job would leave the held run at the core with no live job (I10) and charge her for
    work never done; instead the job keeps its place and runs in its turn."""
    stubs, core = service.stubs, service.core
    await _set_capacity(stubs, 1)
    first, second = new_user(), new_user()
    jobs = await _admitted(stubs, [first, second])
    running = await stubs.wait_for(jobs[first][0].job_id, S.JOB_STATUS_RUNNING)
    await _judging_at(core, 1)
    waiting = await stubs.job(jobs[second][0].job_id)
    assert (waiting.status, waiting.capacity_position, waiting.release_attempts) == (S.JOB_STATUS_PENDING, 1, 0)

    for succeeded in (True, False):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stubs.complete(waiting.run_id, succeeded=succeeded, refund=True)
        assert error_info(raised.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "RUN_NOT_RELEASED")
    still = await stubs.job(waiting.job_id)
    assert (still.status, still.capacity_position, still.refunded) == (S.JOB_STATUS_PENDING, 1, False)
    assert core.runs[waiting.run_id].state == run_pb.RUN_STATE_HELD

    # Its turn comes as before, and then its run completes as any run does.
    await core.finish(running.run_id)
    await stubs.wait_for(waiting.job_id, S.JOB_STATUS_RUNNING)
    await core.finish(waiting.run_id)
    ended = await stubs.wait_for(waiting.job_id, S.JOB_STATUS_SUCCEEDED)
    assert not ended.refunded
    with psycopg.connect(database_url, autocommit=True) as conn:
        entries = conn.execute("SELECT kind, amount FROM credit_ledger WHERE job_id = %s", (waiting.job_id,)).fetchall()
    assert entries == [("charge", -1)]


async def test_a_completion_never_waits_for_a_busy_capacity_lock(service) -> None:
    """While another transaction holds the capacity lock (a grant of another replica), a completion
    is applied at once and grants nothing itself; the capacity it freed is granted as soon as the
    lock is free, and never twice (the core sees one run at a time)."""
    stubs, core = service.stubs, service.core
    await _set_capacity(stubs, 1)
    first, second = new_user(), new_user()
    jobs = await _admitted(stubs, [first, second])
    running = await stubs.wait_for(jobs[first][0].job_id, S.JOB_STATUS_RUNNING)
    await _judging_at(core, 1)

    async with service.app.store.holding_capacity_lock():
        started = time.monotonic()
        finished = await core.finish(running.run_id)
        took = time.monotonic() - started
        assert finished is not None and finished.job.status == S.JOB_STATUS_SUCCEEDED
        await asyncio.sleep(0.3)
        waiting = await stubs.job(jobs[second][0].job_id)
        assert (waiting.status, waiting.capacity_position) == (S.JOB_STATUS_PENDING, 1)
    # Not held up by the lock (held for the whole block); well under the lock timeout (5 s).
    assert took < 2.0, took
    freed_at = time.monotonic()
    await stubs.wait_for(jobs[second][0].job_id, S.JOB_STATUS_RUNNING, timeout=10)
    # Granted once the lock was free, not on the dispatcher's timer pass (up to 5 s later).
    assert time.monotonic() - freed_at < 3.0
    assert core.most_first_pass_judging == 1


async def test_two_replicas_never_exceed_the_capacity_together(services) -> None:
    """Admits and completions spread over two `serve` processes: the core never sees more first-pass
    runs judging at once than the capacity (I12, counted at the core)."""
    core = await services.core(manual=False, judging_seconds=0.25)
    first = await services.start_process(core, QUEUE_CORE_CAPACITY="3", QUEUE_LOG_LEVEL="warning")
    second = await services.start_process(core, QUEUE_LOG_LEVEL="warning")
    core.set_callback_addr(f"{first.address},{second.address}")
    await _set_capacity(first.stubs, 3)
    users = [new_user() for _ in range(12)]
    jobs: list[job_pb2.Job] = []

    async def admit_all(stubs: Stubs, mine: list[str]) -> None:
        for user in mine:
            await stubs.grant(user, 5)
            jobs.extend([await stubs.admit(user), await stubs.admit(user)])

    await asyncio.gather(admit_all(first.stubs, users[::2]), admit_all(second.stubs, users[1::2]))
    for job in jobs:
        done = await first.stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED, S.JOB_STATUS_FAILED, timeout=60)
        assert done.status == S.JOB_STATUS_SUCCEEDED, done
    assert core.most_first_pass_judging == 3, core.most_first_pass_judging
    assert core.refusals == 0


async def test_the_cores_not_now_is_a_place_in_line_not_a_failure(services) -> None:
    """The core answers RESOURCE_EXHAUSTED beyond two runs judging: no job fails, none ages out of
    its release window, and the two replicas probe about once a second in all, not once per job."""
    core = await services.core(manual=False, judging_seconds=0.6)
    core.judging_ceiling = 2
    env = {"QUEUE_RELEASE_WINDOW_SECONDS": "2", "QUEUE_RELEASE_BACKOFF_MAX_SECONDS": "0.5", "QUEUE_LOG_LEVEL": "warning"}
    first = await services.start_process(core, **env)
    second = await services.start_process(core, **env)
    core.set_callback_addr(f"{first.address},{second.address}")
    users = [new_user() for _ in range(10)]
    started = time.monotonic()
    jobs = [
        job for stubs, user in zip([first.stubs, second.stubs] * 5, users, strict=True) for job in (await _admitted(stubs, [user]))[user]
    ]
    for job in jobs:
        done = await first.stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED, S.JOB_STATUS_FAILED, timeout=60)
        assert done.status == S.JOB_STATUS_SUCCEEDED, done.last_error
    elapsed = time.monotonic() - started
    # Ten jobs, two at a time, 0.6 s each: about 3 s, longer than the release window.
    assert elapsed > 2.5
    releases = len(core.release_log)
    # One accepted release per job, no retry of a job of its own: every other ReleaseRun was
    # refused, and the refusals are those of the first burst (the fleet did not know the ceiling
    # yet: at most all jobs but two) and about one probe per second after that, both replicas
    # together. (Measured: 14 releases, 4 refusals in 3.6 s; a retry per job every 0.5 s would be
    # dozens.)
    assert core.refusals >= 1
    assert releases - core.refusals == len(jobs), (releases, core.refusals)
    assert core.refusals <= len(jobs) - 2 + 1.5 * elapsed + 1, (core.refusals, elapsed)
    assert core.most_judging == 2
    overview = await _overview(second.stubs)
    assert overview.core_refusals == core.refusals


async def test_a_capacity_change_takes_effect_on_every_replica(services) -> None:
    core = await services.core()
    first = await services.start_process(core, QUEUE_LOG_LEVEL="warning")
    second = await services.start_process(core, QUEUE_LOG_LEVEL="warning")
    await _set_capacity(first.stubs, 1)
    users = [new_user() for _ in range(5)]
    await _admitted(second.stubs, users)
    await _judging_at(core, 1)
    assert (await _overview(second.stubs)).capacity_waiting_jobs == 4

    # Raised through one replica: releases of jobs admitted through the other follow at once.
    await _set_capacity(first.stubs, 3)
    runs = await _judging_at(core, 3)
    assert (await _overview(second.stubs)).capacity_limit == 3
    # Lowered through the other: nothing is stopped, but nothing starts until the runs in use fit.
    await _set_capacity(second.stubs, 2)
    await core.finish(runs[0])
    await asyncio.sleep(0.5)
    assert len(await _judging_at(core, 2)) == 2
    await core.finish(runs[1])
    await _judging_at(core, 2)  # one freed below the new capacity: the next in line starts
    assert core.most_first_pass_judging == 3
    changes = (await _operator(first.stubs).ListSettingChanges(op_pb2.ListSettingChangesRequest(), timeout=10)).changes
    assert [(c.setting, c.old_value, c.new_value, c.actor) for c in changes[:3]] == [
        ("core_capacity", 3, 2, "anonymous"),
        ("core_capacity", 1, 3, "anonymous"),
        ("core_capacity", 0, 1, "anonymous"),
    ]


def _users_waiting_for_capacity(conn: psycopg.Connection, *, users: int, capacity: int) -> list[str]:
    """`capacity` set, then one PENDING job in slot 1 for each of `users` new users, in order: each
    begins to wait for capacity as it is inserted. The users, first admitted first."""
    conn.execute(
        "INSERT INTO queue_capacity (capacity) VALUES (%(capacity)s) ON CONFLICT (singleton) DO UPDATE SET capacity = %(capacity)s",
        {"capacity": capacity},
    )
    waiting = [new_user() for _ in range(users)]
    insert_jobs(conn, waiting, status="pending", slot=1)
    return waiting


def test_a_grant_reads_the_next_in_line_not_every_waiting_job(database_url: str) -> None:
    """The grant's cost does not grow with the jobs waiting: with 300 users waiting (one slot each)
    it counts the runs in use of one candidate, not of every waiting job (migration 0014 counted
    and sorted all of them on every grant), and still serves the user who waited longest."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        users = _users_waiting_for_capacity(conn, users=300, capacity=1)
        with conn.transaction():
            conn.execute("SET LOCAL track_functions = 'all'")
            granted = conn.execute("SELECT user_id FROM queue_grant_capacity(30, 1800, 1, 10) WHERE row_kind = 'granted'").fetchall()
            (counted,) = conn.execute("SELECT pg_stat_get_xact_function_calls('queue_capacity_in_use_of_user'::regproc)").fetchone()
        assert granted == [(users[0],)]
        assert counted == 1


def test_a_grant_walks_the_turn_order_index_not_every_waiting_job_whatever_the_pauses_table_looks_like(database_url: str) -> None:
    """A grant reads the next in line from the turn-order index's start and the user's own other
    waiting jobs through her indexes: as the saturated capacity runs (200 users x 5 jobs, capacity
    20, a job ending and one granted at a time), one grant returns a few dozen index entries of the
    job table, not a few for every waiting job. The paused users are filtered by, never joined: the pauses
    table here was never analyzed (an empty one stays so), so the planner guesses it hundreds of
    rows, and a join hashed every waiting job against it at each step of the walk."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        (never_analyzed,) = conn.execute("SELECT reltuples < 0 FROM pg_class WHERE oid = 'queue_release_pauses'::regclass").fetchone()
        assert never_analyzed, "the pauses table must be one the planner never saw analyzed"
        users = _users_waiting_for_capacity(conn, users=200, capacity=20)
        with conn.cursor() as cursor:  # four more jobs each, queued behind the waiting one
            cursor.executemany(
                """INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price)
                   VALUES (gen_random_uuid(), %s, gen_random_uuid(), %s, '\\x00', 'queued', nextval('analysis_jobs_queue_seq'), 1)""",
                [(user, f"queued-{n}") for n in range(4) for user in users],
            )
        conn.execute("VACUUM (ANALYZE) analysis_jobs")  # as autovacuum keeps it in service
        conn.execute("SELECT * FROM queue_grant_capacity(30, 1800, 1, 20)").fetchall()

        def one_ends_and_her_next_waits() -> None:
            (job_id, user_id) = conn.execute(
                "SELECT job_id, user_id FROM analysis_jobs WHERE status = 'pending' AND capacity_token IS NOT NULL ORDER BY capacity_token LIMIT 1"
            ).fetchone()
            conn.execute("UPDATE analysis_jobs SET status = 'succeeded', end_time = clock_timestamp() WHERE job_id = %s", (job_id,))
            # Her next job is promoted into the freed slot, by the promotion the service runs.
            conn.execute("SELECT * FROM queue_promote_queued_jobs(%s, 1, 1800, 30)", (user_id,)).fetchall()

        entries = "SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid)) FROM pg_index WHERE indrelid = 'analysis_jobs'::regclass"
        returned = []
        for _ in range(30):  # past the fifth run a statement of the function may keep a generic plan
            one_ends_and_her_next_waits()
            with conn.transaction():
                (before,) = conn.execute(entries).fetchone()
                (granted,) = conn.execute("SELECT count(*) FROM queue_grant_capacity(30, 1800, 1, 1) WHERE row_kind = 'granted'").fetchone()
                (after,) = conn.execute(entries).fetchone()
            assert granted == 1
            returned.append(after - before)
    nothing_in_flight(database_url)
    # About 50, and one more per grant since the vacuum (entries of rows a grant changed, until
    # vacuumed); walking every waiting job through the join returned about 400.
    assert max(returned[10:]) < 150, f"index entries each grant returned, with about 180 jobs waiting: {[int(n) for n in returned]}"


def test_a_grant_takes_the_lowest_free_token_and_counts_only_the_runs_in_use(database_url: str) -> None:
    """A grant's token is the lowest one no run in use holds (a gap left by an ended run first,
    then the next above those held), and the count of what is in use is served by an index of the
    runs in use, not by the slot index and a filter over every job holding a slot (200 waiting here)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        _users_waiting_for_capacity(conn, users=203, capacity=4)

        def grant() -> tuple[str, int]:
            granted = "SELECT user_id FROM queue_grant_capacity(30, 1800, 1, 1) WHERE row_kind = 'granted'"
            (user_id,) = conn.execute(granted).fetchone()
            (token,) = conn.execute("SELECT capacity_token FROM analysis_jobs WHERE user_id = %s", (user_id,)).fetchone()
            return user_id, token

        holders = [grant() for _ in range(3)]
        assert [token for _, token in holders] == [1, 2, 3]
        conn.execute("UPDATE analysis_jobs SET status = 'succeeded', end_time = clock_timestamp() WHERE user_id = %s", (holders[1][0],))
        assert grant()[1] == 2  # the gap the ended run left
        conn.execute("UPDATE analysis_jobs SET status = 'succeeded', end_time = clock_timestamp() WHERE user_id = %s", (holders[0][0],))
        (in_use,) = conn.execute("SELECT queue_capacity_in_use()").fetchone()
        assert in_use == 2
        # This table is a few pages (a sequential scan would win): which index serves the count.
        conn.execute("ANALYZE analysis_jobs")
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                """EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
                   SELECT count(*) FROM analysis_jobs a
                    WHERE (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
                      AND a.slot IS NOT NULL
                      AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL)"""
            ).fetchall()
        )
        assert "analysis_jobs_first_pass_taking_capacity" in plan, plan
        assert "Rows Removed by Filter" not in plan, plan
        assert grant()[1] == 1  # the lowest gap, with 2 and 3 held
        assert grant()[1] == 4


async def test_a_job_waiting_for_capacity_that_its_user_cancels_ends_at_once_without_the_core(services, database_url: str) -> None:
    """Capacity 1, one run judging, two users waiting. The first waiting user cancels while the
    core's answers to CancelRun are lost: her run was never released, so the job ends CANCELED and
    refunded at once (no turn to wait for, nothing to ask the core first), and the next capacity
    goes to the other waiting user. Her held run is canceled at the core once it answers again."""
    service = await services.start(sweep_interval_seconds=0.5)
    stubs, core = service.stubs, service.core
    await _set_capacity(stubs, 1)
    judging_user, canceling, patient = new_user(), new_user(), new_user()
    jobs = await _admitted(stubs, [judging_user, canceling, patient])
    judging = await stubs.wait_for(jobs[judging_user][0].job_id, S.JOB_STATUS_RUNNING)
    waiting = jobs[canceling][0]
    assert (await stubs.job(waiting.job_id)).capacity_position == 1
    balance = await stubs.balance(canceling)

    core.answer_faults["CancelRun"] = AnswerFault("lose")
    canceled = await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=waiting.job_id, user_id=canceling), timeout=10)
    assert canceled.job.status == S.JOB_STATUS_CANCELED
    assert await stubs.balance(canceling) == balance + 1
    assert (await stubs.job(jobs[patient][0].job_id)).capacity_position == 1
    core.answer_faults.clear()
    await _run_canceled_at_core(core, waiting.run_id)

    await core.finish(judging.run_id)
    await stubs.wait_for(jobs[patient][0].job_id, S.JOB_STATUS_RUNNING)
    assert core.most_first_pass_judging == 1


async def test_a_waiting_job_left_with_a_recorded_cancel_is_ended_by_the_sweeper(services, database_url: str) -> None:
    """A cancel recorded on a job that then went back to wait for capacity (its release met the
    core at its capacity while the cancel's answer was lost) has no release due to apply it: the
    sweeper ends it, refunded, without waiting for a grant."""
    service = await services.start(sweep_interval_seconds=0.5)
    stubs, core = service.stubs, service.core
    await _set_capacity(stubs, 1)
    judging_user, canceling = new_user(), new_user()
    jobs = await _admitted(stubs, [judging_user, canceling])
    await stubs.wait_for(jobs[judging_user][0].job_id, S.JOB_STATUS_RUNNING)
    waiting = jobs[canceling][0]
    balance = await stubs.balance(canceling)
    with psycopg.connect(database_url, autocommit=True) as conn:
        recorded = conn.execute(
            "UPDATE analysis_jobs SET cancel_requested_at = clock_timestamp() WHERE job_id = %s AND capacity_token IS NULL",
            (waiting.job_id,),
        ).rowcount
    assert recorded == 1
    ended = await stubs.wait_for(waiting.job_id, S.JOB_STATUS_CANCELED, timeout=10)
    assert ended.status == S.JOB_STATUS_CANCELED
    assert await stubs.balance(canceling) == balance + 1
    await _run_canceled_at_core(core, waiting.run_id)
    assert core.most_first_pass_judging == 1


async def _run_canceled_at_core(core: DevCore, run_id: str, *, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while core.runs[run_id].state != run_pb.RUN_STATE_CANCELED:
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} is {run_pb.RunState.Name(core.runs[run_id].state)} at the core, expected CANCELED")
        await asyncio.sleep(0.05)


async def test_replicas_started_together_on_a_fresh_database_all_serve(postgres, template_database: str) -> None:  # type: ignore[no-untyped-def]
    """Two `serve` processes seeding one fresh database's capacity at once: the one whose seed
    waits for the other's (held open here so the race is certain) reads the committed capacity and
    serves, rather than dying at start-up."""
    name = f"t_fresh_fleet_{uuid.uuid4().hex[:6]}"
    postgres.execute_admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    database_url = postgres.dsn_for(name)
    factory = ServiceFactory(database_url)
    try:
        core = await factory.core()
        with psycopg.connect(database_url) as seeding:
            assert seeding.execute("SELECT count(*) FROM queue_capacity").fetchone() == (0,)
            seeding.execute("INSERT INTO queue_capacity (capacity, updated_by) VALUES (2, 'test:first-replica')")
            starting = [
                asyncio.create_task(factory.start_process(core, QUEUE_CORE_CAPACITY="2", QUEUE_MIGRATE_ON_START="true")) for _ in range(2)
            ]
            await eventually(lambda: _seeds_waiting(database_url) == 2, timeout=60, what="both replicas' seeds waiting for the first one's")
            seeding.commit()
        replicas = await asyncio.gather(*starting)
        assert all(replica.process.poll() is None for replica in replicas)
        for replica in replicas:
            await replica.stubs.grant(new_user(), 1)
    finally:
        await factory.close()
        postgres.execute_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _seeds_waiting(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            """SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%%queue_capacity%%'"""
        ).fetchone()
    return int(row[0]) if row else 0


async def test_a_user_looping_free_deltas_neither_exceeds_the_capacity_nor_starves_others(services) -> None:
    """Capacity 2, and a user with a finished job and no credits re-checks it in four loops (free,
    as fast as her delta limit allows) while another user clicks once: the core never judges more
    than two runs (re-checks included, I12), and the other user's job takes the next turn that
    frees (she has no run in use, the looping user has), not the end of the loop."""
    core = await services.core(judging_seconds=0.3, manual=False)
    # The free-work bound (USER_FREE_WORK_LIMIT) would end the loop early: the capacity is the subject here.
    service = await services.start(core, max_free_admits_per_user_per_hour=10_000)
    stubs = service.stubs
    looper, clicker = new_user(), new_user()
    await stubs.grant(looper, 1)
    base = await stubs.wait_for((await stubs.admit(looper)).job_id, S.JOB_STATUS_SUCCEEDED)
    assert await stubs.balance(looper) == 0
    await _set_capacity(stubs, 2)
    # The loops go on until the other user's job has started and each has re-checked twice more
    # (a slow machine only makes them longer), or at the latest for a minute: a job that waited
    # for the loops to end would start after that minute, with no re-check released after it.
    give_up_at = time.monotonic() + 60
    her_job_started = asyncio.Event()
    rechecks: list[str] = []

    async def recheck_in_a_loop() -> None:
        after_her_start = 0
        while time.monotonic() < give_up_at and after_her_start < 2:
            try:
                delta = await _admit_answered(stubs, looper, delta_of=base.job_id, uri="")
            except grpc.aio.AioRpcError as refused:
                # Her limit, or her queue busy with her other loops (LOCK_TIMEOUT: retry, as a caller does).
                assert error_info(refused)[1] in ("USER_DELTA_LIMIT", "LOCK_TIMEOUT"), error_info(refused)
                await asyncio.sleep(0.05)
                continue
            rechecks.append(delta.run_id)
            after_her_start += her_job_started.is_set()
            await stubs.wait_for(delta.job_id, S.JOB_STATUS_SUCCEEDED, timeout=30)

    loops = [asyncio.create_task(recheck_in_a_loop()) for _ in range(4)]
    await asyncio.sleep(1.5)
    await stubs.grant(clicker, 1)
    clicked = await _admit_answered(stubs, clicker)
    clicked_at = time.monotonic()
    started = await stubs.wait_for(clicked.job_id, S.JOB_STATUS_RUNNING, S.JOB_STATUS_SUCCEEDED, timeout=60)
    her_job_started.set()
    await asyncio.gather(*loops)
    released_at: dict[str, float] = {}
    for run_id, at in core.release_log:
        released_at.setdefault(run_id, at)  # the first ReleaseRun of each run
    assert started.run_id in released_at
    # Re-checks released after the click and before it: at most the grants already made then.
    passed_by = [run_id for run_id in rechecks if clicked_at < released_at.get(run_id, 0) < released_at[started.run_id]]
    assert len(passed_by) <= 2, passed_by
    assert any(released_at.get(run_id, 0) > released_at[started.run_id] for run_id in rechecks), (
        "the other user's job waited for the loop to end"
    )
    assert len(rechecks) >= 8, "the loop re-checked too little to prove anything"
    assert core.most_judging == 2


async def _admit_answered(stubs: Stubs, user_id: str, **request: Any) -> job_pb2.Job:
    """Admit, asked again with the same key while its answer is OUTCOME_UNKNOWN (the commit's
    outcome not confirmed in time, as on an overloaded machine), as the contract tells a caller:
    the retry returns the job if the first try was admitted, and admits it if not, so every
    admitted job is known to the test. Any other refusal is raised."""
    key = uuid.uuid4().hex
    for _ in range(5):
        try:
            return await stubs.admit(user_id, key, **request)
        except grpc.aio.AioRpcError as refused:
            if error_info(refused)[1] != "OUTCOME_UNKNOWN":
                raise
    raise AssertionError(f"five tries of the same admit all answered OUTCOME_UNKNOWN ({user_id})")


def test_a_refused_release_gives_back_only_its_own_turn(database_url: str) -> None:
    """A user with two slots is granted twice (her second grant after another user's); the core then
    refuses her first release. Her turn goes back only while the refused grant's turn is still her
    latest: the later turn she got through her other slot stays, and the refused job waits behind
    it (it used to erase that turn, putting her ahead of users she had been served before, I13)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO queue_capacity (capacity) VALUES (10) ON CONFLICT (singleton) DO UPDATE SET capacity = 10")
        two_slots, other = new_user(), new_user()
        insert_jobs(conn, [two_slots], status="pending", slot=1)
        insert_jobs(conn, [other], status="pending", slot=1)
        insert_jobs(conn, [two_slots], status="pending", slot=2, key="k2")

        def grant() -> tuple[str, str, int]:
            return conn.execute(
                "SELECT user_id, job_id::text, release_attempts FROM queue_grant_capacity(30, 1800, 1, 1) WHERE row_kind = 'granted'"
            ).fetchone()

        first = grant()
        assert [first[0], grant()[0]] == [two_slots, other]
        second = grant()
        assert second[0] == two_slots
        (latest,) = conn.execute("SELECT last_turn_at FROM user_capacity_turns WHERE user_id = %s", (two_slots,)).fetchone()
        conn.execute("SELECT * FROM queue_capacity_refused(%s, %s, 1)", (first[1], first[2]))
        assert conn.execute("SELECT last_turn_at FROM user_capacity_turns WHERE user_id = %s", (two_slots,)).fetchone() == (latest,)
        (key,) = conn.execute("SELECT capacity_turn_key FROM analysis_jobs WHERE job_id = %s", (first[1],)).fetchone()
        assert key == latest
