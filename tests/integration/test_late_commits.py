"""A commit acknowledged late: an answer that could be wrong says the outcome is unknown, and what
the committed change owes (its job's release) is done anyway, at once.

The late acknowledgement is a real one: `synchronous_standby_names` names a standby that never
connects, so every commit of this module's database waits for it (PostgreSQL has committed
locally; a cancel ends the wait and keeps the commit), as with a synchronous standby that stops
acknowledging. Only sessions of this module's database wait: the server-wide default of
`synchronous_commit` is `local` while the standby is required, and this database alone asks for
`on`. Both are reset when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2 as callback_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service.dev.core import AnswerFault
from tests.harness import (
    InvariantChecker,
    S,
    error_info,
    eventually,
    new_user,
    nothing_in_flight,
    running_with_one_queued,
    stranger_holds_user_locks,
)

# Well under the release lease (15 s): handed over at once, not found again after the lease.
_PROMPTLY_SECONDS = 3.0


class LateCommits:
    """Switches late commit acknowledgements on and off for one database."""

    def __init__(self, admin_dsn: str, database: str) -> None:
        self._admin_dsn = admin_dsn
        self._database = database

    def _admin(self, *statements: str) -> None:
        with psycopg.connect(self._admin_dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)  # type: ignore[arg-type]

    def prepare(self) -> None:
        """Before the service connects: its sessions will wait for the standby when one is required."""
        self._admin(f'ALTER DATABASE "{self._database}" SET synchronous_commit = on')

    def on(self) -> None:
        self._admin(
            "ALTER SYSTEM SET synchronous_commit = local",
            "ALTER SYSTEM SET synchronous_standby_names = 'acurio_test_standby_that_never_comes'",
            "SELECT pg_reload_conf()",
        )
        time.sleep(0.3)  # the checkpointer re-reads the configuration

    def off(self) -> None:
        self._admin("ALTER SYSTEM RESET synchronous_standby_names", "ALTER SYSTEM RESET synchronous_commit", "SELECT pg_reload_conf()")

    def forget(self) -> None:
        self.off()
        with contextlib.suppress(psycopg.Error):
            self._admin(f'ALTER DATABASE "{self._database}" RESET synchronous_commit')


@pytest.fixture
def late_commits(postgres, database_url: str) -> Iterator[LateCommits]:  # type: ignore[no-untyped-def]
    switch = LateCommits(postgres.admin_dsn, urlsplit(database_url).path.lstrip("/"))
    try:
        switch.prepare()
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test database's role may not change server settings")
    try:
        yield switch
    finally:
        switch.forget()


@contextlib.asynccontextmanager
async def _admit_acknowledged_late(switch: LateCommits, service, user: str, key: str) -> AsyncIterator[asyncio.Task[job_pb2.Job]]:  # type: ignore[no-untyped-def]
    """An admit (3 s deadline) whose locked statement's commit is acknowledged late: its run's
    reservation commits at once, and the late acknowledgements start while the core takes
    its time to answer CreateRun. The late acknowledgements end with the block."""
    service.core.answer_faults["CreateRun"] = AnswerFault("late", seconds=0.8)
    admit = asyncio.create_task(service.stubs.admit(user, key, timeout=3))
    await asyncio.sleep(0.1)
    await asyncio.to_thread(switch.on)
    service.core.answer_faults.clear()
    try:
        yield admit
    finally:
        await asyncio.to_thread(switch.off)


async def test_an_admit_whose_commit_is_acknowledged_late_says_its_outcome_is_unknown_and_its_job_is_released(
    services, late_commits, database_url
) -> None:  # type: ignore[no-untyped-def]
    """At the call's deadline the locked admit is cancelled while PostgreSQL waits for the standby:
    the commit is kept, but its answer is not read. The caller hears OUTCOME_UNKNOWN, never a
    plain DATABASE_UNAVAILABLE beside a charged job, and the committed admit's release is handed
    over once its commit lands, not after the release lease."""
    service = await services.start()
    user = new_user()
    await service.stubs.grant(user, 1)
    key = uuid.uuid4().hex
    started = time.monotonic()
    async with _admit_acknowledged_late(late_commits, service, user, key) as admit:
        try:
            await admit
            raise AssertionError("the admit's commit was not confirmed")
        except grpc.aio.AioRpcError as exc:
            code, reason, _, _ = error_info(exc)
            assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "OUTCOME_UNKNOWN")
            assert "same idempotency key" in (exc.details() or "")
        assert time.monotonic() - started < 3
    # It had committed (the cancel kept the commit): the job is charged and released at once,
    # its release marked RUNNING as soon as commits are acknowledged again.
    jobs = await service.stubs.jobs(user)
    assert len(jobs) == 1 and await service.stubs.balance(user) == 0
    await service.stubs.wait_for(jobs[0].job_id, S.JOB_STATUS_RUNNING, timeout=_PROMPTLY_SECONDS)
    # A retry with the same key learns the outcome: the job.
    assert (await service.stubs.admit(user, key)).job_id == jobs[0].job_id
    assert InvariantChecker(database_url).all_violations() == []


async def test_a_completion_whose_commit_is_acknowledged_late_starts_the_next_job_at_once(services, late_commits, database_url) -> None:  # type: ignore[no-untyped-def]
    """The core's CompleteRun ends the user's running job and promotes the queued one, but the
    commit is acknowledged late: the core hears UNAVAILABLE (OUTCOME_UNKNOWN) and no answer
    hands the promoted job's release over. The lost answer is followed up: the next job starts
    within seconds of commits being acknowledged again, not after its release lease (15 s)."""
    service = await services.start()
    user, running, queued = await running_with_one_queued(service.stubs)
    completion = callback_pb2.CompleteRunRequest(run_id=running.run_id, outcome=callback_pb2.RUN_OUTCOME_SUCCEEDED)
    await asyncio.to_thread(late_commits.on)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as lost:
            await service.stubs.callback.CompleteRun(completion, timeout=1.5)
        answered = time.monotonic()
    finally:
        await asyncio.to_thread(late_commits.off)
    acknowledged_again = time.monotonic()
    code, reason, _, _ = error_info(lost.value)
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "OUTCOME_UNKNOWN")
    await service.stubs.wait_for(queued.job_id, S.JOB_STATUS_RUNNING, timeout=_PROMPTLY_SECONDS)
    running = time.monotonic()
    print(
        f"\nthe job a lost completion promoted was RUNNING {running - answered:.2f}s after the lost answer, {running - acknowledged_again:.2f}s after commits were acknowledged again"
    )
    # The core's retry finds the job ended as it reported.
    assert (await service.stubs.callback.CompleteRun(completion, timeout=5)).job.status == S.JOB_STATUS_SUCCEEDED
    assert InvariantChecker(database_url).all_violations() == []


async def test_an_admit_with_an_unknown_outcome_that_waits_for_capacity_is_released_only_by_a_grant(
    services, late_commits, database_url
) -> None:  # type: ignore[no-untyped-def]
    """Capacity 1 and one run judging: a second user's admit commits its job PENDING and waiting
    for capacity, but the commit is acknowledged late, so the caller hears OUTCOME_UNKNOWN. The
    admit's clean-up finds the job committed; it claimed no release, so it is not released past
    the capacity (I12): it keeps its place and starts when the judging run ends, by a grant."""
    nothing_in_flight(database_url)  # the module's earlier tests leave runs that would take the capacity
    service = await services.start()
    await _operator(service).SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=1), timeout=10)
    first = new_user()
    await service.stubs.grant(first, 1)
    judging = await service.stubs.admit(first)
    await service.stubs.wait_for(judging.job_id, S.JOB_STATUS_RUNNING)
    second = new_user()
    await service.stubs.grant(second, 1)
    async with _admit_acknowledged_late(late_commits, service, second, uuid.uuid4().hex) as admit:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await admit
    assert error_info(unknown.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "OUTCOME_UNKNOWN")
    (waiting,) = await service.stubs.jobs(second)
    # Time for the clean-up (it waits for the admit's commit) to do whatever it does.
    for _ in range(int(_PROMPTLY_SECONDS / 0.1)):
        assert service.core.first_pass_judging() == 1, "a run was released past the capacity"
        await asyncio.sleep(0.1)
    waiting = await service.stubs.job(waiting.job_id)
    assert (waiting.status, waiting.capacity_position) == (S.JOB_STATUS_PENDING, 1)
    await service.core.finish(judging.run_id)
    await service.stubs.wait_for(waiting.job_id, S.JOB_STATUS_RUNNING, timeout=_PROMPTLY_SECONDS)
    assert service.core.most_first_pass_judging == 1


def _operator(service) -> op_grpc.OperatorServiceStub:  # type: ignore[no-untyped-def]
    return op_grpc.OperatorServiceStub(service.stubs.channel)


def _commits_waiting_for_the_standby(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchone()
    return int(row[0]) if row else 0


async def test_a_release_owed_by_a_lost_completion_is_not_sent_once_its_user_is_paused(services, late_commits, database_url) -> None:  # type: ignore[no-untyped-def]
    """The core's CompleteRun ends the user's running job and promotes the queued one, but its
    commit is acknowledged late: the answer is lost, and the follow-up that hands over the promoted
    job's release waits for the user's lock (a stranger holds it). Meanwhile the operator pauses
    the user. The follow-up finds her paused: the release, never sent, is not handed over; the job
    waits for a grant with its place in line, and her resume starts it."""
    nothing_in_flight(database_url)  # the module's earlier tests may leave a capacity set
    service = await services.start()
    stubs, core = service.stubs, service.core
    user, running, queued = await running_with_one_queued(stubs)
    completion = callback_pb2.CompleteRunRequest(run_id=running.run_id, outcome=callback_pb2.RUN_OUTCOME_SUCCEEDED)
    holding = asyncio.Event()
    await asyncio.to_thread(late_commits.on)
    try:
        complete = asyncio.ensure_future(stubs.callback.CompleteRun(completion, timeout=1.5))
        # Its commit waits for the standby, holding the user's lock: the stranger queues behind it
        # and takes the lock as the commit lands, before the follow-up asks for it.
        await eventually(lambda: _commits_waiting_for_the_standby(database_url) > 0, what="the completion's commit waiting")
        stranger = asyncio.create_task(stranger_holds_user_locks(database_url, [user], 4.0, holding))
        with pytest.raises(grpc.aio.AioRpcError) as lost:
            await complete
        await asyncio.wait_for(holding.wait(), timeout=5)
    finally:
        await asyncio.to_thread(late_commits.off)
    assert error_info(lost.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "OUTCOME_UNKNOWN")
    pause = op_pb2.SetReleasesPausedRequest(user_id=user, paused=True)
    await _operator(service).SetReleasesPaused(pause, timeout=10)
    assert not stranger.done(), "the follow-up had the lock before the pause"
    await stranger

    async def waiting() -> bool:
        return (await stubs.job(queued.job_id)).capacity_position > 0

    await eventually(waiting, timeout=_PROMPTLY_SECONDS, what="the promoted job waiting for a grant")
    await asyncio.sleep(0.5)
    assert not any(run_id == queued.run_id for run_id, _ in core.release_log)
    assert (await stubs.job(queued.job_id)).status == S.JOB_STATUS_PENDING
    await _operator(service).SetReleasesPaused(op_pb2.SetReleasesPausedRequest(user_id=user, paused=False), timeout=10)
    await stubs.wait_for(queued.job_id, S.JOB_STATUS_RUNNING, timeout=_PROMPTLY_SECONDS)
    assert InvariantChecker(database_url).all_violations() == []
