"""OperatorService.RetryJob and RetryJobs: one retry per ended job unless another is asked for,
the lineage both ways, bulk retry with the same guard; and who canceled a job, through the
public gRPC API against real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2 as callback_pb2
from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.store import migrations
from tests.harness import PostgresServer, error_info, eventually, new_user
from tests.integration import test_operator_console as console_tests
from tests.integration.test_core_second_copy import lose_commits
from tests.integration.test_operator_console import _admit, _as, _balance, _fail, _ledger_of, _operator, _sources

# The operator console tests' service: a replica with roles (an auth file) and a dev core.
auth_file = console_tests.auth_file
web_service = console_tests.web_service

S = job_pb2
OPERATOR = _as("operator")


async def _grant(service, user: str, amount: int) -> None:  # type: ignore[no-untyped-def]
    request = credits_pb2.GrantCreditsRequest(user_id=user, amount=amount, idempotency_key=uuid.uuid4().hex)
    await service.stubs.credits.GrantCredits(request, timeout=10, metadata=OPERATOR)


async def _job(service, job_id: str) -> job_pb2.Job:  # type: ignore[no-untyped-def]
    return (await service.stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job_id), timeout=10, metadata=OPERATOR)).job


async def _failed_job(service, user: str) -> job_pb2.Job:  # type: ignore[no-untyped-def]
    return await _fail(service, (await _admit(service, user, _sources(2))).job_id)


async def _charges(service, job_id: str) -> list[int]:  # type: ignore[no-untyped-def]
    return [entry.amount for entry in await _ledger_of(service, job_id=job_id) if entry.kind == op_pb2.LEDGER_ENTRY_KIND_CHARGE]


async def test_a_double_clicked_retry_charges_once_also_when_the_clicks_race(web_service) -> None:  # type: ignore[no-untyped-def]
    user, operator = new_user(), _operator(web_service)
    await _grant(web_service, user, 4)
    first_failed, second_failed = await _failed_job(web_service, user), await _failed_job(web_service, user)
    assert await _balance(web_service, user) == 2

    # Two clicks 1.5 s apart: each click sends its own retry key; the second answers the first's job.
    first = await operator.RetryJob(op_pb2.RetryJobRequest(job_id=first_failed.job_id, retry_key="click-1"), timeout=20, metadata=OPERATOR)
    again = await operator.RetryJob(op_pb2.RetryJobRequest(job_id=first_failed.job_id, retry_key="click-2"), timeout=20, metadata=OPERATOR)
    assert first.admitted_now and (again.job.job_id, again.admitted_now) == (first.job.job_id, False)
    assert await _balance(web_service, user) == 1

    # Clicks that race (two operators, a double click on two replicas): one admit, one charge.
    racing = await asyncio.gather(
        *(
            operator.RetryJob(op_pb2.RetryJobRequest(job_id=second_failed.job_id, retry_key=f"race-{i}"), timeout=20, metadata=OPERATOR)
            for i in range(6)
        )
    )
    assert len({answer.job.job_id for answer in racing}) == 1
    assert sum(answer.admitted_now for answer in racing) == 1
    assert await _balance(web_service, user) == 0
    assert await _charges(web_service, racing[0].job.job_id) == [-1]


async def test_the_lineage_is_stored_both_ways_and_another_retry_is_asked_for_explicitly(web_service) -> None:  # type: ignore[no-untyped-def]
    user, operator = new_user(), _operator(web_service)
    await _grant(web_service, user, 3)
    failed = await _failed_job(web_service, user)
    retry = (await operator.RetryJob(op_pb2.RetryJobRequest(job_id=failed.job_id), timeout=20, metadata=OPERATOR)).job
    assert retry.retry_of_job_id == failed.job_id and not retry.retried_as_job_ids

    # Read back (a reload of the console): the failed job says it was retried, by GetJob and search.
    assert list((await _job(web_service, failed.job_id)).retried_as_job_ids) == [retry.job_id]
    found = (await operator.SearchJobs(op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(user_id=user)), timeout=10, metadata=OPERATOR)).jobs
    by_id = {job.job_id: job for job in found}
    assert list(by_id[failed.job_id].retried_as_job_ids) == [retry.job_id]
    assert by_id[retry.job_id].retry_of_job_id == failed.job_id and not by_id[failed.job_id].retry_of_job_id

    # Another retry only when asked for, keyed by its retry key (the same key again: the same job).
    another = op_pb2.RetryJobRequest(job_id=failed.job_id, retry_key="second-try", another_retry=True)
    second = await operator.RetryJob(another, timeout=20, metadata=OPERATOR)
    assert second.admitted_now and second.job.job_id != retry.job_id and second.job.retry_of_job_id == failed.job_id
    repeated = await operator.RetryJob(another, timeout=20, metadata=OPERATOR)
    assert (repeated.job.job_id, repeated.admitted_now) == (second.job.job_id, False)
    assert list((await _job(web_service, failed.job_id)).retried_as_job_ids) == [retry.job_id, second.job.job_id]
    # A plain retry now answers the newest retry; nothing more was charged than the two retries.
    plain = await operator.RetryJob(op_pb2.RetryJobRequest(job_id=failed.job_id, retry_key="click"), timeout=20, metadata=OPERATOR)
    assert (plain.job.job_id, plain.admitted_now) == (second.job.job_id, False)
    assert await _balance(web_service, user) == 0

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(op_pb2.RetryJobRequest(job_id=failed.job_id, another_retry=True), timeout=10, metadata=OPERATOR)
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, [field for field, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", ["retry_key"])


async def test_bulk_retry_by_filter_counts_first_retries_once_and_skips_jobs_already_retried(web_service) -> None:  # type: ignore[no-untyped-def]
    user, operator = new_user(), _operator(web_service)
    await _grant(web_service, user, 8)
    failed = [await _failed_job(web_service, user) for _ in range(3)]
    earlier = (await operator.RetryJob(op_pb2.RetryJobRequest(job_id=failed[0].job_id), timeout=20, metadata=OPERATOR)).job
    only_failed = op_pb2.JobFilter(user_id=user, statuses=[S.JOB_STATUS_FAILED])

    counted = await operator.RetryJobs(op_pb2.RetryJobsRequest(filter=only_failed, dry_run=True), timeout=20, metadata=OPERATOR)
    assert (counted.matched, counted.retried, list(counted.already_retried_job_ids)) == (2, 0, [failed[0].job_id])
    assert await _balance(web_service, user) == 4  # a dry run admits nothing

    # Confirmed "retry 1 job": the oldest of the two not yet retried.
    done = await operator.RetryJobs(op_pb2.RetryJobsRequest(filter=only_failed, max_jobs=1), timeout=30, metadata=OPERATOR)
    assert (done.matched, done.retried, [job.retry_of_job_id for job in done.jobs]) == (2, 1, [failed[1].job_id])
    assert not done.failures and await _balance(web_service, user) == 3

    # Two bulk retries racing over the same jobs: the last one is retried once, charged once.
    racing = await asyncio.gather(
        *(operator.RetryJobs(op_pb2.RetryJobsRequest(filter=only_failed, max_jobs=10), timeout=30, metadata=OPERATOR) for _ in range(2))
    )
    assert sum(answer.retried for answer in racing) == 1
    assert await _balance(web_service, user) == 2
    retried = (await _job(web_service, failed[2].job_id)).retried_as_job_ids
    assert len(retried) == 1 and await _charges(web_service, retried[0]) == [-1]
    again = await operator.RetryJobs(op_pb2.RetryJobsRequest(filter=only_failed, max_jobs=10), timeout=30, metadata=OPERATOR)
    assert (again.matched, again.retried) == (0, 0)
    assert sorted(again.already_retried_job_ids) == sorted(job.job_id for job in failed)
    assert earlier.job_id in (await _job(web_service, failed[0].job_id)).retried_as_job_ids


async def test_bulk_retry_by_job_ids_reports_each_job_it_did_not_retry(web_service) -> None:  # type: ignore[no-untyped-def]
    user, operator = new_user(), _operator(web_service)
    await _grant(web_service, user, 5)
    failed = await _failed_job(web_service, user)
    retried_before = await _failed_job(web_service, user)
    await operator.RetryJob(op_pb2.RetryJobRequest(job_id=retried_before.job_id), timeout=20, metadata=OPERATOR)
    active = await _admit(web_service, user, _sources(1))
    unknown = str(uuid.uuid4())
    chosen = [failed.job_id, retried_before.job_id, active.job_id, unknown]

    counted = await operator.RetryJobs(op_pb2.RetryJobsRequest(job_ids=chosen, dry_run=True), timeout=20, metadata=OPERATOR)
    assert (counted.matched, list(counted.already_retried_job_ids)) == (1, [retried_before.job_id])
    done = await operator.RetryJobs(op_pb2.RetryJobsRequest(job_ids=chosen, max_jobs=1), timeout=30, metadata=OPERATOR)
    assert (done.retried, [job.retry_of_job_id for job in done.jobs]) == (1, [failed.job_id]), done.failures
    assert {(f.job_id, f.reason) for f in done.failures} == {(active.job_id, "JOB_NOT_RETRYABLE"), (unknown, "JOB_NOT_FOUND")}

    # Admit's own refusals are reported per job: no credit left for another user's retry.
    broke = new_user()
    await _grant(web_service, broke, 2)
    broke_failed = await _failed_job(web_service, broke)
    await operator.RetryJob(op_pb2.RetryJobRequest(job_id=broke_failed.job_id), timeout=20, metadata=OPERATOR)  # the last credit
    second = await _job(web_service, broke_failed.job_id)
    retry_of_retry = await _fail(web_service, second.retried_as_job_ids[0])
    refused = await operator.RetryJobs(op_pb2.RetryJobsRequest(job_ids=[retry_of_retry.job_id], max_jobs=1), timeout=30, metadata=OPERATOR)
    assert refused.retried == 0 and [(f.job_id, f.reason) for f in refused.failures] == [(retry_of_retry.job_id, "INSUFFICIENT_CREDITS")]


@pytest.mark.parametrize(
    ("request_fields", "fields"),
    [
        ({}, ["job_ids", "max_jobs"]),
        ({"job_ids": ["nope"], "dry_run": True}, ["job_ids[0]"]),
        ({"job_ids": [str(uuid.uuid4())], "filter": op_pb2.JobFilter(), "max_jobs": 1}, ["job_ids"]),
        ({"filter": op_pb2.JobFilter(statuses=[S.JOB_STATUS_RUNNING]), "max_jobs": 1}, ["filter.statuses"]),
        ({"job_ids": [str(uuid.uuid4())], "max_jobs": 1001}, ["max_jobs"]),
    ],
)
async def test_bulk_retry_refuses_a_bad_request_naming_its_fields(web_service, request_fields, fields) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await _operator(web_service).RetryJobs(op_pb2.RetryJobsRequest(**request_fields), timeout=10, metadata=OPERATOR)
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, [field for field, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", fields)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await _operator(web_service).RetryJobs(
            op_pb2.RetryJobsRequest(job_ids=[str(uuid.uuid4())], dry_run=True), timeout=10, metadata=_as("web")
        )
    assert error_info(raised.value)[:2] == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")


async def test_a_canceled_job_records_who_canceled_it_as_the_ledger_names_them(web_service) -> None:  # type: ignore[no-untyped-def]
    user, operator, queue = new_user(), _operator(web_service), web_service.stubs.queue
    await _grant(web_service, user, 4)
    # The user's slot holds the first job (RUNNING); the next ones wait QUEUED.
    running, by_user, by_operator = [await _admit(web_service, user, _sources(1)) for _ in range(3)]
    for _ in range(300):
        if (await _job(web_service, running.job_id)).status == S.JOB_STATUS_RUNNING:
            break
        await asyncio.sleep(0.05)
    assert (await _job(web_service, by_operator.job_id)).status == S.JOB_STATUS_QUEUED

    await queue.CancelJob(queue_pb2.CancelJobRequest(job_id=by_user.job_id, user_id=user), timeout=20, metadata=_as("web"))
    only = op_pb2.JobFilter(user_id=user, statuses=[S.JOB_STATUS_QUEUED, S.JOB_STATUS_RUNNING])
    done = await operator.CancelJobs(op_pb2.CancelJobsRequest(filter=only, max_jobs=2), timeout=30, metadata=OPERATOR)
    assert done.canceled == 2 and not done.failures

    user_canceled = await _job(web_service, by_user.job_id)
    assert (user_canceled.canceled_by, user_canceled.last_error) == ("web:web-caller", "canceled by the user")
    for job_id in (running.job_id, by_operator.job_id):  # an active job (the core asked) and a queued one
        job = await _job(web_service, job_id)
        assert job.status == S.JOB_STATUS_CANCELED and job.refunded
        assert (job.canceled_by, job.last_error) == ("operator:operator-caller", "canceled by operator operator-caller")
        refunds = [e.actor for e in await _ledger_of(web_service, job_id=job_id) if e.kind == op_pb2.LEDGER_ENTRY_KIND_REFUND]
        assert refunds == [job.canceled_by]  # the same actor string as the refund's
    # A job nobody canceled names no one.
    assert not (await _job(web_service, (await _failed_job(web_service, user)).job_id)).canceled_by


@pytest.fixture
async def free_work_limited(services, auth_file):  # type: ignore[no-untyped-def]
    """A replica with roles whose free-work limit is 3 an hour, and a 1 s release window (a
    release the core keeps failing gives up at once)."""
    core = await services.core(callback_token=console_tests.TOKENS["core"])
    return await services.start(
        core,
        auth_file=auth_file,
        max_free_admits_per_user_per_hour=3,
        release_window_seconds=1.0,
        release_backoff_max_seconds=0.2,
    )


async def _status_is(service, job_id: str, status: int) -> bool:  # type: ignore[no-untyped-def]
    return (await _job(service, job_id)).status == status


async def _failed_by_the_provider(service, user: str) -> job_pb2.Job:  # type: ignore[no-untyped-def]
    """A job the core judged and failed with the credit refunded (the provider's failure)."""
    job = await _admit(service, user, _sources(2))
    await eventually(lambda: _status_is(service, job.job_id, S.JOB_STATUS_RUNNING), what="the job judging")
    completion = callback_pb2.CompleteRunRequest(
        run_id=job.run_id, outcome=callback_pb2.RUN_OUTCOME_FAILED, refund_credit=True, message="the provider failed"
    )
    ended = (await service.stubs.callback.CompleteRun(completion, timeout=10, metadata=_as("core"))).job
    assert ended.status == S.JOB_STATUS_FAILED and ended.refunded
    return ended


async def test_refunds_the_user_did_not_ask_for_never_count_against_her_free_work_limit(free_work_limited) -> None:  # type: ignore[no-untyped-def]
    """Limit 3. Three jobs the provider failed (CompleteRun FAILED with refund_credit), two an
    operator canceled in bulk and one whose release gave up, all refunded: none was her choice, so
    her next paid click is admitted, and so is the operator's RetryJob of a failed one."""
    service, user, operator = free_work_limited, new_user(), _operator(free_work_limited)
    await _grant(service, user, 10)
    failed = [await _failed_by_the_provider(service, user) for _ in range(3)]

    bulk = [await _admit(service, user, _sources(1)) for _ in range(2)]  # one judging, one queued
    only = op_pb2.JobFilter(user_id=user, statuses=[S.JOB_STATUS_QUEUED, S.JOB_STATUS_PENDING, S.JOB_STATUS_RUNNING])
    done = await operator.CancelJobs(op_pb2.CancelJobsRequest(filter=only, max_jobs=2), timeout=30, metadata=OPERATOR)
    assert done.canceled == 2 and not done.failures

    service.core.fail_releases = True
    given_up = await _admit(service, user, _sources(1))
    await eventually(lambda: _status_is(service, given_up.job_id, S.JOB_STATUS_FAILED), timeout=20, what="the release given up")
    service.core.fail_releases = False
    for job_id in [job.job_id for job in bulk] + [given_up.job_id]:
        assert (await _job(service, job_id)).refunded
    assert await _balance(service, user) == 10

    clicked = await _admit(service, user, _sources(1))  # refused USER_FREE_WORK_LIMIT when every refund counted
    assert clicked.job_id
    retried = await operator.RetryJob(op_pb2.RetryJobRequest(job_id=failed[0].job_id), timeout=20, metadata=OPERATOR)
    assert retried.admitted_now and retried.job.retry_of_job_id == failed[0].job_id
    assert await _balance(service, user) == 8


async def test_her_own_cancels_count_and_an_operators_retry_is_never_refused(free_work_limited) -> None:  # type: ignore[no-untyped-def]
    """Limit 3. She cancels three of her jobs (refunded): her next click answers
    `USER_FREE_WORK_LIMIT`, while the operator's RetryJob and RetryJobs of those very jobs are
    admitted (and charged)."""
    service, user, operator = free_work_limited, new_user(), _operator(free_work_limited)
    await _grant(service, user, 10)
    canceled = []
    for _ in range(3):
        job = await _admit(service, user, _sources(1))
        await service.stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=20, metadata=_as("web"))
        canceled.append(job.job_id)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await _admit(service, user, _sources(1))
    assert error_info(raised.value)[:2] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "USER_FREE_WORK_LIMIT")

    retried = await operator.RetryJob(op_pb2.RetryJobRequest(job_id=canceled[0]), timeout=20, metadata=OPERATOR)
    assert retried.admitted_now and retried.job.retry_of_job_id == canceled[0]
    bulk = await operator.RetryJobs(op_pb2.RetryJobsRequest(job_ids=canceled[1:], max_jobs=2), timeout=30, metadata=OPERATOR)
    assert (bulk.retried, list(bulk.failures)) == (2, [])
    assert await _balance(service, user) == 7


# The lineage from its writer: the admit and the adoption write `retry_of_job_id` themselves
# (functions/queue_admit_job_v2.sql, queue_adopt_run_v2.sql); the trigger that read it from the
# key stays for the previous version's calls only (functions/analysis_jobs_retry_lineage.sql).

_LINEAGE_TRIGGER = "analysis_jobs_retry_lineage_insert"


@pytest.fixture
def without_the_lineage_trigger(database_url: str) -> Iterator[None]:
    """This module's database without the trigger, as the release that drops it leaves it; its
    file applied again afterwards, for the module's other tests. Requested before the service."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER {_LINEAGE_TRIGGER} ON analysis_jobs")  # type: ignore[arg-type]  # a constant
    try:
        yield
    finally:
        lineage = next(file for file in migrations.function_files() if file.name == "analysis_jobs_retry_lineage")
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(lineage.sql)  # type: ignore[arg-type]  # the file's text


async def test_a_retry_writes_its_lineage_itself_without_the_trigger(without_the_lineage_trigger, web_service) -> None:  # type: ignore[no-untyped-def]
    """RetryJob (plain and another), and RetryJobs, pass the ended job to the admit: the lineage
    is stored both ways with no trigger reading it from the key."""
    user, operator = new_user(), _operator(web_service)
    await _grant(web_service, user, 6)
    failed, bulk_failed = await _failed_job(web_service, user), await _failed_job(web_service, user)

    plain = (await operator.RetryJob(op_pb2.RetryJobRequest(job_id=failed.job_id), timeout=20, metadata=OPERATOR)).job
    another = op_pb2.RetryJobRequest(job_id=failed.job_id, retry_key="second-try", another_retry=True)
    second = (await operator.RetryJob(another, timeout=20, metadata=OPERATOR)).job
    bulk = await operator.RetryJobs(op_pb2.RetryJobsRequest(job_ids=[bulk_failed.job_id], max_jobs=1), timeout=30, metadata=OPERATOR)

    assert (plain.retry_of_job_id, second.retry_of_job_id) == (failed.job_id, failed.job_id)
    assert [job.retry_of_job_id for job in bulk.jobs] == [bulk_failed.job_id]
    assert list((await _job(web_service, failed.job_id)).retried_as_job_ids) == [plain.job_id, second.job_id]
    assert list((await _job(web_service, bulk_failed.job_id)).retried_as_job_ids) == [bulk.jobs[0].job_id]
    # Read back, not only as the admit answered.
    assert (await _job(web_service, plain.job_id)).retry_of_job_id == failed.job_id


async def test_an_adopted_retry_keeps_its_lineage_without_the_trigger(without_the_lineage_trigger, web_service, database_url: str) -> None:  # type: ignore[no-untyped-def]
    """A failover loses a retry's job while the core judges its run: the adoption reads the
    lineage from the key the core's record kept and writes it with the job (design I14)."""
    user, operator = new_user(), _operator(web_service)
    await _grant(web_service, user, 3)
    failed = await _failed_job(web_service, user)
    retry = (await operator.RetryJob(op_pb2.RetryJobRequest(job_id=failed.job_id), timeout=20, metadata=OPERATOR)).job
    await eventually(lambda: _status_is(web_service, retry.job_id, S.JOB_STATUS_RUNNING), what="the retry judging")
    assert await _balance(web_service, user) == 1

    lose_commits(database_url, [retry.job_id])
    assert not (await _job(web_service, failed.job_id)).retried_as_job_ids
    report = await web_service.app.reconciler.reconcile()
    assert report.adopted == 1, report

    adopted = await _job(web_service, retry.job_id)
    assert (adopted.status, adopted.run_id, adopted.retry_of_job_id) == (S.JOB_STATUS_RUNNING, retry.run_id, failed.job_id)
    assert list((await _job(web_service, failed.job_id)).retried_as_job_ids) == [retry.job_id]
    assert await _balance(web_service, user) == 1  # charged again with the adoption, once


async def test_only_a_retry_has_a_lineage_whatever_an_admits_key_looks_like(web_service) -> None:  # type: ignore[no-untyped-def]
    """Admit refuses a key beginning `retry:` (test_operator_console), so no job gets a lineage
    from its key alone; a key that merely resembles one is an ordinary admit, without lineage."""
    user = new_user()
    await _grant(web_service, user, 10)
    failed = await _failed_job(web_service, user)
    admit = queue_pb2.AdmitRequest(
        user_id=user,
        idempotency_key=f"retry:{failed.job_id}",
        document=job_pb2.Document(uri=f"s3://theses/{user}.pdf"),
        sources=_sources(2),
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await web_service.stubs.queue.Admit(admit, timeout=20, metadata=_as("web"))
    assert error_info(raised.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    for key in (f"Retry:{failed.job_id}", f" retry:{failed.job_id}", f"x-retry:{failed.job_id}"):
        admit.idempotency_key = key
        job = (await web_service.stubs.queue.Admit(admit, timeout=20, metadata=_as("web"))).job
        assert not job.retry_of_job_id and not (await _job(web_service, job.job_id)).retry_of_job_id
    assert not (await _job(web_service, failed.job_id)).retried_as_job_ids


@contextlib.contextmanager
def _database_copy(postgres: PostgresServer, template_database: str) -> Iterator[str]:
    name = f"t_lineage_{uuid.uuid4().hex[:8]}"
    postgres.execute_admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    try:
        yield postgres.dsn_for(name)
    finally:
        postgres.execute_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# The arguments every signature of the admit shares, then each signature's own, as replicas of
# earlier versions send them (15, 18 and 19 arguments), and the service's (queue_admit_job_v2).
_ADMIT_COMMON = (
    "%(job_id)s::uuid, %(user_id)s::text, %(run_id)s::uuid, %(key)s::text, '\\x00'::bytea, NULL::uuid, 0, 'system:test'::text,"
    " 'admit'::text, 1, 10, 1, 60.0::float8, 30.0::float8, 60.0::float8"
)
_INPUTS = ", 's3://theses/t.pdf'::text, NULL::text, '[]'::jsonb"
_ADMIT_CALLS = {
    "15": f"queue_admit_job({_ADMIT_COMMON})",
    "18": f"queue_admit_job({_ADMIT_COMMON}{_INPUTS})",
    "19": f"queue_admit_job({_ADMIT_COMMON}{_INPUTS}, false)",
    "v2": f"queue_admit_job_v2({_ADMIT_COMMON}{_INPUTS}, false, %(retry_of_job_id)s::uuid)",
}
_ADOPT_COMMON = (
    "%(job_id)s::uuid, %(user_id)s::text, %(run_id)s::uuid, %(key)s::text, '\\x00'::bytea, NULL::uuid, 0::bigint, false,"
    " 'system:test'::text, 'adopt'::text, 1, 60.0::float8, 30.0::float8, 60.0::float8"
)
_ADOPT_CALLS = {"old": f"queue_adopt_run({_ADOPT_COMMON})", "v2": f"queue_adopt_run_v2({_ADOPT_COMMON}, %(retry_of_job_id)s::uuid)"}


def _retry_key(job_id: uuid.UUID) -> str:
    """A further retry's key as `model.retry_idempotency_key` makes it: `retry:<job>:<32 hex>`."""
    return f"retry:{job_id}:{uuid.uuid4().hex}"


def _lineage_written(conn: psycopg.Connection, call: str, key: str, *, reserve: bool, retry_of_job_id: uuid.UUID | None = None) -> object:
    """The lineage in the view the call answers and in the row, for a new job under `key`."""
    params = {"job_id": uuid.uuid4(), "user_id": new_user(), "run_id": uuid.uuid4(), "key": key, "retry_of_job_id": retry_of_job_id}
    if reserve:  # the admit consumes its run's reservation
        conn.execute(
            "INSERT INTO run_reservations (run_id, user_id, cancel_after, timeline_id, idempotency_key)"
            " VALUES (%(run_id)s, %(user_id)s, clock_timestamp() + interval '1 hour', queue_current_timeline(), %(key)s)",
            params,
        )
    answered = conn.execute(f"SELECT (s.job_view).retry_of_job_id FROM {call} AS s", params).fetchall()  # type: ignore[arg-type]  # the calls above
    stored = conn.execute("SELECT retry_of_job_id FROM analysis_jobs WHERE job_id = %(job_id)s", params).fetchall()
    assert answered[:1] == stored, (answered, stored)
    return stored[0][0] if stored else "no job"


def test_the_previous_versions_calls_still_record_a_retrys_lineage_through_the_trigger(
    postgres: PostgresServer, template_database: str
) -> None:
    """A replica of the previous version, during the deploy, calls the old signatures with a
    retry's key and no lineage: the trigger fills it, as before. The new ones write what they are
    given, which the trigger never overrides, and nothing for an ordinary key."""
    ended, other = uuid.uuid4(), uuid.uuid4()
    with _database_copy(postgres, template_database) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        for signature in ("15", "18", "19"):
            key = _retry_key(ended)
            assert _lineage_written(conn, _ADMIT_CALLS[signature], key, reserve=True) == ended, signature
        assert _lineage_written(conn, _ADOPT_CALLS["old"], _retry_key(ended), reserve=False) == ended
        assert _lineage_written(conn, _ADMIT_CALLS["19"], "an-ordinary-key", reserve=True) is None

        for name, calls, reserve in (("admit", _ADMIT_CALLS, True), ("adopt", _ADOPT_CALLS, False)):
            v2 = calls["v2"]
            assert _lineage_written(conn, v2, f"{name}-key", reserve=reserve, retry_of_job_id=ended) == ended, name
            assert _lineage_written(conn, v2, _retry_key(ended), reserve=reserve, retry_of_job_id=other) == other, name
            assert _lineage_written(conn, v2, f"{name}-plain", reserve=reserve) is None, name
