"""What one user can store is bounded (docs/security.md, "What one user can store"): free work
(delta re-checks at price 0, refunded cancels) is limited per hour, ended jobs' sources and then
the jobs themselves are pruned past their retention, and the ledger outlives them (I3)."""

from __future__ import annotations

import asyncio
import random
import string
import uuid

import grpc
import psycopg
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from queue_service._gen.acurio.core.v1 import run_service_pb2 as run_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2, queue_service_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service.api.servicers import validation
from queue_service.dev.core import AnswerFault
from tests.harness import InvariantChecker, error_info, new_user, until

# What one admitted job can occupy at most while it keeps its sources: the admit's encoded size
# (its sources' text) plus jsonb's per-source overhead (about 40 bytes, 1000 sources), the preview
# (10 sources, citations cut to 512 characters, up to 4 bytes each), the document (2048 + 512
# characters), the row, its index entries, TOAST's chunk headers and its two ledger entries.
# docs/security.md states the same figure.
STORED_BYTES_PER_JOB = 1_200_000


def _max_size_sources() -> list[job_pb2.Source]:
    """1000 sources whose encoded admit reaches MAX_ADMIT_BYTES, in random text (TOAST cannot
    compress it away, as a hostile user would not let it)."""
    count = validation.MAX_SOURCES
    citation_chars = min(validation.MAX_CITATION_CHARS, (validation.MAX_ADMIT_BYTES - 4096) // count - 22)
    rng = random.Random(38)
    letters = string.ascii_letters + string.digits
    return [job_pb2.Source(doi=f"10.1234/r{i:04d}", citation="".join(rng.choices(letters, k=citation_chars))) for i in range(count)]


def _relation_bytes(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_total_relation_size('analysis_jobs') + pg_total_relation_size('credit_ledger')").fetchone()
    assert row is not None
    return int(row[0])


def _retry_and_quota(exc: grpc.aio.AioRpcError) -> tuple[float | None, list[str]]:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    delay, subjects = None, []
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            delay = retry.retry_delay.ToMilliseconds() / 1000
        elif detail.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
            quota = error_details_pb2.QuotaFailure()
            detail.Unpack(quota)
            subjects = [v.subject for v in quota.violations]
    return delay, subjects


async def test_one_user_at_the_largest_admits_grows_the_database_no_more_than_the_stated_hourly_bound(services, database_url: str) -> None:
    """One user with one credit admits at the largest size as fast as the limits let her: a
    first-pass job canceled at once (charged, refunded) and a free delta re-check completed,
    over and over. What the tables grow by stays within the hourly bound docs/security.md states
    for her (the free limit, plus the delta re-checks that may race past the pre-check, plus what
    her balance pays for, each at the most a job stores), and past the limit each admit answers
    RESOURCE_EXHAUSTED `USER_FREE_WORK_LIMIT` with a QuotaFailure and RetryInfo. Before the limit,
    every round stored two megabyte-sized jobs."""
    free_limit = 5
    service = await services.start(max_free_admits_per_user_per_hour=free_limit)
    user = new_user()
    await service.stubs.grant(user, 2)
    base = await service.stubs.admit(user)
    await service.stubs.complete(base.run_id)
    balance = await service.stubs.balance(user)
    assert balance == 1
    sources = _max_size_sources()
    document = job_pb2.Document(uri="s3://theses/largest.pdf", title="T" * validation.MAX_TITLE_CHARS)
    probe = queue_service_pb2.AdmitRequest(user_id=user, idempotency_key="k" * 32, document=document, sources=sources)
    assert 1_000_000 < probe.ByteSize() <= validation.MAX_ADMIT_BYTES  # the largest an admit may be, about

    before = await asyncio.to_thread(_relation_bytes, database_url)
    admitted, refusals = 0, []
    for _ in range(12):
        first_pass = queue_service_pb2.AdmitRequest(user_id=user, idempotency_key=uuid.uuid4().hex, document=document, sources=sources)
        delta = queue_service_pb2.AdmitRequest(user_id=user, idempotency_key=uuid.uuid4().hex, sources=sources, delta_of_job_id=base.job_id)
        for request in (first_pass, delta):
            try:
                job = (await service.stubs.queue.Admit(request, timeout=30)).job
            except grpc.aio.AioRpcError as exc:
                refusals.append(exc)
                continue
            admitted += 1
            if request.delta_of_job_id:
                await service.stubs.complete(job.run_id)
            else:
                await service.stubs.queue.CancelJob(queue_service_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=10)
    grown = await asyncio.to_thread(_relation_bytes, database_url) - before
    print(f"free-work bound: {admitted} jobs admitted, {len(refusals)} refused, the tables grew by {grown} bytes")

    config = service.app.config
    hourly_jobs = free_limit + config.max_active_deltas_per_user + balance // config.admit_price
    hourly_bound = hourly_jobs * STORED_BYTES_PER_JOB
    assert grown <= hourly_bound, f"{admitted} jobs admitted grew the tables by {grown} bytes, over the hourly bound of {hourly_bound}"
    assert refusals, "the limit never refused an admit"
    for exc in refusals:
        code, reason, metadata, _ = error_info(exc)
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "USER_FREE_WORK_LIMIT"), (code, reason, exc.details())
        assert metadata["maxFreeAdmitsPerHour"] == str(free_limit)
        delay, subjects = _retry_and_quota(exc)
        assert delay is not None and 0 < delay <= 3600
        assert subjects == ["user"]
    assert await service.stubs.balance(user) == 1
    assert InvariantChecker(database_url).i3_ledger() == []


def _job_row(database_url: str, job_id: str) -> tuple[bool, int | None, int | None] | None:
    """(sources kept, source_count, preview length) of the job's row; None when it is gone."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sources IS NOT NULL, source_count, jsonb_array_length(sources_preview) FROM analysis_jobs WHERE job_id = %s",
            (job_id,),
        ).fetchone()
    return None if row is None else (bool(row[0]), row[1], row[2])


def _ledger_of(database_url: str, user: str) -> list[tuple[str, int, str | None]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT kind, amount, job_id::text FROM credit_ledger WHERE user_id = %s ORDER BY entry_id", (user,)).fetchall()
    return [(k, int(a), j) for k, a, j in rows]


def _admitted_earlier(database_url: str, *job_ids: str, ended_too: bool = False) -> None:
    """Moves the jobs' admit (and, with `ended_too`, their end) an hour and a minute back: the
    pruner keeps a job admitted within the hour (the free-work limit counts them)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """UPDATE analysis_jobs
                  SET create_time = create_time - interval '61 minutes',
                      end_time = CASE WHEN %s THEN end_time - interval '61 minutes' ELSE end_time END
                WHERE job_id = ANY(%s::uuid[])""",
            (ended_too, list(job_ids)),
        )


def _runs_unsettled(database_url: str, user: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM analysis_jobs WHERE user_id = %s AND run_settle_due_at IS NOT NULL", (user,)).fetchone()
    assert row is not None
    return int(row[0])


def _has_search_keys(database_url: str, job_id: str) -> bool:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM analysis_job_search_keys WHERE job_id = %s", (job_id,)).fetchone() is not None


async def test_the_pruner_empties_ended_jobs_sources_then_deletes_the_jobs_keeping_the_ledger(services, database_url: str) -> None:
    """With retentions of seconds: a sweep first keeps everything; past the inputs' retention the
    ended jobs lose their full sources (the count and preview stay, GetJob still answers, and
    RetryJob answers FAILED_PRECONDITION `JOB_INPUTS_PRUNED`); past the jobs' retention they are
    deleted (a delta's base once the delta is gone), while an active job stays and every ledger
    entry stays, the balance still equal to its ledger (I3). A delta of a deleted base answers
    `DELTA_BASE_NOT_FOUND`."""
    service = await services.start(job_inputs_retention_seconds=1.0, job_retention_seconds=3.0)
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    user = new_user()
    await service.stubs.grant(user, 3)
    canceled = await service.stubs.admit(user, dois=("10.1234/a", "10.1234/b"))
    await service.stubs.queue.CancelJob(queue_service_pb2.CancelJobRequest(job_id=canceled.job_id, user_id=user), timeout=10)
    succeeded = await service.stubs.admit(user)
    await service.stubs.complete(succeeded.run_id)
    delta = await service.stubs.admit(user, delta_of=succeeded.job_id)
    await service.stubs.complete(delta.run_id)
    active = await service.stubs.admit(user)
    ended = (canceled.job_id, succeeded.job_id, delta.job_id)
    await asyncio.to_thread(_admitted_earlier, database_url, *ended)  # out of the free-work limit's hour
    assert await asyncio.to_thread(_has_search_keys, database_url, canceled.job_id)
    ledger = await asyncio.to_thread(_ledger_of, database_url, user)

    await service.app.sweeper.sweep_once()
    for job_id in ended:
        assert (await asyncio.to_thread(_job_row, database_url, job_id))[0], "sources pruned before their retention"

    await asyncio.sleep(1.2)  # past the inputs' retention, within the jobs'
    await service.app.sweeper.sweep_once()
    assert await asyncio.to_thread(_job_row, database_url, canceled.job_id) == (False, 2, 2)
    for job_id in ended:
        assert not (await asyncio.to_thread(_job_row, database_url, job_id))[0]
    assert (await asyncio.to_thread(_job_row, database_url, active.job_id))[0], "an active job's sources were pruned"
    shown = await service.stubs.job(canceled.job_id)
    assert shown.source_count == 2 and [s.doi for s in shown.sources] == ["10.1234/a", "10.1234/b"]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(op_pb2.RetryJobRequest(job_id=canceled.job_id, retry_key="again"), timeout=10)
    code, reason, metadata, _ = error_info(raised.value)
    assert (code, reason, metadata["jobId"]) == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_INPUTS_PRUNED", canceled.job_id)

    await asyncio.sleep(2.0)  # past the jobs' retention
    await service.app.sweeper.sweep_once()  # the delta goes, its base stays while the delta is named
    await service.app.sweeper.sweep_once()  # then the base
    for job_id in ended:
        assert await asyncio.to_thread(_job_row, database_url, job_id) is None, f"job {job_id} kept past its retention"
        assert not await asyncio.to_thread(_has_search_keys, database_url, job_id), f"job {job_id}'s search keys kept"
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await service.stubs.job(job_id)
        assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    assert (await service.stubs.job(active.job_id)).status in (job_pb2.JOB_STATUS_PENDING, job_pb2.JOB_STATUS_RUNNING)
    assert await asyncio.to_thread(_ledger_of, database_url, user) == ledger
    assert await service.stubs.balance(user) == 1
    assert InvariantChecker(database_url).i3_ledger() == []
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.admit(user, delta_of=succeeded.job_id)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "DELTA_BASE_NOT_FOUND")


async def test_free_work_stays_counted_with_a_job_retention_under_an_hour(services, database_url: str) -> None:
    """With the jobs kept 1 s after they end, a user cancels three jobs (her free work, at the
    limit of 3): a sweep past their retention keeps them, since the limit counts the hour's jobs,
    and her next admit answers `USER_FREE_WORK_LIMIT` (the pruner deleting them let her go on)."""
    service = await services.start(max_free_admits_per_user_per_hour=3, job_retention_seconds=1.0)
    user = new_user()
    await service.stubs.grant(user, 5)
    canceled = []
    for _ in range(3):
        job = await service.stubs.admit(user)
        await service.stubs.queue.CancelJob(queue_service_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=10)
        canceled.append(job.job_id)

    async def settled() -> bool:
        return await asyncio.to_thread(_runs_unsettled, database_url, user) == 0

    await until(settled, within=15, what="the canceled jobs' runs settled")
    await asyncio.sleep(1.2)  # past the jobs' retention
    await service.app.sweeper.sweep_once()
    for job_id in canceled:
        assert (await service.stubs.job(job_id)).status == job_pb2.JOB_STATUS_CANCELED
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.admit(user)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "USER_FREE_WORK_LIMIT")
    assert await service.stubs.balance(user) == 5


async def test_a_delta_admitted_while_the_pruner_deletes_its_base_answers_delta_base_not_found(services, database_url: str) -> None:
    """The base passes the delta's pre-check, then the pruner deletes it while the core creates
    the delta's run (its CreateRun arrives late): the admit answers NOT_FOUND
    `DELTA_BASE_NOT_FOUND` as a later admit would, nothing is charged, and the run is canceled
    (I5)."""
    core = await services.core()
    service = await services.start(core, job_retention_seconds=1.0, delta_price=1)
    user = new_user()
    await service.stubs.grant(user, 2)
    base = await service.stubs.admit(user)
    await service.stubs.complete(base.run_id)
    await asyncio.to_thread(_admitted_earlier, database_url, base.job_id, ended_too=True)  # past every retention
    core.answer_faults["CreateRun"] = AnswerFault("late_arrival", seconds=1.0)
    admitting = asyncio.create_task(service.stubs.admit(user, delta_of=base.job_id))

    async def create_run_sent() -> bool:
        return core.faults_injected["CreateRun:late_arrival"] == 1

    await until(create_run_sent, within=10, what="the delta's CreateRun on its way")
    await service.app.sweeper.sweep_once()
    assert await asyncio.to_thread(_job_row, database_url, base.job_id) is None, "the base was not pruned"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await admitting
    code, reason, metadata, _ = error_info(raised.value)
    assert (code, reason, metadata.get("deltaOfJobId")) == (grpc.StatusCode.NOT_FOUND, "DELTA_BASE_NOT_FOUND", base.job_id)
    assert await service.stubs.balance(user) == 1
    core.answer_faults.clear()

    async def delta_run_canceled() -> bool:
        # The base's run judges on at this manual core: its completion was sent by hand.
        return [run.state for run in core.runs.values() if run.run_id != base.run_id] == [run_pb2.RUN_STATE_CANCELED]

    await until(delta_run_canceled, within=15, what="the delta's run canceled at the core")
