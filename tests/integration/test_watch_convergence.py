"""I11 for every field a WatchJobs stream reports: changes a job's view shows without a status
change of its own (a refund, a release attempt, what a queued job waits behind, a place in the
fleet's line for capacity that another user's grant moved, the core's "not now") reach the
stream, so its last message for each job equals GetJob.

`estimated_start_time` is left out of the exact comparisons: it is an estimate made at each read,
from the read's own clock (docs/design.md, I11); the capacity tests compare it to GetJob's within
a quarter of the hour each place in line stands for.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterator

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service._gen.acurio.queue.v1.operator_service_pb2_grpc import OperatorServiceStub as Operator
from queue_service.dev.core import AnswerFault
from tests.harness import (
    S,
    Stubs,
    cancel_left_unanswered,
    end_failed_as_a_previous_version,
    error_info,
    eventually,
    insert_jobs,
    new_user,
    nothing_in_flight,
    one_running_job,
)


class Watched:
    """A WatchJobs stream read in the background: the last message it sent for each job."""

    def __init__(self) -> None:
        self.last: dict[str, job_pb2.Job] = {}
        # Jobs whose last message said they vanished.
        self.vanished: set[str] = set()
        self.snapshot_done = asyncio.Event()

    async def converged(self, stubs: Stubs, job_id: str) -> bool:
        """Whether the stream's last message for the job is what GetJob returns now."""
        sent = self.last.get(job_id)
        return sent is not None and _comparable(sent) == _comparable(await stubs.job(job_id))


def _comparable(job: job_pb2.Job) -> job_pb2.Job:
    copy = job_pb2.Job()
    copy.CopyFrom(job)
    copy.ClearField("estimated_start_time")
    return copy


@contextlib.asynccontextmanager
async def watching(stubs: Stubs, user: str) -> AsyncIterator[Watched]:
    stream = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user))
    watched = Watched()

    async def read() -> None:
        async for message in stream:
            if message.HasField("job"):
                watched.last[message.job.job_id] = message.job
                if message.vanished:
                    watched.vanished.add(message.job.job_id)
                else:
                    watched.vanished.discard(message.job.job_id)
            if message.snapshot_complete:
                watched.snapshot_done.set()

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(watched.snapshot_done.wait(), 10)
        yield watched
    finally:
        stream.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_a_refund_without_a_status_change_reaches_the_stream(services, database_url: str) -> None:
    """A cancel whose answer was lost, retried after the job had ended FAILED without the intent
    applied (a replica of the previous version, emulated with its statement): the retry refunds
    the job and changes nothing else, and the stream reports `refunded` as GetJob does."""
    core = await services.core()
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    service = await services.start(core)
    stubs, user, job = await one_running_job(service)
    async with watching(stubs, user) as watched:
        await cancel_left_unanswered(stubs, job.job_id, user)
        end_failed_as_a_previous_version(database_url, job.job_id)
        await eventually(lambda: watched.last[job.job_id].status == S.JOB_STATUS_FAILED, what="the failure on the stream")
        assert watched.last[job.job_id].refunded is False
        with pytest.raises(grpc.aio.AioRpcError) as retried:
            await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=10)
        assert error_info(retried.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_ALREADY_FINISHED")
        assert (await stubs.job(job.job_id)).refunded is True
        await eventually(lambda: watched.converged(stubs, job.job_id), timeout=5, what="the refund on the stream")


async def test_release_attempts_reach_the_stream(services, database_url: str) -> None:
    """A release the core keeps refusing as unavailable is retried with the same error each time:
    only `release_attempts` changes, and the stream follows it."""
    core = await services.core()
    core.fail_releases = True
    service = await services.start(core, release_backoff_max_seconds=0.2, release_lease_seconds=0.3)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    async with watching(stubs, user) as watched:
        job = await stubs.admit(user)
        await eventually(lambda: _attempts_at_least(stubs, job.job_id, 4), what="several release attempts")
        with psycopg.connect(database_url) as conn:
            # Holding the row stops further claims (they skip locked rows): the job stands still.
            conn.execute("SELECT 1 FROM analysis_jobs WHERE job_id = %s FOR UPDATE", (job.job_id,))
            await eventually(lambda: watched.converged(stubs, job.job_id), timeout=5, what="the attempts on the stream")
            conn.rollback()
        assert watched.last[job.job_id].release_attempts >= 4
        assert watched.last[job.job_id].status == S.JOB_STATUS_PENDING


async def _attempts_at_least(stubs: Stubs, job_id: str, attempts: int) -> bool:
    return (await stubs.job(job_id)).release_attempts >= attempts


async def test_a_retry_reaches_the_stream_of_the_job_it_retries(services) -> None:
    """An ended job never changes by itself again; an operator's RetryJob changes its view (it
    lists the retry in `retried_as_job_ids`), and the stream reports that as GetJob does, besides
    the new job."""
    service = await services.start()
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    async with watching(stubs, user) as watched:
        job = await stubs.admit(user)
        await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
        await stubs.complete(job.run_id, succeeded=False)
        await eventually(lambda: watched.converged(stubs, job.job_id), what="the failure on the stream")
        retry = (await Operator(stubs.channel).RetryJob(op_pb2.RetryJobRequest(job_id=job.job_id), timeout=20)).job
        await eventually(lambda: watched.converged(stubs, retry.job_id), what="the retry on the stream")
        await eventually(lambda: watched.converged(stubs, job.job_id), timeout=5, what="the retried job's lineage on the stream")
        assert list(watched.last[job.job_id].retried_as_job_ids) == [retry.job_id]


def _admitted_and_ended_an_hour_ago(database_url: str, job_id: str) -> None:
    """Past the job retention and the free-work limit's hour (the pruner keeps the hour's jobs)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE analysis_jobs SET create_time = create_time - interval '61 minutes', end_time = end_time - interval '61 minutes'"
            " WHERE job_id = %s",
            (job_id,),
        )


async def test_a_pruned_job_vanishes_from_the_stream(services, database_url: str) -> None:
    """The pruner deletes an ended job past its retention: GetJob answers NOT_FOUND, and the
    stream's last message for it says it vanished (only its ids set), as after a failover."""
    service = await services.start(job_retention_seconds=1.0)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    async with watching(stubs, user) as watched:
        job = await stubs.admit(user)
        kept = await stubs.admit(user)
        await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
        await stubs.complete(job.run_id)
        await eventually(lambda: watched.converged(stubs, job.job_id), what="the success on the stream")
        await asyncio.to_thread(_admitted_and_ended_an_hour_ago, database_url, job.job_id)
        assert (await service.app.sweeper.sweep_once()) is not None
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stubs.job(job.job_id)
        assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
        await eventually(lambda: job.job_id in watched.vanished, timeout=5, what="the vanished job on the stream")
        assert watched.last[job.job_id] == job_pb2.Job(job_id=job.job_id, user_id=user)
        # The job behind it, promoted meanwhile, is what GetJob says.
        await eventually(lambda: watched.converged(stubs, kept.job_id), timeout=5, what="the next job on the stream")


async def test_a_queued_job_stops_waiting_behind_a_job_that_ended_unsettled(services) -> None:
    """The job ahead gives up its release and ends FAILED, its run unsettled (the core's cancel
    answers are lost): no promotion follows, yet the queued job no longer waits behind it
    (`waiting_for_job_id`), and the stream says so."""
    core = await services.core()
    core.fail_releases = True
    core.answer_faults["CancelRun"] = AnswerFault("lose")
    service = await services.start(core, release_window_seconds=0.8, release_backoff_max_seconds=0.1)
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 2)
    first = await stubs.admit(user)
    second = await stubs.admit(user)
    assert second.waiting_for_job_id == first.job_id
    async with watching(stubs, user) as watched:
        assert watched.last[second.job_id].waiting_for_job_id == first.job_id
        await stubs.wait_for(first.job_id, S.JOB_STATUS_FAILED)
        now = await stubs.job(second.job_id)
        assert (now.status, now.waiting_for_job_id) == (S.JOB_STATUS_QUEUED, "")
        await eventually(lambda: watched.converged(stubs, second.job_id), timeout=5, what="the queued job on the stream")
        await eventually(lambda: watched.converged(stubs, first.job_id), timeout=5, what="the ended job on the stream")


@pytest.fixture
def fleet_capacity(database_url: str) -> Iterator[None]:
    """A test of the fleet's capacity starts, and leaves the module's database, with nothing in
    flight (the other tests leave runs judging or unsettled), the capacity unlimited and nothing
    learned of the core."""
    nothing_in_flight(database_url)
    yield
    nothing_in_flight(database_url)


_LONG_JUDGING = dt.timedelta(hours=1)


def judged_for_an_hour_recently(database_url: str) -> None:
    """The latest succeeded first-pass jobs judged for an hour each, so a job's estimate shows its
    place in line: an hour (over the capacity) per place ahead of it."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        insert_jobs(conn, [new_user() for _ in range(50)], status="succeeded")
        conn.execute(
            """UPDATE analysis_jobs SET end_time = clock_timestamp(), start_time = clock_timestamp() - %s
                WHERE status = 'succeeded' AND start_time IS NULL""",
            (_LONG_JUDGING,),
        )


def _estimate(job: job_pb2.Job) -> dt.datetime:
    assert job.HasField("estimated_start_time"), job
    return job.estimated_start_time.ToDatetime(tzinfo=dt.UTC)


async def test_a_waiting_jobs_place_in_line_follows_another_users_grant(services, database_url: str, fleet_capacity: None) -> None:
    """Capacity 1: A judging, B waiting first, C second; C's stream is on another replica than the
    one the core calls back. A ends and B is granted there, which changes no row of C, yet C's
    stream says what GetJob says: first in line, with the estimate of the first place."""
    judged_for_an_hour_recently(database_url)
    core = await services.core()
    granting = await services.start(core)  # the core's CompleteRun goes here: its completion grants
    other = await services.start(core)
    await Operator(granting.stubs.channel).SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=1), timeout=10)
    users = [new_user() for _ in range(3)]
    jobs = []
    for user in users:
        await granting.stubs.grant(user, 2)
        jobs.append(await granting.stubs.admit(user))
    first, second, third = jobs
    running = await granting.stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    async with watching(other.stubs, users[2]) as watched:
        assert watched.last[third.job_id].capacity_position == 2
        await core.finish(running.run_id)
        await granting.stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
        now = await other.stubs.job(third.job_id)
        assert (now.status, now.capacity_position) == (S.JOB_STATUS_PENDING, 1)
        await eventually(lambda: watched.converged(other.stubs, third.job_id), timeout=5, what="the new place on the stream")
        # The second place's estimate was an hour away; the first place's is the read's own moment.
        gap = abs(_estimate(watched.last[third.job_id]) - _estimate(await other.stubs.job(third.job_id)))
        assert gap < _LONG_JUDGING / 4, gap


async def test_the_cores_not_now_reaches_the_stream(services, database_url: str, fleet_capacity: None) -> None:
    """The core refuses a release (its ceiling): the job waits for capacity again, a change of its
    capacity columns only, and its stream, on the replica that did not release it, reports the
    place in line GetJob reports instead of the granted attempt."""
    judged_for_an_hour_recently(database_url)
    core = await services.core()
    core.judging_ceiling = 1
    # No probe of the core within the test (the refused job stays in line), and time for a release
    # that reaches the core late.
    settings = {"core_probe_interval_seconds": 600, "core_deadline_seconds": 5.0}
    releasing = await services.start(core, **settings)
    other = await services.start(core, **settings)
    blocker, user = new_user(), new_user()
    for someone in (blocker, user):
        await releasing.stubs.grant(someone, 2)
    running = await releasing.stubs.admit(blocker)
    await releasing.stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
    # The next release reaches the core a second late: the stream shows the granted attempt first.
    core.answer_faults["ReleaseRun"] = AnswerFault("late_arrival", seconds=1.0)
    async with watching(other.stubs, user) as watched:
        refused = await releasing.stubs.admit(user)  # its release is claimed by the replica that admits it
        assert (refused.status, refused.release_attempts, refused.capacity_position) == (S.JOB_STATUS_PENDING, 1, 0)
        await eventually(lambda: refused.job_id in watched.last, timeout=5, what="the granted attempt on the stream")
        assert core.refusals == 0, "the stream must show the attempt before the core refuses it"
        await eventually(lambda: _waiting_first(other.stubs, refused.job_id), timeout=5, what="the refusal")
        assert core.refusals == 1
        core.answer_faults.clear()
        await eventually(lambda: watched.converged(other.stubs, refused.job_id), timeout=5, what="the refusal on the stream")
        sent = watched.last[refused.job_id]
        assert (sent.status, sent.capacity_position, sent.release_attempts) == (S.JOB_STATUS_PENDING, 1, 1)
        assert abs(_estimate(sent) - _estimate(await other.stubs.job(refused.job_id))) < _LONG_JUDGING / 4

        # The blocker's run ends: the job is granted, released and runs, and the stream follows.
        await core.finish(running.run_id)
        await other.stubs.wait_for(refused.job_id, S.JOB_STATUS_RUNNING)
        await eventually(lambda: watched.converged(other.stubs, refused.job_id), timeout=5, what="the run on the stream")


async def _waiting_first(stubs: Stubs, job_id: str) -> bool:
    return (await stubs.job(job_id)).capacity_position == 1
