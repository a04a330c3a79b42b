"""OperatorService over gRPC, and every service over the browser endpoint (Connect protocol),
with the same roles and the same ErrorInfo/BadRequest details, against real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import http.client
import json
import struct
import uuid

import grpc
import psycopg
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2 as callback_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    credits_service_pb2 as credits_pb2,
)
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
from tests.connect_client import connect_unary, envelopes, error_details, post
from tests.harness import error_info, new_user, role_tokens, write_auth_file

S = job_pb2
TOKENS = {"web": "web-console-test-token", "operator": "operator-console-test-token", "core": "core-console-test-token"}


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("auth") / "auth.json"
    write_auth_file(path, *role_tokens(TOKENS))
    return str(path)


def _operator(service) -> op_grpc.OperatorServiceStub:
    return op_grpc.OperatorServiceStub(service.stubs.channel)


async def test_overview_counts_active_jobs_waiting_users_and_admits(service) -> None:
    stubs, operator = service.stubs, _operator(service)
    before = (await operator.GetOverview(op_pb2.GetOverviewRequest(), timeout=10)).overview
    first, second = new_user(), new_user()
    for user in (first, second):
        await stubs.grant(user, 10)
    jobs = [await stubs.admit(first) for _ in range(3)] + [await stubs.admit(second) for _ in range(2)]
    overview = (await operator.GetOverview(op_pb2.GetOverviewRequest(window_minutes=5), timeout=10)).overview
    assert overview.queued - before.queued == 3  # two of first's, one of second's wait
    assert overview.pending + overview.running - before.pending - before.running == 2
    assert overview.users_waiting - before.users_waiting == 2
    assert overview.window_minutes == 5 and len(overview.admits_per_minute) == 5
    assert sum(overview.admits_per_minute) - sum(before.admits_per_minute[-5:]) >= 5
    assert overview.HasField("oldest_queued_create_time")
    assert overview.oldest_queued_create_time.ToDatetime() <= jobs[1].create_time.ToDatetime()

    running = await stubs.wait_for(jobs[0].job_id, S.JOB_STATUS_RUNNING)
    await stubs.complete(running.run_id, succeeded=False)
    after = (await operator.GetOverview(op_pb2.GetOverviewRequest(window_minutes=5), timeout=10)).overview
    assert after.failed_in_window - overview.failed_in_window == 1
    assert after.queued == overview.queued - 1  # first's next job took the freed slot

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.GetOverview(op_pb2.GetOverviewRequest(window_minutes=5000), timeout=10)
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert [field for field, _ in violations] == ["window_minutes"]


async def test_search_pages_newest_first_across_users_by_every_filter(service) -> None:
    stubs, operator = service.stubs, _operator(service)
    first, second = new_user(), new_user()
    for user in (first, second):
        await stubs.grant(user, 10)
    started = dt.datetime.now(dt.UTC)
    admitted = []
    for index in range(6):
        admitted.append(await stubs.admit(first if index % 2 == 0 else second))
    ids = [job.job_id for job in admitted]

    async def search_all(job_filter: op_pb2.JobFilter, page_size: int = 2) -> list[job_pb2.Job]:
        found, token = [], ""
        while True:
            page = await operator.SearchJobs(op_pb2.SearchJobsRequest(filter=job_filter, page_size=page_size, page_token=token), timeout=10)
            found.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return found

    window = op_pb2.JobFilter()
    window.created_after.FromDatetime(started)
    everything = await search_all(window)
    assert [job.job_id for job in everything] == list(reversed(ids))  # newest admitted first, no page repeats

    of_first = await search_all(op_pb2.JobFilter(user_id=first))
    assert [job.job_id for job in of_first] == [ids[4], ids[2], ids[0]]

    queued = op_pb2.JobFilter(statuses=[S.JOB_STATUS_QUEUED])
    queued.created_after.FromDatetime(started)
    assert {job.job_id for job in await search_all(queued)} == {ids[2], ids[3], ids[4], ids[5]}

    before = op_pb2.JobFilter(user_id=second)
    before.created_before.FromDatetime(admitted[3].create_time.ToDatetime(dt.UTC))
    assert [job.job_id for job in await search_all(before)] == [ids[1]]

    running = await stubs.wait_for(ids[0], S.JOB_STATUS_RUNNING)
    await stubs.complete(running.run_id, succeeded=False)
    with_error = op_pb2.JobFilter(user_id=first, has_error=True)
    assert [job.job_id for job in await search_all(with_error)] == [ids[0]]

    page = await operator.SearchJobs(op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(user_id=first), page_size=1), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.SearchJobs(
            op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(user_id=second), page_token=page.next_page_token), timeout=10
        )
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, violations[0][0]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", "page_token")

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.SearchJobs(op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(statuses=[99])), timeout=10)
    assert error_info(raised.value)[3][0][0] == "filter.statuses[0]"


async def test_bulk_cancel_counts_then_cancels_at_most_the_confirmed_number_and_refunds(service) -> None:
    stubs, operator = service.stubs, _operator(service)
    user = new_user()
    await stubs.grant(user, 5)
    jobs = [await stubs.admit(user) for _ in range(5)]
    assert await stubs.balance(user) == 0
    only_user = op_pb2.JobFilter(user_id=user)

    counted = await operator.CancelJobs(op_pb2.CancelJobsRequest(filter=only_user, dry_run=True), timeout=10)
    assert (counted.matched, counted.canceled, counted.more_than_counted) == (5, 0, False)
    assert await stubs.balance(user) == 0

    done = await operator.CancelJobs(op_pb2.CancelJobsRequest(filter=only_user, max_jobs=3), timeout=30)
    assert (done.matched, done.canceled, list(done.failures)) == (5, 3, [])
    statuses = [(await stubs.job(job.job_id)).status for job in jobs]
    assert statuses[:3] == [S.JOB_STATUS_CANCELED] * 3  # oldest first
    assert S.JOB_STATUS_CANCELED not in statuses[3:]
    assert await stubs.balance(user) == 3

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.CancelJobs(op_pb2.CancelJobsRequest(filter=only_user), timeout=10)
    assert error_info(raised.value)[3] and error_info(raised.value)[3][0][0] == "max_jobs"
    ended_only = op_pb2.JobFilter(user_id=user, statuses=[S.JOB_STATUS_SUCCEEDED])
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.CancelJobs(op_pb2.CancelJobsRequest(filter=ended_only, dry_run=True), timeout=10)
    assert error_info(raised.value)[3][0][0] == "filter.statuses"


@pytest.mark.parametrize(
    ("field", "seconds", "nanos", "problem"),
    [
        ("created_after", 253_402_300_800, 0, "seconds"),  # 10000-01-01
        ("created_before", -62_135_596_801, 0, "seconds"),  # before 0001-01-01
        ("created_after", 0, -1, "nanos"),
        ("created_before", 0, 1_000_000_000, "nanos"),
    ],
    ids=["year-10000", "before-year-1", "negative-nanos", "nanos-of-a-whole-second"],
)
async def test_out_of_range_filter_timestamps_are_invalid_argument(service, field: str, seconds: int, nanos: int, problem: str) -> None:
    """A filter time outside google.protobuf.Timestamp's range is the caller's mistake, named in a
    BadRequest, for the search and the bulk cancel alike (not INTERNAL)."""
    operator = _operator(service)
    job_filter = op_pb2.JobFilter()
    getattr(job_filter, field).MergeFrom(Timestamp(seconds=seconds, nanos=nanos))
    calls = [
        operator.SearchJobs(op_pb2.SearchJobsRequest(filter=job_filter), timeout=10),
        operator.CancelJobs(op_pb2.CancelJobsRequest(filter=job_filter, dry_run=True), timeout=10),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call
        code, reason, _, violations = error_info(raised.value)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
        assert [name for name, _ in violations] == [f"filter.{field}"]
        assert f"filter.{field}.{problem} must be between" in violations[0][1]


async def test_bulk_cancel_does_not_count_a_job_whose_run_had_succeeded_as_canceled(services) -> None:
    """The run had succeeded at the core but its completion was lost: the bulk cancel learns it
    from the core's answer, the job ends SUCCEEDED and keeps its charge, and the answer lists it
    as JOB_ALREADY_FINISHED instead of counting it canceled."""
    core = await services.core()
    service = await services.start(core)
    stubs, operator = service.stubs, _operator(service)
    user = new_user()
    await stubs.grant(user, 2)
    finished = await stubs.admit(user)
    waiting = await stubs.admit(user)
    await stubs.wait_for(finished.job_id, S.JOB_STATUS_RUNNING)
    core.drop_callbacks = True
    await core.finish(finished.run_id)
    done = await operator.CancelJobs(op_pb2.CancelJobsRequest(filter=op_pb2.JobFilter(user_id=user), max_jobs=2), timeout=30)
    assert (done.matched, done.canceled) == (2, 1)
    assert [(f.job_id, f.reason) for f in done.failures] == [(finished.job_id, "JOB_ALREADY_FINISHED")]
    assert (await stubs.job(finished.job_id)).status == S.JOB_STATUS_SUCCEEDED
    assert (await stubs.job(waiting.job_id)).status == S.JOB_STATUS_CANCELED
    assert await stubs.balance(user) == 1  # the succeeded job's charge is kept, the canceled one refunded


async def test_watch_overview_sends_a_new_overview_when_a_figure_changes(service) -> None:
    stubs, operator = service.stubs, _operator(service)
    user = new_user()
    await stubs.grant(user, 5)
    await stubs.admit(user)  # holds the slot
    call = operator.WatchOverview(op_pb2.WatchOverviewRequest(interval_ms=250), timeout=30)
    first = (await asyncio.wait_for(call.read(), 10)).overview
    await stubs.admit(user)  # waits
    second = (await asyncio.wait_for(call.read(), 10)).overview
    assert second.queued == first.queued + 1
    call.cancel()


# -- the browser endpoint: Connect over HTTP/1.1 --------------------------------------------


@pytest.fixture
async def web_service(services, auth_file):
    core = await services.core(callback_token=TOKENS["core"])
    return await services.start(core, auth_file=auth_file, http_addr="127.0.0.1:0")


async def test_connect_endpoint_applies_the_same_roles_and_error_details(web_service) -> None:
    port, user = web_service.app.http_port, new_user()
    assert port > 0

    status, error = await connect_unary(port, "OperatorService/GetOverview", {})
    assert (status, error["code"], error_details(error)[0]) == (401, "unauthenticated", "UNAUTHENTICATED")
    status, error = await connect_unary(port, "OperatorService/GetOverview", {}, TOKENS["web"])
    assert (status, error["code"], error_details(error)[0]) == (403, "permission_denied", "PERMISSION_DENIED")
    assert "may not call /acurio.queue.v1.OperatorService/GetOverview" in error["message"]

    status, granted = await connect_unary(
        port, "CreditsService/GrantCredits", {"userId": user, "amount": 2, "idempotencyKey": "g"}, TOKENS["operator"]
    )
    assert (status, granted) == (200, {"balance": "2"})
    admit = {"userId": user, "idempotencyKey": "k1", "document": {"uri": "s3://t/1.pdf"}, "sources": [{"doi": "10.1234/a"}]}
    status, admitted = await connect_unary(port, "AnalysisQueueService/Admit", admit, TOKENS["web"])
    assert status == 200 and admitted["job"]["status"] == "JOB_STATUS_PENDING"
    status, error = await connect_unary(port, "AnalysisQueueService/Admit", {**admit, "idempotencyKey": "", "sources": []}, TOKENS["web"])
    assert (status, error["code"]) == (400, "invalid_argument")
    assert error_details(error) == ("INVALID_REQUEST", ["idempotency_key", "sources"])

    status, overview = await connect_unary(port, "OperatorService/GetOverview", {}, TOKENS["operator"])
    assert status == 200 and int(overview["overview"].get("pending", 0)) + int(overview["overview"].get("running", 0)) >= 1
    status, found = await connect_unary(port, "OperatorService/SearchJobs", {"filter": {"userId": user}}, TOKENS["operator"])
    assert [job["jobId"] for job in found["jobs"]] == [admitted["job"]["jobId"]]

    # The operator cancels the user's job from the console: refunded, as over gRPC.
    cancel = {"jobId": admitted["job"]["jobId"], "userId": user}
    status, canceled = await connect_unary(port, "AnalysisQueueService/CancelJob", cancel, TOKENS["operator"])
    assert status == 200 and canceled["job"]["status"] == "JOB_STATUS_CANCELED" and canceled["job"]["refunded"]
    status, balance = await connect_unary(port, "CreditsService/GetBalance", {"userId": user}, TOKENS["operator"])
    assert balance == {"balance": "2"}


async def test_watch_jobs_streams_over_http_1_1(web_service) -> None:
    port, user = web_service.app.http_port, new_user()
    await connect_unary(port, "CreditsService/GrantCredits", {"userId": user, "amount": 2, "idempotencyKey": "g"}, TOKENS["operator"])
    for key in ("a", "b"):
        admit = {"userId": user, "idempotencyKey": key, "document": {"uri": "s3://t/1.pdf"}, "sources": [{"doi": "10.1234/a"}]}
        await connect_unary(port, "AnalysisQueueService/Admit", admit, TOKENS["web"])
    request = json.dumps({"userId": user}).encode()
    headers = {
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": "1500",
        "authorization": f"Bearer {TOKENS['web']}",
    }
    status, response_headers, body = await asyncio.to_thread(
        post, port, "/acurio.queue.v1.AnalysisQueueService/WatchJobs", struct.pack(">BI", 0, len(request)) + request, headers
    )
    assert status == 200 and response_headers["content-type"] == "application/connect+json"
    messages = envelopes(body)
    data = [m for flags, m in messages if flags == 0]
    # The snapshot ends at its marker; changes committed around the stream's start may follow it.
    ends = [i for i, m in enumerate(data) if m.get("snapshotComplete")]
    assert ends, data
    snapshot = data[: ends[0] + 1]
    assert [m["job"].get("queuePosition", 0) for m in snapshot] == [0, 1]
    flags, end = messages[-1]
    assert flags == 2 and end["error"]["code"] == "deadline_exceeded"  # the stream stayed open until the caller's deadline

    unauthenticated = {**headers, "authorization": "Bearer wrong"}
    _, _, body = await asyncio.to_thread(
        post, port, "/acurio.queue.v1.AnalysisQueueService/WatchJobs", struct.pack(">BI", 0, len(request)) + request, unauthenticated
    )
    flags, end = envelopes(body)[-1]
    assert flags == 2 and end["error"]["code"] == "unauthenticated" and error_details(end["error"])[0] == "UNAUTHENTICATED"


async def test_the_console_is_served_with_a_strict_content_policy(web_service) -> None:
    def get(path: str) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", web_service.app.http_port, timeout=10)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    status, headers, body = await asyncio.to_thread(get, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in headers["content-security-policy"]
    # default-src does not cover where a <base> may point or a form may post
    assert "base-uri 'none'" in headers["content-security-policy"] and "form-action 'none'" in headers["content-security-policy"]
    assert "server" not in headers
    assert b"<title>" in body
    for path in ("/assets/../web.py", "/nothing-here", f"/assets/{uuid.uuid4().hex}.js"):
        assert (await asyncio.to_thread(get, path))[0] == 404


# -- what a job is, retry, and the grant's note (docs/console.md) --------------------------------


def _as(role: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[role]}"),)


def _sources(count: int, citation_chars: int = 40) -> list[job_pb2.Source]:
    return [job_pb2.Source(doi=f"10.1234/s{index}", citation=f"{index}:" + "c" * citation_chars) for index in range(count)]


async def _admit(service, user: str, sources: list[job_pb2.Source], *, title: str = "On queues") -> job_pb2.Job:  # type: ignore[no-untyped-def]
    request = queue_pb2.AdmitRequest(
        user_id=user,
        idempotency_key=uuid.uuid4().hex,
        document=job_pb2.Document(uri=f"s3://theses/{user}.pdf", title=title),
        sources=sources,
    )
    return (await service.stubs.queue.Admit(request, timeout=20, metadata=_as("web"))).job


async def _fail(service, job_id: str) -> job_pb2.Job:  # type: ignore[no-untyped-def]
    """The core reports the job's run failed (the charge is kept: no refund asked)."""
    stubs = service.stubs
    for _ in range(300):
        job = (await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job_id), timeout=10, metadata=_as("operator"))).job
        if job.status == S.JOB_STATUS_RUNNING:
            break
        await asyncio.sleep(0.05)
    assert job.status == S.JOB_STATUS_RUNNING, job
    completion = callback_pb2.CompleteRunRequest(
        run_id=job.run_id, outcome=callback_pb2.RUN_OUTCOME_FAILED, message="the provider timed out"
    )
    return (await stubs.callback.CompleteRun(completion, timeout=10, metadata=_as("core"))).job


async def _balance(service, user: str) -> int:  # type: ignore[no-untyped-def]
    response = await service.stubs.credits.GetBalance(credits_pb2.GetBalanceRequest(user_id=user), timeout=10, metadata=_as("operator"))
    return int(response.balance)


async def _ledger_of(service, **filters: str) -> list[op_pb2.LedgerEntry]:  # type: ignore[no-untyped-def]
    operator = _operator(service)
    return list(
        (
            await operator.ListLedgerEntries(
                op_pb2.ListLedgerEntriesRequest(**filters, page_size=100), timeout=10, metadata=_as("operator")
            )
        ).entries
    )


async def test_a_job_carries_its_document_and_a_bounded_preview_of_its_sources(web_service) -> None:  # type: ignore[no-untyped-def]
    user, operator = new_user(), _operator(web_service)
    await web_service.stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=2, idempotency_key="g"), timeout=10, metadata=_as("operator")
    )
    many = _sources(12, citation_chars=2000)
    admitted = await _admit(web_service, user, many, title="Queues, fairly")
    few = await _admit(web_service, user, _sources(2))

    def check(job: job_pb2.Job) -> None:
        assert (job.document.uri, job.document.title) == (f"s3://theses/{user}.pdf", "Queues, fairly")
        assert job.source_count == 12
        # The first 10 in order, each citation cut to 512 characters: every read stays small.
        assert [s.doi for s in job.sources] == [s.doi for s in many[:10]]
        assert [len(s.citation) for s in job.sources] == [512] * 10
        assert job.sources[0].citation == many[0].citation[:512]

    check(admitted)
    check((await web_service.stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=admitted.job_id), timeout=10, metadata=_as("operator"))).job)
    found = (
        await operator.SearchJobs(op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(user_id=user)), timeout=10, metadata=_as("operator"))
    ).jobs
    assert [job.job_id for job in found] == [few.job_id, admitted.job_id]
    check(found[1])
    assert found[0].source_count == 2 and [s.citation for s in found[0].sources] == [s.citation for s in _sources(2)]
    listed = (await web_service.stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=10, metadata=_as("web"))).jobs
    check(next(job for job in listed if job.job_id == admitted.job_id))


async def test_retry_admits_a_failed_job_again_as_its_user_through_the_same_checks_and_charge(web_service) -> None:  # type: ignore[no-untyped-def]
    user, operator = new_user(), _operator(web_service)
    await web_service.stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=2, idempotency_key="g"), timeout=10, metadata=_as("operator")
    )
    sources = _sources(3)
    failed = await _fail(web_service, (await _admit(web_service, user, sources)).job_id)
    assert failed.status == S.JOB_STATUS_FAILED and not failed.refunded
    assert await _balance(web_service, user) == 1

    retry = op_pb2.RetryJobRequest(job_id=failed.job_id, retry_key="click-1")
    first = await operator.RetryJob(retry, timeout=20, metadata=_as("operator"))
    job = first.job
    assert first.admitted_now and job.job_id != failed.job_id and job.user_id == user
    assert job.status in (S.JOB_STATUS_PENDING, S.JOB_STATUS_RUNNING)
    assert (job.document.uri, job.document.title, job.source_count) == (f"s3://theses/{user}.pdf", "On queues", 3)
    assert [(s.doi, s.citation) for s in job.sources] == [(s.doi, s.citation) for s in sources]
    assert await _balance(web_service, user) == 0  # charged as an admit is
    charge = list(await _ledger_of(web_service, job_id=job.job_id))
    assert [(e.kind, e.amount, e.actor, e.reason) for e in charge] == [
        (op_pb2.LEDGER_ENTRY_KIND_CHARGE, -1, "operator:operator-caller", "admit")
    ]

    # The same retry key again (a lost answer, a double click): the same job, nothing charged.
    again = await operator.RetryJob(retry, timeout=20, metadata=_as("operator"))
    assert (again.job.job_id, again.admitted_now) == (job.job_id, False)
    assert await _balance(web_service, user) == 0

    # Another retry, asked for explicitly, goes through Admit's checks: no credits left.
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(
            op_pb2.RetryJobRequest(job_id=failed.job_id, retry_key="click-2", another_retry=True), timeout=20, metadata=_as("operator")
        )
    assert error_info(raised.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "INSUFFICIENT_CREDITS")

    # Only a failed or canceled job; an unknown one is not found; a bad request names its fields.
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(op_pb2.RetryJobRequest(job_id=job.job_id, retry_key="k"), timeout=10, metadata=_as("operator"))
    code, reason, metadata, _ = error_info(raised.value)
    assert (code, reason, metadata["jobId"]) == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_NOT_RETRYABLE", job.job_id)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(op_pb2.RetryJobRequest(job_id=str(uuid.uuid4()), retry_key="k"), timeout=10, metadata=_as("operator"))
    assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(
            op_pb2.RetryJobRequest(job_id="nope", retry_key="", another_retry=True), timeout=10, metadata=_as("operator")
        )
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, [field for field, _ in violations]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
        ["job_id", "retry_key"],
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(retry, timeout=10, metadata=_as("web"))
    assert error_info(raised.value)[:2] == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")

    # A canceled job (refunded) can be retried too, with the credit it got back.
    await web_service.stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=20, metadata=_as("web"))
    assert await _balance(web_service, user) == 1
    third = await operator.RetryJob(op_pb2.RetryJobRequest(job_id=job.job_id, retry_key="click-3"), timeout=20, metadata=_as("operator"))
    assert third.admitted_now and third.job.source_count == 3 and await _balance(web_service, user) == 0


async def test_a_web_caller_cannot_take_a_retrys_idempotency_key_first(web_service) -> None:  # type: ignore[no-untyped-def]
    user, operator = new_user(), _operator(web_service)
    await web_service.stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=3, idempotency_key="g"), timeout=10, metadata=_as("operator")
    )
    sources = _sources(2)
    failed = await _fail(web_service, (await _admit(web_service, user, sources)).job_id)
    # The user knows the job and may read the retry key in a ticket: the retry's key is theirs to
    # compute. Admitting the same payload under it first would answer the operator's retry with
    # the user's own job (charged as the user); another payload would make it IDEMPOTENCY_KEY_REUSED.
    digest = hashlib.sha256(f"{failed.job_id}\x00ticket-4711".encode()).hexdigest()[:32]
    for key in (f"retry:{failed.job_id}", f"retry:{failed.job_id}:{digest}", "retry:anything"):
        taken = queue_pb2.AdmitRequest(
            user_id=user,
            idempotency_key=key,
            document=job_pb2.Document(uri=f"s3://theses/{user}.pdf", title="On queues"),
            sources=sources,
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await web_service.stubs.queue.Admit(taken, timeout=20, metadata=_as("web"))
        code, reason, _, violations = error_info(raised.value)
        assert (code, reason, [field for field, _ in violations]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_REQUEST",
            ["idempotency_key"],
        )
        assert "reserved for OperatorService.RetryJob" in violations[0][1]
    assert await _balance(web_service, user) == 2  # nothing charged by the refused admits

    retried = await operator.RetryJob(
        op_pb2.RetryJobRequest(job_id=failed.job_id, retry_key="ticket-4711", another_retry=True), timeout=20, metadata=_as("operator")
    )
    assert retried.admitted_now
    charge = await _ledger_of(web_service, job_id=retried.job.job_id)
    assert [(e.kind, e.actor) for e in charge] == [(op_pb2.LEDGER_ENTRY_KIND_CHARGE, "operator:operator-caller")]


async def test_retry_refuses_a_job_admitted_before_its_inputs_were_stored(web_service, database_url: str) -> None:  # type: ignore[no-untyped-def]
    user, operator = new_user(), _operator(web_service)
    await web_service.stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=2, idempotency_key="g"), timeout=10, metadata=_as("operator")
    )
    failed = await _fail(web_service, (await _admit(web_service, user, _sources(1))).job_id)
    # As a row written by the previous version looks: no document, no sources.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE analysis_jobs SET document_uri = NULL, document_title = NULL, sources = NULL, source_count = NULL, sources_preview = NULL WHERE job_id = %s",
            (uuid.UUID(failed.job_id),),
        )
    old = (await web_service.stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=failed.job_id), timeout=10, metadata=_as("operator"))).job
    assert not old.HasField("document") and old.source_count == 0 and not old.sources
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(op_pb2.RetryJobRequest(job_id=failed.job_id, retry_key="k"), timeout=10, metadata=_as("operator"))
    code, reason, metadata, _ = error_info(raised.value)
    assert (code, reason, metadata["status"]) == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_NOT_RETRYABLE", "FAILED")
    assert "before the queue stored" in raised.value.details()
    assert await _balance(web_service, user) == 1


async def test_a_grant_keeps_the_operators_note_on_its_ledger_entry(web_service) -> None:  # type: ignore[no-untyped-def]
    user, credits = new_user(), web_service.stubs.credits
    note = "refund for the outage of 2 May"
    await credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=3, idempotency_key="g1", note=note), timeout=10, metadata=_as("operator")
    )
    # A repeated grant keeps the first note; a grant without one has none.
    await credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=3, idempotency_key="g1", note="other"), timeout=10, metadata=_as("operator")
    )
    await credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=1, idempotency_key="g2"), timeout=10, metadata=_as("operator")
    )
    entries = await _ledger_of(web_service, user_id=user)
    assert [(e.amount, e.note, e.actor, e.reason) for e in entries] == [
        (1, "", "operator:operator-caller", "grant"),
        (3, note, "operator:operator-caller", "grant"),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await credits.GrantCredits(
            credits_pb2.GrantCreditsRequest(user_id=user, amount=1, idempotency_key="g3", note="x" * 513),
            timeout=10,
            metadata=_as("operator"),
        )
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, [field for field, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", ["note"])


async def test_users_with_work_lists_who_waits_longest_first_with_their_counts(web_service) -> None:  # type: ignore[no-untyped-def]
    operator, credits = _operator(web_service), web_service.stubs.credits
    waits_long, waits_short, only_running, done = new_user(), new_user(), new_user(), new_user()
    for user in (waits_long, waits_short, only_running, done):
        await credits.GrantCredits(
            credits_pb2.GrantCreditsRequest(user_id=user, amount=5, idempotency_key="g"), timeout=10, metadata=_as("operator")
        )
    # Admitted in this order: the first two users' second jobs queue (one slot each).
    await _admit(web_service, only_running, _sources(1))
    await _admit(web_service, waits_long, _sources(1))
    await _admit(web_service, waits_long, _sources(1))
    await _admit(web_service, waits_long, _sources(1))
    await _admit(web_service, waits_short, _sources(1))
    await _admit(web_service, waits_short, _sources(1))
    finished = await _fail(web_service, (await _admit(web_service, done, _sources(1))).job_id)
    assert finished.status == S.JOB_STATUS_FAILED

    listed = await operator.ListUsersWithWork(op_pb2.ListUsersWithWorkRequest(page_size=100), timeout=10, metadata=_as("operator"))
    mine = [u for u in listed.users if u.user_id in (waits_long, waits_short, only_running, done)]
    assert [u.user_id for u in mine] == [waits_long, waits_short, only_running]  # done has no work
    by_user = {u.user_id: u for u in mine}
    assert (by_user[waits_long].queued, by_user[waits_long].pending + by_user[waits_long].running) == (2, 1)
    assert (by_user[waits_short].queued, by_user[waits_short].pending + by_user[waits_short].running) == (1, 1)
    assert by_user[only_running].queued == 0 and not by_user[only_running].HasField("oldest_queued_create_time")
    assert by_user[waits_long].oldest_queued_create_time.ToDatetime() < by_user[waits_short].oldest_queued_create_time.ToDatetime()
    assert listed.users_total == len(listed.users) >= 3
    # The users waiting (overview) are the ones listed with a queued job.
    overview = (await operator.GetOverview(op_pb2.GetOverviewRequest(), timeout=10, metadata=_as("operator"))).overview
    assert overview.users_waiting == sum(1 for u in listed.users if u.queued > 0)

    one = await operator.ListUsersWithWork(op_pb2.ListUsersWithWorkRequest(page_size=1), timeout=10, metadata=_as("operator"))
    assert len(one.users) == 1 and one.users_total == listed.users_total and one.users[0] == listed.users[0]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.ListUsersWithWork(op_pb2.ListUsersWithWorkRequest(page_size=101), timeout=10, metadata=_as("operator"))
    assert error_info(raised.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")


def _by_minute(history: op_pb2.GetQueueHistoryResponse) -> dict[dt.datetime, op_pb2.QueueMinute]:
    return {point.minute.ToDatetime(dt.UTC): point for point in history.minutes}


async def test_queue_history_is_derived_from_job_timestamps_minute_by_minute(web_service, database_url: str) -> None:  # type: ignore[no-untyped-def]
    operator, user = _operator(web_service), new_user()
    history = op_pb2.GetQueueHistoryRequest(window_minutes=60)
    await web_service.stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=5, idempotency_key="g"), timeout=10, metadata=_as("operator")
    )
    before = await operator.GetQueueHistory(history, timeout=10, metadata=_as("operator"))
    assert before.window_minutes == 60 and len(before.minutes) == 60

    # One job's life placed in the past: admitted 30 minutes ago, promoted at 25, ended at 20 —
    # long before any console was open.
    past = await _fail(web_service, (await _admit(web_service, user, _sources(1))).job_id)
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    at = {name: now - dt.timedelta(minutes=m) for name, m in (("admitted", 30), ("promoted", 25), ("ended", 20))}
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE analysis_jobs SET create_time = %s, promote_time = %s, start_time = %s, end_time = %s WHERE job_id = %s",
            (
                at["admitted"] + dt.timedelta(seconds=10),
                at["promoted"] + dt.timedelta(seconds=10),
                at["promoted"] + dt.timedelta(seconds=10),
                at["ended"] + dt.timedelta(seconds=10),
                uuid.UUID(past.job_id),
            ),
        )
    # And now: three jobs admitted (one running, two queued).
    for _ in range(3):
        await _admit(web_service, user, _sources(1))
    after = await operator.GetQueueHistory(history, timeout=10, metadata=_as("operator"))
    overview = (await operator.GetOverview(op_pb2.GetOverviewRequest(), timeout=10, metadata=_as("operator"))).overview
    old, new = _by_minute(before), _by_minute(after)

    def delta(minute: dt.datetime, field: str) -> int:
        return int(getattr(new[minute], field)) - int(getattr(old[minute], field))

    assert (delta(at["admitted"], "admitted"), delta(at["admitted"], "queued"), delta(at["admitted"], "active")) == (1, 1, 0)
    assert (delta(at["promoted"], "queued"), delta(at["promoted"], "active")) == (0, 1)
    assert (delta(at["ended"], "ended"), delta(at["ended"], "active")) == (1, 0)
    assert delta(at["ended"] - dt.timedelta(minutes=1), "active") == 1  # still judging the minute before
    # The current minute is the queue now.
    last = after.minutes[-1]
    assert (last.queued, last.active) == (overview.queued, overview.pending + overview.running)
    assert sum(p.admitted for p in after.minutes) - sum(p.admitted for p in before.minutes) >= 3

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.GetQueueHistory(op_pb2.GetQueueHistoryRequest(window_minutes=2000), timeout=10, metadata=_as("operator"))
    assert error_info(raised.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")


async def _replicas_until(operator: op_grpc.OperatorServiceStub, ok, what: str) -> dict[str, op_pb2.Replica]:  # type: ignore[no-untyped-def]
    """The replicas' reports, read until `ok` holds (heartbeats come every 5 seconds)."""
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        listed = await operator.ListReplicas(op_pb2.ListReplicasRequest(), timeout=10)
        replicas = {replica.replica_id: replica for replica in listed.replicas}
        if ok(replicas):
            return replicas
        assert asyncio.get_running_loop().time() < deadline, f"{what}: {replicas}"
        await asyncio.sleep(0.2)


async def test_replicas_report_calls_streams_and_the_cores_answers_refusals_and_unknown_outcomes(services) -> None:  # type: ignore[no-untyped-def]
    core = await services.core()
    first = await services.start(core)
    second = await services.start(core)
    operator = op_grpc.OperatorServiceStub(first.stubs.channel)
    ids = (first.app.replica_id, second.app.replica_id)
    assert ids[0] != ids[1]
    user, other = new_user(), new_user()
    await first.stubs.grant(user, 5)
    await first.stubs.grant(other, 5)

    # The first replica: the core answers an admit (CreateRun, ReleaseRun) and refuses another.
    await first.stubs.wait_for((await first.stubs.admit(user)).job_id, S.JOB_STATUS_RUNNING)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await first.stubs.admit(user, dois=("10.9999/unregistered",))
    assert error_info(raised.value)[1] == "CORE_REJECTED"
    # The second: releases go unanswered (maybe applied), and an operator watches a user there.
    core.fail_releases = True
    await second.stubs.admit(other)
    watch = second.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=other), timeout=60)
    await watch.read()
    try:
        replicas = await _replicas_until(
            operator,
            lambda r: (
                all(i in r for i in ids)
                and r[ids[0]].core_calls.answered >= 2
                and r[ids[0]].core_calls.refused >= 1
                and sum(r[i].core_calls.unknown for i in ids) >= 1
                and r[ids[1]].watch_streams == 1
            ),
            "both replicas' reports",
        )
        mine = replicas[ids[1]]
        assert mine.calls_in_flight >= 1 and not mine.draining  # the open stream is a call in flight
        assert mine.host and mine.start_time.seconds > 0 and mine.heartbeat_time.ToDatetime() >= mine.start_time.ToDatetime()
        unknown = [replicas[i] for i in ids if replicas[i].core_calls.unknown]
        assert all(r.core_calls.HasField("last_unknown_time") for r in unknown)
        assert replicas[ids[0]].watch_streams == 0
    finally:
        watch.cancel()
        core.fail_releases = False

    # A replica that stops leaves the list at once.
    await second.app.stop(grace=0)
    await _replicas_until(operator, lambda r: ids[1] not in r and ids[0] in r, "the stopped replica's report gone")
