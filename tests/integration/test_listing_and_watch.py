"""ListJobs pagination and filters, GetJob, and WatchJobs across replicas."""

from __future__ import annotations

import asyncio
import base64

import grpc
import pytest

from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from tests.harness import S, error_info, new_user


async def test_list_jobs_pages_newest_first_with_keyset_tokens_and_filters(service) -> None:
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 7)
    admitted = [await stubs.admit(user) for _ in range(7)]
    seen, token, pages = [], "", 0
    while True:
        page = await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user, page_size=3, page_token=token), timeout=5)
        seen += [j.job_id for j in page.jobs]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert pages == 3
    assert seen == [j.job_id for j in reversed(admitted)]

    queued = await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user, statuses=[S.JOB_STATUS_QUEUED], page_size=4), timeout=5)
    assert [j.queue_position for j in queued.jobs] == [6, 5, 4, 3]
    assert queued.next_page_token
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user, page_token=queued.next_page_token), timeout=5)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.queue.ListJobs(
            queue_pb2.ListJobsRequest(user_id=new_user(), statuses=[S.JOB_STATUS_QUEUED], page_token=queued.next_page_token), timeout=5
        )
    assert error_info(raised.value)[1] == "INVALID_REQUEST"


@pytest.mark.parametrize(
    "token",
    ["garbage", base64.urlsafe_b64encode(b'{"b": -1, "f": "x"}').decode(), "A" * 500, base64.urlsafe_b64encode(b"[1,2]").decode()],
)
async def test_forged_page_tokens_are_invalid_argument(service, token: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id="u", page_token=token), timeout=5)
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, [f for f, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", ["page_token"])


@pytest.mark.parametrize(("page_size", "statuses"), [(-1, []), (101, []), (10, [0]), (10, [42])])
async def test_bad_page_sizes_and_status_filters_are_invalid_argument(service, page_size: int, statuses: list[int]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id="u", page_size=page_size, statuses=statuses), timeout=5)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")


async def test_get_job_unknown_and_malformed(service) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id="00000000-0000-4000-8000-000000000000"), timeout=5)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id="nope"), timeout=5)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")


async def test_get_job_with_a_user_id_reads_only_that_users_job(service) -> None:
    """`user_id` on GetJob (additive) scopes the read: another user's job is NOT_FOUND, exactly as
    an unknown one, so the answer tells nothing about other users' jobs. Without it, GetJob reads
    any job, as before."""
    owner, other = new_user(), new_user()
    await service.stubs.grant(owner, 1)
    job = await service.stubs.admit(owner)
    get = service.stubs.queue.GetJob
    assert (await get(queue_pb2.GetJobRequest(job_id=job.job_id, user_id=owner), timeout=5)).job.job_id == job.job_id
    assert (await get(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=5)).job.user_id == owner
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await get(queue_pb2.GetJobRequest(job_id=job.job_id, user_id=other), timeout=5)
    assert error_info(raised.value)[:3] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND", {"jobId": job.job_id})
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await get(queue_pb2.GetJobRequest(job_id=job.job_id, user_id="x" * 129), timeout=5)
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, [f for f, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", ["user_id"])


async def _next_matching(stream, predicate, timeout: float = 10):
    async def scan():
        async for message in stream:
            if predicate(message):
                return message
        raise AssertionError("stream ended")

    return await asyncio.wait_for(scan(), timeout)


async def test_watch_jobs_snapshot_then_changes_made_through_another_replica(services) -> None:
    core = await services.core()
    watched = await services.start(core)
    other = await services.start(core)
    core.set_callback_addr(other.address)
    user = new_user()
    await other.stubs.grant(user, 3)
    first = await other.stubs.admit(user)
    second = await other.stubs.admit(user)
    await other.stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)

    stream = watched.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), timeout=30)
    snapshot = []
    async for message in stream:
        snapshot.append(message)
        if message.snapshot_complete:
            break
    assert [(m.job.job_id, m.job.status) for m in snapshot] == [
        (first.job_id, S.JOB_STATUS_RUNNING),
        (second.job_id, S.JOB_STATUS_QUEUED),
    ]

    third = await other.stubs.admit(user)  # through the other replica
    change = await _next_matching(stream, lambda m: m.job.job_id == third.job_id)
    assert change.job.status == S.JOB_STATUS_QUEUED and change.job.queue_position == 2 and not change.snapshot_complete

    await core.finish(first.run_id)  # completion lands on the other replica
    ended = await _next_matching(stream, lambda m: m.job.job_id == first.job_id)
    assert ended.job.status == S.JOB_STATUS_SUCCEEDED
    seen: list = []

    def both_seen(message) -> bool:
        seen.append(message.job)
        return any(j.job_id == second.job_id and j.status == S.JOB_STATUS_RUNNING for j in seen) and any(
            j.job_id == third.job_id and j.queue_position == 1 for j in seen
        )

    await _next_matching(stream, both_seen)
    started = next(j for j in seen if j.job_id == second.job_id and j.status == S.JOB_STATUS_RUNNING)
    assert started.start_time.seconds > 0
    stream.cancel()


async def test_watch_jobs_stream_caps_and_drain(services) -> None:
    service = await services.start(max_streams_per_user=2)
    user = new_user()
    streams = [service.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), timeout=30) for _ in range(2)]
    for stream in streams:
        first = await stream.read()
        assert first.snapshot_complete
    third = service.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), timeout=30)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await third.read()
    assert error_info(raised.value)[:2] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")

    stopping = asyncio.create_task(service.app.stop(grace=5))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await streams[0].read()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    await stopping
