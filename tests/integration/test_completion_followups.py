"""One user's busy queue holds up no other user's completion, and what a committed change owes
(the hand-over of the next job's release) does not depend on its caller still listening.

A stranger (an operator's long transaction, a replica of another version) holds a user's queue
lock on a raw connection of its own, through the one helper that takes it (`store.locks`).
"""

from __future__ import annotations

import asyncio
import time

import grpc
import psycopg

from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2 as callback_pb2
from tests.harness import InvariantChecker, S, error_info, running_with_one_queued, stranger_holds_user_locks

# Well under the release lease (QUEUE_RELEASE_LEASE_SECONDS, 15 s): the next job was handed over,
# not found again once its lease ran out.
_PROMPTLY_SECONDS = 3.0


def _completion(run_id: str) -> callback_pb2.CompleteRunRequest:
    return callback_pb2.CompleteRunRequest(run_id=run_id, outcome=callback_pb2.RUN_OUTCOME_SUCCEEDED)


async def _complete(stubs, run_id: str, timeout: float) -> callback_pb2.CompleteRunResponse:  # type: ignore[no-untyped-def]
    return await stubs.callback.CompleteRun(_completion(run_id), timeout=timeout)


async def _advisory_waiters(database_url: str) -> int:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as probe:
        cursor = await probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()"
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


async def test_a_users_held_lock_stalls_neither_other_users_completions_nor_their_calls(services, database_url) -> None:  # type: ignore[no-untyped-def]
    core = await services.core()
    service = await services.start(core, max_concurrent_calls=4)
    busy_user, busy_running, busy_queued = await running_with_one_queued(service.stubs)
    others = [await running_with_one_queued(service.stubs) for _ in range(3)]
    unrelated = await running_with_one_queued(service.stubs)

    holding = asyncio.Event()
    stranger = asyncio.create_task(stranger_holds_user_locks(database_url, [busy_user], 3.0, holding))
    await holding.wait()
    # The busy user's completion waits for its own lock (the core's deadline, 5 s, allows it).
    busy_completion = asyncio.create_task(_complete(service.stubs, busy_running.run_id, 5))
    for _ in range(100):
        if await _advisory_waiters(database_url):
            break
        await asyncio.sleep(0.02)

    started = time.monotonic()
    completions = [asyncio.create_task(_complete(service.stubs, running.run_id, 2)) for _, running, _ in others]
    await asyncio.sleep(0.05)
    # Four calls are on the replica (the busy completion and the three others): an unrelated
    # user's read still gets its turn.
    seen = await service.stubs.queue.GetJob(_get_job(unrelated[1].job_id), timeout=2)
    assert seen.job.status == S.JOB_STATUS_RUNNING
    answers = await asyncio.gather(*completions)
    # Applied and answered well within their own 2 s, while the busy user's lock is still held.
    assert time.monotonic() - started < 1.0
    assert not stranger.done()
    assert [answer.job.status for answer in answers] == [S.JOB_STATUS_SUCCEEDED] * 3
    for _, _, queued in others:
        await service.stubs.wait_for(queued.job_id, S.JOB_STATUS_RUNNING, timeout=_PROMPTLY_SECONDS)

    # The busy user's completion waited for itself only, and lands once the stranger lets go.
    assert (await busy_completion).job.status == S.JOB_STATUS_SUCCEEDED
    await stranger
    await service.stubs.wait_for(busy_queued.job_id, S.JOB_STATUS_RUNNING, timeout=_PROMPTLY_SECONDS)
    assert InvariantChecker(database_url).all_violations() == []


async def test_a_completion_whose_caller_gave_up_still_starts_the_next_job_at_once(service, database_url) -> None:  # type: ignore[no-untyped-def]
    user, running, queued = await running_with_one_queued(service.stubs)
    holding = asyncio.Event()
    stranger = asyncio.create_task(stranger_holds_user_locks(database_url, [user], 2.0, holding))
    await holding.wait()

    # The core's call waits for the held lock, and the core gives up on it (hangs up).
    call = service.stubs.callback.CompleteRun(_completion(running.run_id))
    await asyncio.sleep(0.5)
    call.cancel()
    try:
        await call
        raise AssertionError("the call was cancelled")
    except asyncio.CancelledError:
        pass
    assert (await service.stubs.job(running.job_id)).status == S.JOB_STATUS_RUNNING

    await stranger
    released_at = time.monotonic()
    # The completion went on without its caller: it committed once the lock was free, and the
    # job it promoted was handed over to the dispatcher at once.
    await service.stubs.wait_for(running.job_id, S.JOB_STATUS_SUCCEEDED, timeout=_PROMPTLY_SECONDS)
    await service.stubs.wait_for(queued.job_id, S.JOB_STATUS_RUNNING, timeout=_PROMPTLY_SECONDS)
    assert time.monotonic() - released_at < _PROMPTLY_SECONDS
    # The core's retry finds the job ended, as it was.
    again = await service.stubs.callback.CompleteRun(_completion(running.run_id), timeout=5)
    assert again.job.status == S.JOB_STATUS_SUCCEEDED
    assert InvariantChecker(database_url).all_violations() == []


async def test_a_completion_blocked_past_its_deadline_is_answered_in_time_and_changes_nothing(service, database_url) -> None:  # type: ignore[no-untyped-def]
    """The other side of the same rule: within a deadline, a completion blocked on its own
    user's lock answers LOCK_TIMEOUT in time and has changed nothing; the core's retry applies it."""
    user, running, queued = await running_with_one_queued(service.stubs)
    holding = asyncio.Event()
    stranger = asyncio.create_task(stranger_holds_user_locks(database_url, [user], 1.5, holding))
    await holding.wait()
    started = time.monotonic()
    try:
        await service.stubs.callback.CompleteRun(_completion(running.run_id), timeout=1.0)
        raise AssertionError("the lock is held longer than the call's deadline")
    except grpc.aio.AioRpcError as exc:
        assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "LOCK_TIMEOUT")
    assert time.monotonic() - started < 1.0
    await stranger
    await asyncio.sleep(0.3)
    assert (await service.stubs.job(running.job_id)).status == S.JOB_STATUS_RUNNING
    assert (await service.stubs.callback.CompleteRun(_completion(running.run_id), timeout=5)).job.status == S.JOB_STATUS_SUCCEEDED
    await service.stubs.wait_for(queued.job_id, S.JOB_STATUS_RUNNING, timeout=_PROMPTLY_SECONDS)


def _get_job(job_id: str):  # type: ignore[no-untyped-def]
    from queue_service._gen.acurio.queue.v1 import queue_service_pb2

    return queue_service_pb2.GetJobRequest(job_id=job_id)
