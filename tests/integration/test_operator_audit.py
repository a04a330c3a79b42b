"""The on-call console's round four, through the public gRPC API against real PostgreSQL and the
dev core: the pauses of releases in force listed in one place (ListReleasePauses), a RUNNING job
far older than usual marked overdue with no start promised behind it, an operator's "check with the
core now" (CheckJobWithCore), one audit timeline filterable by actor and by user
(ListAuditEvents, Promote and Release included), and the read-only `viewer` role."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import symbol_database

from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2 as callback_pb2
from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.api.access.auth import ROLE_METHODS
from tests.harness import Stubs, eventually, new_user, nothing_in_flight, running_with_one_queued, token_entry, write_auth_file

S = job_pb2
TOKENS = {
    "alice": ("operator", "audit-alice-token"),
    "bob": ("operator", "audit-bob-token"),
    "wall-screen": ("viewer", "audit-viewer-token"),
    "web-backend": ("web", "audit-web-token"),
}


@pytest.fixture(autouse=True)
def _fresh_fleet(database_url: str) -> None:
    """Tests of this module share a database: each starts with nothing in flight, nothing paused."""
    nothing_in_flight(database_url)


def _as(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[name][1]}"),)


def _operator(stubs: Stubs) -> op_grpc.OperatorServiceStub:
    return op_grpc.OperatorServiceStub(stubs.channel)


@pytest.fixture
async def authed(services, tmp_path: Path):
    path = tmp_path / "auth.json"
    write_auth_file(path, *(token_entry(name, role, token) for name, (role, token) in TOKENS.items()))
    return await services.start(auth_file=str(path))


async def test_the_pauses_in_force_are_listed_in_one_place_with_who_since_when_and_why(service) -> None:
    operator = _operator(service.stubs)
    first, second = new_user(), new_user()
    assert list((await operator.ListReleasePauses(op_pb2.ListReleasePausesRequest(), timeout=10)).pauses) == []
    await operator.SetReleasesPaused(op_pb2.SetReleasesPausedRequest(paused=True, user_id=first, note="refund dispute"), timeout=10)
    await operator.SetReleasesPaused(op_pb2.SetReleasesPausedRequest(paused=True, user_id=second, note="flooding"), timeout=10)
    await operator.SetReleasesPaused(op_pb2.SetReleasesPausedRequest(paused=True, note="core upgrade"), timeout=10)

    listed = await operator.ListReleasePauses(op_pb2.ListReleasePausesRequest(), timeout=10)
    # The fleet's first, then the users', the longest paused first.
    assert [(p.user_id, p.paused_by, p.note) for p in listed.pauses] == [
        ("", "anonymous", "core upgrade"),
        (first, "anonymous", "refund dispute"),
        (second, "anonymous", "flooding"),
    ]
    assert listed.paused_users_total == 2
    assert all(p.HasField("paused_since") for p in listed.pauses)
    assert listed.pauses[1].paused_since.ToDatetime() <= listed.pauses[2].paused_since.ToDatetime()
    one = await operator.ListReleasePauses(op_pb2.ListReleasePausesRequest(page_size=2), timeout=10)
    assert [p.user_id for p in one.pauses] == ["", first] and one.paused_users_total == 2

    await operator.SetReleasesPaused(op_pb2.SetReleasesPausedRequest(paused=False, user_id=first), timeout=10)
    await operator.SetReleasesPaused(op_pb2.SetReleasesPausedRequest(paused=False), timeout=10)
    listed = await operator.ListReleasePauses(op_pb2.ListReleasePausesRequest(), timeout=10)
    assert [p.user_id for p in listed.pauses] == [second] and listed.paused_users_total == 1


async def test_a_running_job_far_older_than_usual_is_overdue_and_the_job_behind_it_is_promised_no_start(services) -> None:
    # Without a recent mean judging time a run is overdue after QUEUE_RECONCILE_AFTER_SECONDS; with
    # one, after three means (at least a minute), never later than that.
    service = await services.start(reconcile_after_seconds=1.5)
    stubs = service.stubs
    _, running, queued = await running_with_one_queued(stubs)
    running = await stubs.job(running.job_id)
    assert not running.run_overdue

    async def overdue() -> bool:
        return (await stubs.job(running.job_id)).run_overdue

    await eventually(overdue, timeout=10, what="the running job marked overdue")
    behind = await stubs.job(queued.job_id)
    assert behind.behind_overdue_run and not behind.HasField("estimated_start_time")
    listed = {job.job_id: job for job in await stubs.jobs(running.user_id)}
    assert listed[running.job_id].run_overdue and listed[queued.job_id].behind_overdue_run


async def test_check_with_the_core_now_confirms_a_judged_run_and_fails_one_the_core_forgot(service) -> None:
    stubs, core, operator = service.stubs, service.core, _operator(service.stubs)
    user, running, queued = await running_with_one_queued(stubs)
    balance = await stubs.balance(user)

    judging = await operator.CheckJobWithCore(op_pb2.CheckJobWithCoreRequest(job_id=running.job_id), timeout=10)
    assert (judging.run_state, judging.job_changed, judging.job.status) == ("judging", False, S.JOB_STATUS_RUNNING)
    assert "judging" in judging.outcome

    del core.runs[running.run_id]  # the core restarted without its runs
    forgotten = await operator.CheckJobWithCore(op_pb2.CheckJobWithCoreRequest(job_id=running.job_id), timeout=10)
    assert forgotten.run_state == "unknown_to_core"
    assert forgotten.job.status == S.JOB_STATUS_FAILED and forgotten.job.refunded and "core" in forgotten.job.last_error
    assert forgotten.job_changed  # at once, not after QUEUE_RECONCILE_AFTER_SECONDS
    assert await stubs.balance(user) == balance + running.price

    ended = await operator.CheckJobWithCore(op_pb2.CheckJobWithCoreRequest(job_id=running.job_id), timeout=10)
    assert (ended.run_state, ended.job_changed) == ("", False) and "ended" in ended.outcome

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.CheckJobWithCore(op_pb2.CheckJobWithCoreRequest(job_id=str(uuid.uuid4())), timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert queued.status == S.JOB_STATUS_QUEUED


async def _all_events(operator: op_grpc.OperatorServiceStub, page_size: int, **filters: str) -> list[op_pb2.AuditEvent]:
    events: list[op_pb2.AuditEvent] = []
    token = ""
    while True:
        page = await operator.ListAuditEvents(
            op_pb2.ListAuditEventsRequest(page_size=page_size, page_token=token, **filters), timeout=10, metadata=_as("wall-screen")
        )
        events.extend(page.events)
        token = page.next_page_token
        if not token:
            return events


async def test_one_audit_timeline_by_actor_and_by_user_holds_every_kind_of_action(authed) -> None:
    stubs = authed.stubs
    operator = _operator(stubs)
    queue = stubs.queue
    user, other = new_user(), new_user()

    await operator.SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=50), timeout=10, metadata=_as("alice"))
    grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=5, idempotency_key="g1", note="goodwill")
    await stubs.credits.GrantCredits(grant, timeout=10, metadata=_as("alice"))
    other_grant = credits_pb2.GrantCreditsRequest(user_id=other, amount=3, idempotency_key="g2")
    await stubs.credits.GrantCredits(other_grant, timeout=10, metadata=_as("bob"))
    await operator.SetReleasesPaused(
        op_pb2.SetReleasesPausedRequest(paused=True, user_id=user, note="hold"), timeout=10, metadata=_as("alice")
    )

    def admit(key: str) -> queue_pb2.AdmitRequest:
        return queue_pb2.AdmitRequest(
            user_id=user, idempotency_key=key, document=job_pb2.Document(uri="s3://theses/a.pdf"), sources=[job_pb2.Source(doi="10.1234/a")]
        )

    first = (await queue.Admit(admit("a1"), timeout=10, metadata=_as("web-backend"))).job
    second = (await queue.Admit(admit("a2"), timeout=10, metadata=_as("web-backend"))).job
    assert first.status == S.JOB_STATUS_PENDING and second.status == S.JOB_STATUS_QUEUED
    # Release now on a job her pause holds: it stays PENDING, and the call is on record.
    released = await queue.Release(queue_pb2.ReleaseRequest(job_id=first.job_id), timeout=10, metadata=_as("alice"))
    assert released.job.status == S.JOB_STATUS_PENDING
    await queue.Promote(queue_pb2.PromoteRequest(user_id=user), timeout=10, metadata=_as("alice"))  # no free slot
    await queue.CancelJob(queue_pb2.CancelJobRequest(job_id=second.job_id, user_id=user), timeout=10, metadata=_as("alice"))
    retried = await operator.RetryJob(op_pb2.RetryJobRequest(job_id=second.job_id), timeout=10, metadata=_as("alice"))
    await operator.CheckJobWithCore(op_pb2.CheckJobWithCoreRequest(job_id=first.job_id), timeout=10, metadata=_as("bob"))
    await operator.SetReleasesPaused(op_pb2.SetReleasesPausedRequest(paused=False, user_id=user), timeout=10, metadata=_as("alice"))

    by_alice = await _all_events(operator, 100, actor="operator:alice")
    assert {event.actor for event in by_alice} == {"operator:alice"}
    kinds = [event.kind for event in by_alice if event.user_id in (user, "")]
    assert kinds == ["resume", "retry", "cancel", "promote", "release", "pause", "grant", "capacity"], kinds
    as_by_kind = {event.kind: event for event in by_alice}
    assert (as_by_kind["capacity"].old_value, as_by_kind["capacity"].new_value) == (0, 50)
    assert (as_by_kind["grant"].amount, as_by_kind["grant"].note) == (5, "goodwill")
    assert as_by_kind["pause"].note == "hold"
    assert (as_by_kind["release"].job_id, as_by_kind["release"].outcome) == (first.job_id, "pending")
    assert as_by_kind["promote"].outcome == "nothing to promote"
    assert (as_by_kind["cancel"].job_id, as_by_kind["cancel"].outcome) == (second.job_id, "canceled")
    assert (as_by_kind["retry"].job_id, as_by_kind["retry"].retry_of_job_id) == (retried.job.job_id, second.job_id)
    create_times = [event.create_time.ToDatetime() for event in by_alice]
    assert create_times == sorted(create_times, reverse=True)

    of_user = await _all_events(operator, 2, user_id=user)  # pages of two: none repeated, none lost
    assert [(e.kind, e.actor) for e in of_user] == [
        ("resume", "operator:alice"),
        ("check_with_core", "operator:bob"),
        ("retry", "operator:alice"),
        ("cancel", "operator:alice"),
        ("promote", "operator:alice"),
        ("release", "operator:alice"),
        ("pause", "operator:alice"),
        ("grant", "operator:alice"),
    ]
    assert of_user[1].job_id == first.job_id and of_user[1].outcome.startswith("held")
    assert [(e.kind, e.user_id, e.amount) for e in await _all_events(operator, 20, actor="operator:bob", user_id=other)] == [
        ("grant", other, 3)
    ]

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.ListAuditEvents(
            op_pb2.ListAuditEventsRequest(user_id=other, page_token="bogus"), timeout=10, metadata=_as("wall-screen")
        )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _read_requests(user: str, job_id: str) -> dict[str, Any]:
    """A valid request of each read (Get, List, Search, Watch) an operator may make."""
    return {
        "CreditsService/GetBalance": credits_pb2.GetBalanceRequest(user_id=user),
        "AnalysisQueueService/ListJobs": queue_pb2.ListJobsRequest(user_id=user),
        "AnalysisQueueService/GetJob": queue_pb2.GetJobRequest(job_id=job_id),
        "AnalysisQueueService/WatchJobs": queue_pb2.WatchJobsRequest(user_id=user),
        "OperatorService/GetOverview": op_pb2.GetOverviewRequest(),
        "OperatorService/SearchJobs": op_pb2.SearchJobsRequest(),
        "OperatorService/WatchOverview": op_pb2.WatchOverviewRequest(),
        "OperatorService/ListLedgerEntries": op_pb2.ListLedgerEntriesRequest(),
        "OperatorService/GetUserSettings": op_pb2.GetUserSettingsRequest(user_id=user),
        "OperatorService/ListSettingChanges": op_pb2.ListSettingChangesRequest(),
        "OperatorService/ListUsersWithWork": op_pb2.ListUsersWithWorkRequest(),
        "OperatorService/GetQueueHistory": op_pb2.GetQueueHistoryRequest(),
        "OperatorService/ListReplicas": op_pb2.ListReplicasRequest(),
        "OperatorService/ListReleasePauses": op_pb2.ListReleasePausesRequest(),
        "OperatorService/ListAuditEvents": op_pb2.ListAuditEventsRequest(),
    }


async def test_a_viewer_reads_everything_an_operator_reads_and_is_refused_every_change(authed) -> None:
    stubs = authed.stubs
    user = new_user()
    await stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=2, idempotency_key="v"), timeout=10, metadata=_as("alice")
    )
    job = (
        await stubs.queue.Admit(
            queue_pb2.AdmitRequest(
                user_id=user, idempotency_key="v1", document=job_pb2.Document(uri="s3://x"), sources=[job_pb2.Source(doi="10.1234/v")]
            ),
            timeout=10,
            metadata=_as("web-backend"),
        )
    ).job
    reads = _read_requests(user, job.job_id)
    package = "/acurio.queue.v1."
    operator_reads = {m for m in ROLE_METHODS["operator"] if m.rsplit("/", 1)[1].startswith(("Get", "List", "Search", "Watch"))}
    assert {package + name for name in reads} == operator_reads == ROLE_METHODS["viewer"]

    services = {
        "AnalysisQueueService": queue_pb2,
        "CreditsService": credits_pb2,
        "OperatorService": op_pb2,
        "CoreCallbackService": callback_pb2,
    }
    for service_name, module in services.items():
        for method in module.DESCRIPTOR.services_by_name[service_name].methods:
            path = f"{package}{service_name}/{method.name}"
            message = reads.get(f"{service_name}/{method.name}") or _empty(method.input_type.full_name)
            if method.server_streaming:
                call: Any = stubs.channel.unary_stream(path, request_serializer=lambda m: m.SerializeToString())(
                    message, timeout=10, metadata=_as("wall-screen")
                )
            else:
                call = stubs.channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString())(
                    message, timeout=10, metadata=_as("wall-screen")
                )
            if path in ROLE_METHODS["viewer"]:
                if method.server_streaming:
                    async for _ in call:  # the first message came: it was let in
                        call.cancel()
                        break
                else:
                    await call
                continue
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                if method.server_streaming:
                    async for _ in call:
                        pass
                else:
                    await call
            assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED, path
            assert "viewer" in (raised.value.details() or ""), path
    # Nothing a viewer did changed anything: the job is as it was.
    assert (await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=10, metadata=_as("wall-screen"))).job.status in (
        S.JOB_STATUS_PENDING,
        S.JOB_STATUS_RUNNING,
    )


def _empty(full_name: str) -> Any:
    return symbol_database.Default().GetSymbol(full_name)()


async def test_a_capacity_an_operator_set_is_said_at_start_as_info_not_warned_of(services, caplog: pytest.LogCaptureFixture) -> None:
    first = await services.start()
    await _operator(first.stubs).SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=7), timeout=10)
    caplog.set_level(logging.INFO, logger="queue_service.server")
    await services.start(core_capacity=5)  # a replica whose QUEUE_CORE_CAPACITY differs
    said = [record for record in caplog.records if "capacity in force is 7" in record.getMessage()]
    assert said, [record.getMessage() for record in caplog.records]
    assert said[0].levelno == logging.INFO and "at run time by anonymous" in said[0].getMessage(), said[0].getMessage()
