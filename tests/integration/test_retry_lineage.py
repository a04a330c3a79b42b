"""OperatorService.RetryJob and RetryJobs: one retry per ended job unless another is asked for,
the lineage both ways, bulk retry with the same guard; and who canceled a job, through the
public gRPC API against real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2 as callback_pb2
from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from tests.harness import error_info, eventually, new_user
from tests.integration import test_operator_console as console_tests
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
