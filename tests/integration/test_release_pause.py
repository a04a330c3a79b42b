"""The operator's pause of releases (OperatorService.SetReleasesPaused), fleet-wide and per user,
through the public API against real PostgreSQL and the dev core: while paused no held run is
released (first-pass jobs and delta re-checks alike, with no capacity set), admits are still
accepted and charged, a release falling due goes back to waiting, a resume releases at once (no
sweeper runs in these tests), every replica obeys it, and each change is recorded with its actor.
Also SetCoreCapacity's capacity 0, which no longer silently means unlimited."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import grpc
import psycopg
import pytest

from queue_service import telemetry
from queue_service._gen.acurio.core.v1 import run_service_pb2 as run_pb
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.dev.core import AnswerFault, DevCore
from queue_service.engine.maintenance.metrics_reader import MetricsReader
from queue_service.model import ClaimedRelease, ReleaseResult
from tests.harness import Stubs, error_info, eventually, new_user, nothing_in_flight

S = job_pb2
# Long enough for a release handed over at the admit, or a grant woken by it, to reach the core.
SETTLE_SECONDS = 0.5


def _operator(stubs: Stubs) -> op_grpc.OperatorServiceStub:
    return op_grpc.OperatorServiceStub(stubs.channel)


@pytest.fixture(autouse=True)
def _fresh_fleet(database_url: str) -> None:
    """Tests of this module share a database: each starts with nothing in flight, nothing paused."""
    nothing_in_flight(database_url)


async def _pause(stubs: Stubs, paused: bool, user_id: str = "", note: str = "") -> op_pb2.SetReleasesPausedResponse:
    request = op_pb2.SetReleasesPausedRequest(paused=paused, user_id=user_id, note=note)
    return await _operator(stubs).SetReleasesPaused(request, timeout=10)


async def _overview(stubs: Stubs) -> op_pb2.Overview:
    return (await _operator(stubs).GetOverview(op_pb2.GetOverviewRequest(), timeout=10)).overview


def _released(core: DevCore, job: job_pb2.Job) -> bool:
    return any(run_id == job.run_id for run_id, _ in core.release_log)


async def _held_back(stubs: Stubs, core: DevCore, job: job_pb2.Job) -> job_pb2.Job:
    """The job, checked PENDING and waiting, its run still held at the core and never released."""
    await asyncio.sleep(SETTLE_SECONDS)
    now = await stubs.job(job.job_id)
    assert now.status == S.JOB_STATUS_PENDING, now
    assert now.capacity_position > 0, now
    assert core.runs[job.run_id].state == run_pb.RUN_STATE_HELD
    assert not _released(core, job)
    return now


async def test_a_fleet_pause_holds_every_release_admits_go_on_and_a_resume_releases_at_once(service) -> None:
    stubs, core = service.stubs, service.core
    user, other = new_user(), new_user()
    await stubs.grant(user, 10)
    await stubs.grant(other, 10)
    base = await stubs.admit(user)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_RUNNING)
    await core.finish(base.run_id)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_SUCCEEDED)

    paused = await _pause(stubs, True, note="core upgrade")
    assert (paused.change.setting, paused.change.user_id, paused.change.old_value, paused.change.new_value) == ("releases_paused", "", 0, 1)
    assert (paused.change.actor, paused.change.note) == ("anonymous", "core upgrade")
    assert paused.overview.releases_paused and paused.overview.releases_paused_by == "anonymous"
    # Pausing what is paused changes nothing and records nothing.
    assert not (await _pause(stubs, True)).HasField("change")

    # Admits are accepted and charged: a first-pass job takes its slot, a delta re-check waits too.
    first = await stubs.admit(other)
    queued = await stubs.admit(other)
    delta = await stubs.admit(user, delta_of=base.job_id, uri="")
    assert (first.status, queued.status, delta.status) == (S.JOB_STATUS_PENDING, S.JOB_STATUS_QUEUED, S.JOB_STATUS_PENDING)
    assert await stubs.balance(other) == 10 - first.price - queued.price
    for job in (first, delta):
        await _held_back(stubs, core, job)
    overview = await _overview(stubs)
    assert (overview.releases_paused, overview.releases_paused_by, overview.releases_paused_note) == (True, "anonymous", "core upgrade")
    assert overview.HasField("releases_paused_since") and overview.paused_users == 0
    # The sweeper's metrics pass reports the pause on the capacity gauge.
    async with service.app.store.statements() as db:
        await MetricsReader().find(db)
    assert (telemetry.metrics.capacity["fleet_paused"], telemetry.metrics.capacity["paused_users"]) == (1, 0)

    resumed = await _pause(stubs, False, note="upgrade done")
    assert (resumed.change.old_value, resumed.change.new_value, resumed.change.note) == (1, 0, "upgrade done")
    assert not resumed.overview.releases_paused and not resumed.overview.HasField("releases_paused_since")
    # No sweeper runs here: the resume itself grants the held runs.
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING, timeout=3)
    await stubs.wait_for(delta.job_id, S.JOB_STATUS_RUNNING, timeout=3)

    changes = (await _operator(stubs).ListSettingChanges(op_pb2.ListSettingChangesRequest(page_size=2), timeout=10)).changes
    assert [(c.setting, c.user_id, c.new_value, c.actor, c.note) for c in changes] == [
        ("releases_paused", "", 0, "anonymous", "upgrade done"),
        ("releases_paused", "", 1, "anonymous", "core upgrade"),
    ]


async def test_a_users_pause_holds_only_her_runs_and_shows_in_her_settings(service) -> None:
    stubs, core = service.stubs, service.core
    paused_user, other = new_user(), new_user()
    for user in (paused_user, other):
        await stubs.grant(user, 5)
    change = (await _pause(stubs, True, user_id=paused_user, note="abuse review")).change
    assert (change.setting, change.user_id, change.new_value) == ("releases_paused", paused_user, 1)

    held = await stubs.admit(paused_user)
    free = await stubs.admit(other)
    await stubs.wait_for(free.job_id, S.JOB_STATUS_RUNNING)
    await _held_back(stubs, core, held)
    settings = await _operator(stubs).GetUserSettings(op_pb2.GetUserSettingsRequest(user_id=paused_user), timeout=10)
    assert (settings.releases_paused, settings.releases_paused_by, settings.releases_paused_note) == (True, "anonymous", "abuse review")
    assert (settings.max_active, settings.max_active_is_default, settings.fleet_releases_paused) == (1, True, False)
    overview = await _overview(stubs)
    assert (overview.releases_paused, overview.paused_users) == (False, 1)

    await _pause(stubs, False, user_id=paused_user)
    await stubs.wait_for(held.job_id, S.JOB_STATUS_RUNNING, timeout=3)
    settings = await _operator(stubs).GetUserSettings(op_pb2.GetUserSettingsRequest(user_id=paused_user), timeout=10)
    assert not settings.releases_paused and not settings.HasField("releases_paused_since")


async def test_no_start_is_estimated_for_a_job_held_by_a_pause(service) -> None:
    """A queued job's `estimated_start_time` is left out while its releases are paused, on GetJob
    and ListJobs: her own pause leaves out only hers, the fleet's everyone's; a resume brings it
    back (a pause is read with the capacity's state, within a second)."""
    stubs, core = service.stubs, service.core
    paused_user, other = new_user(), new_user()
    queued: dict[str, job_pb2.Job] = {}
    for user in (paused_user, other):
        await stubs.grant(user, 10)
        # A judged job gives the estimates their mean judging time; then one runs and one waits.
        judged = await stubs.wait_for((await stubs.admit(user)).job_id, S.JOB_STATUS_RUNNING)
        await core.finish(judged.run_id)
        await stubs.wait_for(judged.job_id, S.JOB_STATUS_SUCCEEDED)
        await stubs.wait_for((await stubs.admit(user)).job_id, S.JOB_STATUS_RUNNING)
        queued[user] = await stubs.admit(user)
        assert queued[user].status == S.JOB_STATUS_QUEUED

    async def estimated(user: str) -> tuple[bool, bool]:
        """Whether GetJob and ListJobs give the user's queued job an estimate."""
        listed = {job.job_id: job for job in await stubs.jobs(user)}
        return (
            (await stubs.job(queued[user].job_id)).HasField("estimated_start_time"),
            listed[queued[user].job_id].HasField("estimated_start_time"),
        )

    async def shown(expected: dict[str, bool]) -> bool:
        return [await estimated(user) for user in expected] == [(want, want) for want in expected.values()]

    # The mean judging time is cached for ten seconds.
    await eventually(lambda: shown({paused_user: True, other: True}), timeout=15, what="estimates for both users")
    await _pause(stubs, True, user_id=paused_user, note="abuse review")
    await eventually(lambda: shown({paused_user: False, other: True}), timeout=5, what="no estimate for the paused user only")
    await _pause(stubs, True, note="core upgrade")
    await eventually(lambda: shown({paused_user: False, other: False}), timeout=5, what="no estimate while the fleet is paused")
    await _pause(stubs, False)
    await eventually(lambda: shown({paused_user: False, other: True}), timeout=5, what="the fleet resumed, the user still paused")
    await _pause(stubs, False, user_id=paused_user)
    await eventually(lambda: shown({paused_user: True, other: True}), timeout=5, what="estimates back after both resumes")


def _retry_held(database_url: str, job_id: str) -> bool:
    """Whether the job's release retry is held by a pause with its capacity kept: PENDING, no
    release due, not waiting for capacity."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            """SELECT status = 'pending' AND next_release_at IS NULL
                      AND (capacity_wait_since IS NULL OR capacity_token IS NOT NULL)
                 FROM analysis_jobs WHERE job_id = %s""",
            (job_id,),
        ).fetchone()
    return bool(row and row[0])


async def test_a_retry_falling_due_while_paused_is_held_with_the_jobs_capacity(services, database_url: str) -> None:
    """A release the core did not answer is retried; paused meanwhile, the retry is not sent. The
    unanswered release may have been applied, so the job does not go back to waiting: it stays
    PENDING with no place in line (a pause holds releases, never the count), and a resume
    releases it at once (its window from then)."""
    core = await services.core()
    service = await services.start(core, release_backoff_max_seconds=0.2)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 5)
    core.fail_releases = True
    job = await stubs.admit(user)
    await eventually(lambda: len(core.release_log) >= 2, what="the release retried")
    await _pause(stubs, True)
    await eventually(lambda: _retry_held(database_url, job.job_id), timeout=5, what="the retry held")
    core.fail_releases = False
    sent = len(core.release_log)
    await asyncio.sleep(SETTLE_SECONDS)
    held = await stubs.job(job.job_id)
    assert (held.status, held.capacity_position, len(core.release_log)) == (S.JOB_STATUS_PENDING, 0, sent)
    await _pause(stubs, False)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING, timeout=3)


async def test_a_claim_that_waited_for_a_place_in_flight_is_not_sent_once_paused(services, database_url: str) -> None:
    """The dispatcher holds a claim back while its releases in flight are at their bound (up to a
    core deadline each): a pause committed meanwhile keeps it from the core. Here the claim is the
    retry of a release the core did not answer, attempted as the dispatcher attempts one that
    waited for a place: the first attempt may have been applied, so the job keeps its capacity
    (no place in line) and only its retry waits for the resume."""
    core = await services.core()
    service = await services.start(core, release_backoff_max_seconds=600)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 5)
    core.fail_releases = True
    job = await stubs.admit(user)
    await eventually(lambda: len(core.release_log) == 1, what="the first release refused")
    core.fail_releases = False
    await _pause(stubs, True, user_id=user)
    pending = await stubs.job(job.job_id)
    assert (pending.status, pending.capacity_position) == (S.JOB_STATUS_PENDING, 0)

    claim = ClaimedRelease(uuid.UUID(job.job_id), user, uuid.UUID(job.run_id), attempt=pending.release_attempts + 1, waited_for_a_slot=True)
    _claim_next_attempt(database_url, job.job_id)
    assert await service.app.releases.release(claim) is ReleaseResult.PAUSED
    await asyncio.sleep(SETTLE_SECONDS)
    held = await stubs.job(job.job_id)
    assert (held.status, len(core.release_log), core.runs[job.run_id].state) == (S.JOB_STATUS_PENDING, 1, run_pb.RUN_STATE_HELD)
    assert held.capacity_position == 0 and _retry_held(database_url, job.job_id)
    await _pause(stubs, False, user_id=user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING, timeout=3)


def _claim_next_attempt(database_url: str, job_id: str) -> None:
    """Claims the job's retry as the dispatcher's claim of a due release does (its attempt counted)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE analysis_jobs SET release_attempts = release_attempts + 1, next_release_at = clock_timestamp() + interval '15 seconds' WHERE job_id = %s",
            (job_id,),
        )


async def test_a_granted_claim_never_sent_goes_back_to_waiting_once_paused(service, database_url: str) -> None:
    """Capacity 1, one run judging, a second user's job waiting. The capacity is raised behind the
    replicas' backs and this replica's grant claims the waiting job's release; a pause of her
    releases commits before the claim is sent (it waited for a place in flight). Nothing was sent
    since its grant: the job goes back to waiting, its capacity given back, and the resume's grant
    releases it."""
    stubs, core = service.stubs, service.core
    await _operator(stubs).SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=1), timeout=10)
    judging_user, waiting_user = new_user(), new_user()
    await stubs.grant(judging_user, 5)
    await stubs.grant(waiting_user, 5)
    judging = await stubs.wait_for((await stubs.admit(judging_user)).job_id, S.JOB_STATUS_RUNNING)
    waiting = await stubs.admit(waiting_user)
    assert (await stubs.job(waiting.job_id)).capacity_position == 1
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE queue_capacity SET capacity = 2")
    grant = await service.app.releases.grant_capacity(max_grants=1)
    ((claim, _waited),) = grant.claims
    assert claim.job_id == uuid.UUID(waiting.job_id)
    assert (await _overview(stubs)).capacity_in_use == 2
    await _pause(stubs, True, user_id=waiting_user)

    assert await service.app.releases.release(dataclasses.replace(claim, waited_for_a_slot=True)) is ReleaseResult.PAUSED
    back = await stubs.job(waiting.job_id)
    assert (back.status, back.capacity_position) == (S.JOB_STATUS_PENDING, 1)
    assert (await _overview(stubs)).capacity_in_use == 1
    assert not _released(core, waiting)
    await _pause(stubs, False, user_id=waiting_user)
    await stubs.wait_for(waiting.job_id, S.JOB_STATUS_RUNNING, timeout=3)
    assert judging.status == S.JOB_STATUS_RUNNING


@pytest.mark.parametrize("scope", ["user", "fleet"])
async def test_a_pause_never_takes_a_run_the_core_may_judge_out_of_the_capacity(services, scope: str) -> None:
    """Capacity 1. A's job is granted and the core applies its release, but the answer is lost, so
    the release backs off to retry. The operator pauses A's releases (or the fleet's); the retry
    falls due while paused. The job keeps its capacity (its run judges at the core): B's job waits
    behind it, never granted while A's run judges (I12), and A's cancel asks the core (it is not a
    job waiting for capacity, ended without the core). After the pause, B takes the freed capacity."""
    core = await services.core()
    service = await services.start(core, release_backoff_max_seconds=0.3)
    stubs = service.stubs
    await _operator(stubs).SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=1), timeout=10)
    a, b = new_user(), new_user()
    await stubs.grant(a, 5)
    await stubs.grant(b, 5)
    core.answer_faults["ReleaseRun"] = AnswerFault("lose")
    job_a = await stubs.admit(a)
    await eventually(lambda: core.runs[job_a.run_id].state == run_pb.RUN_STATE_JUDGING, what="A's release applied at the core")
    await _pause(stubs, True, user_id=a if scope == "user" else "")
    job_b = await stubs.admit(b)
    # The retries that fall due meanwhile are held (each lost answer backs off at most 0.3 s).
    retried = len(core.release_log)
    await asyncio.sleep(1.0)
    assert len(core.release_log) <= retried + 1
    core.answer_faults.clear()
    if scope == "fleet":
        await _pause(stubs, False)
        await stubs.wait_for(job_a.job_id, S.JOB_STATUS_RUNNING, timeout=3)
    await asyncio.sleep(SETTLE_SECONDS)
    a_now, b_now = await stubs.job(job_a.job_id), await stubs.job(job_b.job_id)
    assert a_now.capacity_position == 0, a_now
    assert (b_now.status, b_now.capacity_position) == (S.JOB_STATUS_PENDING, 1), b_now
    assert (await _overview(stubs)).capacity_in_use == 1
    assert core.most_first_pass_judging == 1 and not _released(core, job_b)

    canceled = await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job_a.job_id, user_id=a), timeout=10)
    assert canceled.job.status == S.JOB_STATUS_CANCELED
    assert core.runs[job_a.run_id].state == run_pb.RUN_STATE_CANCELED
    await stubs.wait_for(job_b.job_id, S.JOB_STATUS_RUNNING, timeout=5)
    assert core.most_first_pass_judging == 1


async def test_every_replica_obeys_a_pause_made_through_another(services) -> None:
    core = await services.core()
    first = await services.start_process(core, QUEUE_LOG_LEVEL="warning")
    second = await services.start_process(core, QUEUE_LOG_LEVEL="warning")
    await _pause(first.stubs, True, note="maintenance")
    users = [new_user() for _ in range(3)]
    jobs = []
    for user in users:
        await second.stubs.grant(user, 5)
        jobs.append(await second.stubs.admit(user))
    for job in jobs:
        await _held_back(second.stubs, core, job)
    assert (await _overview(second.stubs)).releases_paused

    await _pause(first.stubs, False)
    for job in jobs:
        await second.stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING, timeout=3)


async def test_bad_pause_requests_are_named(service) -> None:
    for request, field in [
        (op_pb2.SetReleasesPausedRequest(paused=True, user_id="x" * 200), "user_id"),
        (op_pb2.SetReleasesPausedRequest(paused=True, note="n" * 513), "note"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _operator(service.stubs).SetReleasesPaused(request, timeout=10)
        code, reason, _, violations = error_info(raised.value)
        assert (code, reason, [f for f, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", [field])


async def test_capacity_zero_is_refused_unless_unlimited_is_asked_for(service) -> None:
    operator = _operator(service.stubs)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=0), timeout=10)
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, [f for f, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", ["capacity"])
    assert "SetReleasesPaused" in violations[0][1] and "unlimited" in violations[0][1]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=5, unlimited=True), timeout=10)
    assert error_info(raised.value)[3][0][0] == "capacity"

    limited = await operator.SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=4), timeout=10)
    assert (limited.change.new_value, limited.overview.capacity_limit) == (4, 4)
    unlimited = await operator.SetCoreCapacity(op_pb2.SetCoreCapacityRequest(unlimited=True), timeout=10)
    assert (unlimited.change.old_value, unlimited.change.new_value, unlimited.overview.capacity_limit) == (4, 0, 0)


async def test_a_paused_users_waiting_jobs_are_numbered_after_everyone_elses(service) -> None:
    """Capacity 1, one run judging; P's job waits first, O's second. Paused, P's job is passed over
    by every grant, so the line numbers it after O's: O shows 1 and is granted next, P shows 2
    (with no estimate). Resumed, P's earlier wait puts her first again."""
    stubs, core = service.stubs, service.core
    await _operator(stubs).SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=1), timeout=10)
    judging_user, paused_user, other = new_user(), new_user(), new_user()
    for user in (judging_user, paused_user, other):
        await stubs.grant(user, 5)
    judging = await stubs.wait_for((await stubs.admit(judging_user)).job_id, S.JOB_STATUS_RUNNING)
    paused_job = await stubs.admit(paused_user)
    other_job = await stubs.admit(other)
    assert [(await stubs.job(job.job_id)).capacity_position for job in (paused_job, other_job)] == [1, 2]

    await _pause(stubs, True, user_id=paused_user)
    assert [(await stubs.job(job.job_id)).capacity_position for job in (paused_job, other_job)] == [2, 1]

    async def no_estimate() -> bool:  # the pause is read with the capacity's state, within a second
        return not (await stubs.job(paused_job.job_id)).HasField("estimated_start_time")

    await eventually(no_estimate, timeout=5, what="no estimate for the paused user's job")
    await _pause(stubs, False, user_id=paused_user)
    assert [(await stubs.job(job.job_id)).capacity_position for job in (paused_job, other_job)] == [1, 2]

    await _pause(stubs, True, user_id=paused_user)
    await core.finish(judging.run_id)
    await stubs.wait_for(other_job.job_id, S.JOB_STATUS_RUNNING)
    assert (await stubs.job(paused_job.job_id)).capacity_position == 1
