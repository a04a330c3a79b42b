"""I11 for every field a WatchJobs stream reports: changes a job's view shows without a status
change of its own (a refund, a release attempt, what a queued job waits behind) reach the stream,
so its last message for each job equals GetJob.

`estimated_start_time` is left out of the comparisons: it is an estimate made at each read, from
the read's own clock (docs/design.md, I11).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.dev.core import AnswerFault
from tests.harness import (
    S,
    Stubs,
    cancel_left_unanswered,
    end_failed_as_a_previous_version,
    error_info,
    eventually,
    new_user,
    one_running_job,
)


class Watched:
    """A WatchJobs stream read in the background: the last message it sent for each job."""

    def __init__(self) -> None:
        self.last: dict[str, job_pb2.Job] = {}
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
