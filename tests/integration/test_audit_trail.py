"""The credits' audit trail: every ledger entry records who moved the credit (the caller the auth
layer identified, or the system) and why, and operators read it with
OperatorService.ListLedgerEntries; through the public API, with real tokens, against real
PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid

import grpc
import psycopg
import pytest

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
from tests.connect_client import connect_unary
from tests.harness import error_info, eventually, new_user

S = job_pb2
TOKENS = {"web": "audit-web-token", "operator": "audit-operator-token", "core": "audit-core-token"}
NAMES = {"web": "web-backend", "operator": "ops-alice", "core": "rust-core"}
ACTOR = {role: f"{role}:{name}" for role, name in NAMES.items()}
GRANT, CHARGE, REFUND = op_pb2.LEDGER_ENTRY_KIND_GRANT, op_pb2.LEDGER_ENTRY_KIND_CHARGE, op_pb2.LEDGER_ENTRY_KIND_REFUND


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("auth") / "auth.json"
    tokens = [{"name": NAMES[role], "role": role, "sha256": hashlib.sha256(t.encode()).hexdigest()} for role, t in TOKENS.items()]
    path.write_text(json.dumps({"tokens": tokens}))
    return str(path)


def _as(role: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[role]}"),)


def _admit_request(user: str) -> queue_pb2.AdmitRequest:
    return queue_pb2.AdmitRequest(
        user_id=user,
        idempotency_key=uuid.uuid4().hex,
        document=job_pb2.Document(uri="s3://theses/t.pdf"),
        sources=[job_pb2.Source(doi="10.1234/a")],
    )


async def _ledger(service, **filters: str) -> list[op_pb2.LedgerEntry]:  # type: ignore[no-untyped-def]
    """Every entry matching the filters, newest first, page by page."""
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    found, token = [], ""
    while True:
        page = await operator.ListLedgerEntries(
            op_pb2.ListLedgerEntriesRequest(**filters, page_size=2, page_token=token), timeout=10, metadata=_as("operator")
        )
        found.extend(page.entries)
        token = page.next_page_token
        if not token:
            return found


def _trail(entries: list[op_pb2.LedgerEntry]) -> list[tuple[int, int, str, str, str]]:
    """(kind, amount, job_id, actor, reason), oldest first."""
    return [(e.kind, e.amount, e.job_id, e.actor, e.reason) for e in reversed(entries)]


@pytest.fixture
async def audited(services, auth_file):  # type: ignore[no-untyped-def]
    """A replica with tokens configured (so every caller has an identity), the dev core calling
    back with the core's token, a 1 s release window, and the browser endpoint."""
    core = await services.core(callback_token=TOKENS["core"])
    return await services.start(
        core, auth_file=auth_file, http_addr="127.0.0.1:0", release_window_seconds=1.0, release_backoff_max_seconds=0.2
    )


async def test_each_credit_movement_records_the_caller_or_the_system_and_why(audited, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    stubs, core, user = audited.stubs, audited.core, new_user()
    caplog.set_level(logging.INFO, logger="queue_service.credits")

    # An operator grants; the web backend admits two jobs (the second waits for the slot) and
    # cancels the waiting one; the core fails the first and asks for its credit back.
    grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=5, idempotency_key="welcome-bonus")
    await stubs.credits.GrantCredits(grant, timeout=10, metadata=_as("operator"))
    first = (await stubs.queue.Admit(_admit_request(user), timeout=10, metadata=_as("web"))).job
    second = (await stubs.queue.Admit(_admit_request(user), timeout=10, metadata=_as("web"))).job
    assert second.status == S.JOB_STATUS_QUEUED
    await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=second.job_id, user_id=user), timeout=10, metadata=_as("web"))
    running = await _wait_for(stubs, first.job_id, S.JOB_STATUS_RUNNING)
    completion = callback_pb2.CompleteRunRequest(run_id=running.run_id, outcome=callback_pb2.RUN_OUTCOME_FAILED, refund_credit=True)
    await stubs.callback.CompleteRun(completion, timeout=10, metadata=_as("core"))

    # A third job's release never gets through: the service itself gives up and refunds.
    core.fail_releases = True
    third = (await stubs.queue.Admit(_admit_request(user), timeout=10, metadata=_as("web"))).job
    await _wait_for(stubs, third.job_id, S.JOB_STATUS_FAILED)
    core.fail_releases = False

    assert _trail(await _ledger(audited, user_id=user)) == [
        (GRANT, 5, "", ACTOR["operator"], "grant"),
        (CHARGE, -1, first.job_id, ACTOR["web"], "admit"),
        (CHARGE, -1, second.job_id, ACTOR["web"], "admit"),
        (REFUND, 1, second.job_id, ACTOR["web"], "cancel"),
        (REFUND, 1, first.job_id, ACTOR["core"], "completion"),
        (CHARGE, -1, third.job_id, ACTOR["web"], "admit"),
        (REFUND, 1, third.job_id, "system:release_give_up", "release_give_up"),
    ]
    newest_first = await _ledger(audited, user_id=user)
    assert newest_first[-1].idempotency_key == "welcome-bonus" and not newest_first[0].idempotency_key
    assert [e.entry_id for e in newest_first] == sorted((e.entry_id for e in newest_first), reverse=True)
    assert all(e.user_id == user and e.create_time.seconds > 0 for e in newest_first)
    assert sum(e.amount for e in newest_first) == await _balance(stubs, user) == 5

    # Each movement is logged at info with the same fields, after its commit: the give-up's line
    # may come a moment after the ledger shows its refund (the service runs in this event loop).
    def moved() -> list[tuple[str, int, str, str]]:
        return [
            (str(r.kind), r.amount, r.actor, str(r.reason))
            for r in caplog.records
            if r.getMessage() == "credits moved" and r.user_id == user
        ]

    await eventually(lambda: len(moved()) >= 7, what="the seventh credits moved line")
    assert moved() == [
        ("grant", 5, ACTOR["operator"], "grant"),
        ("charge", -1, ACTOR["web"], "admit"),
        ("charge", -1, ACTOR["web"], "admit"),
        ("refund", 1, ACTOR["web"], "cancel"),
        ("refund", 1, ACTOR["core"], "completion"),
        ("charge", -1, ACTOR["web"], "admit"),
        ("refund", 1, "system:release_give_up", "release_give_up"),
    ]


async def test_the_browser_endpoint_and_bulk_cancel_record_their_callers(audited) -> None:  # type: ignore[no-untyped-def]
    """The Connect road marks its caller like the gRPC road; a bulk cancel's concurrent cancels
    keep the operator who asked for them."""
    port, user = audited.app.http_port, new_user()
    status, _ = await connect_unary(
        port, "CreditsService/GrantCredits", {"userId": user, "amount": 2, "idempotencyKey": "g"}, TOKENS["operator"]
    )
    assert status == 200
    admit = {"userId": user, "idempotencyKey": "k1", "document": {"uri": "s3://t/1.pdf"}, "sources": [{"doi": "10.1234/a"}]}
    status, admitted = await connect_unary(port, "AnalysisQueueService/Admit", admit, TOKENS["web"])
    assert status == 200
    job_id = admitted["job"]["jobId"]
    operator = op_grpc.OperatorServiceStub(audited.stubs.channel)
    bulk = op_pb2.CancelJobsRequest(filter=op_pb2.JobFilter(user_id=user), max_jobs=1)
    assert (await operator.CancelJobs(bulk, timeout=10, metadata=_as("operator"))).canceled == 1
    assert _trail(await _ledger(audited, job_id=job_id)) == [
        (CHARGE, -1, job_id, ACTOR["web"], "admit"),
        (REFUND, 1, job_id, ACTOR["operator"], "cancel"),
    ]


async def test_the_ledger_is_for_operators_only(audited) -> None:  # type: ignore[no-untyped-def]
    operator = op_grpc.OperatorServiceStub(audited.stubs.channel)
    request = op_pb2.ListLedgerEntriesRequest(user_id=new_user())
    for role in ("web", "core"):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await operator.ListLedgerEntries(request, timeout=10, metadata=_as(role))
        code, reason, metadata, _ = error_info(raised.value)
        assert (code, reason, metadata["role"]) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED", role)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.ListLedgerEntries(request, timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    status, _ = await connect_unary(audited.app.http_port, "OperatorService/ListLedgerEntries", {"userId": "u"}, TOKENS["web"])
    assert status == 403
    assert list((await operator.ListLedgerEntries(request, timeout=10, metadata=_as("operator"))).entries) == []


async def test_ledger_pages_newest_first_by_user_by_job_and_across_users(audited, database_url: str) -> None:  # type: ignore[no-untyped-def]
    stubs, user, other = audited.stubs, new_user(), new_user()
    operator = op_grpc.OperatorServiceStub(stubs.channel)
    for index in range(5):
        grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=index + 1, idempotency_key=f"grant-{index}")
        await stubs.credits.GrantCredits(grant, timeout=10, metadata=_as("operator"))
    await stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=other, amount=9, idempotency_key="g"), timeout=10, metadata=_as("operator")
    )
    # An entry written by a replica of the previous version during a rolling deploy: no actor.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO credit_ledger (user_id, kind, amount, idempotency_key) VALUES (%s, 'grant', 7, 'old-replica')", (user,))
        conn.execute("UPDATE credit_accounts SET balance = balance + 7 WHERE user_id = %s", (user,))

    pages, token = [], ""
    while True:
        page = await operator.ListLedgerEntries(
            op_pb2.ListLedgerEntriesRequest(user_id=user, page_size=2, page_token=token), timeout=10, metadata=_as("operator")
        )
        pages.append([(e.amount, e.idempotency_key, e.actor) for e in page.entries])
        token = page.next_page_token
        if not token:
            break
    assert pages == [
        [(7, "old-replica", "unknown"), (5, "grant-4", ACTOR["operator"])],
        [(4, "grant-3", ACTOR["operator"]), (3, "grant-2", ACTOR["operator"])],
        [(2, "grant-1", ACTOR["operator"]), (1, "grant-0", ACTOR["operator"])],
    ]
    assert (await _ledger(audited, user_id=user))[0].reason == "unknown"

    # Across users, newest first: the other user's grant is older than the old replica's entry.
    newest = await operator.ListLedgerEntries(op_pb2.ListLedgerEntriesRequest(page_size=3), timeout=10, metadata=_as("operator"))
    assert [(e.user_id, e.amount) for e in newest.entries] == [(user, 7), (other, 9), (user, 5)]

    # By job, within one user or any.
    await stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=other, amount=1, idempotency_key="g2"), timeout=10, metadata=_as("operator")
    )
    job = (await stubs.queue.Admit(_admit_request(other), timeout=10, metadata=_as("web"))).job
    assert [e.kind for e in await _ledger(audited, job_id=job.job_id)] == [CHARGE]
    assert [e.kind for e in await _ledger(audited, job_id=job.job_id, user_id=other)] == [CHARGE]
    assert await _ledger(audited, job_id=job.job_id, user_id=user) == []

    # A token is tied to its filter; bad ids and sizes are named.
    first_page = await operator.ListLedgerEntries(
        op_pb2.ListLedgerEntriesRequest(user_id=user, page_size=1), timeout=10, metadata=_as("operator")
    )
    for request, field in [
        (op_pb2.ListLedgerEntriesRequest(user_id=other, page_token=first_page.next_page_token), "page_token"),
        (op_pb2.ListLedgerEntriesRequest(user_id=user, page_token="not-a-token"), "page_token"),
        (op_pb2.ListLedgerEntriesRequest(job_id="job-7"), "job_id"),
        (op_pb2.ListLedgerEntriesRequest(user_id="x" * 200), "user_id"),
        (op_pb2.ListLedgerEntriesRequest(page_size=101), "page_size"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await operator.ListLedgerEntries(request, timeout=10, metadata=_as("operator"))
        code, reason, _, violations = error_info(raised.value)
        assert (code, reason, [f for f, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", [field])


async def test_the_ledger_filters_by_actor_alone_or_within_a_user(audited) -> None:  # type: ignore[no-untyped-def]
    stubs, user, other = audited.stubs, new_user(), new_user()
    for who, amount in [(user, 3), (other, 4), (user, 5)]:
        grant = credits_pb2.GrantCreditsRequest(user_id=who, amount=amount, idempotency_key=uuid.uuid4().hex)
        await stubs.credits.GrantCredits(grant, timeout=10, metadata=_as("operator"))
    job = (await stubs.queue.Admit(_admit_request(user), timeout=10, metadata=_as("web"))).job

    by_operator = await _ledger(audited, actor=ACTOR["operator"])
    assert {e.actor for e in by_operator} == {ACTOR["operator"]}
    mine = [(e.user_id, e.amount) for e in by_operator if e.user_id in (user, other)]
    assert mine == [(user, 5), (other, 4), (user, 3)]
    assert [(e.amount, e.kind) for e in await _ledger(audited, actor=ACTOR["operator"], user_id=user)] == [(5, GRANT), (3, GRANT)]
    assert [(e.job_id, e.actor) for e in await _ledger(audited, actor=ACTOR["web"], user_id=user)] == [(job.job_id, ACTOR["web"])]
    assert await _ledger(audited, actor=ACTOR["operator"], job_id=job.job_id) == []
    assert [e.kind for e in await _ledger(audited, actor=ACTOR["web"], job_id=job.job_id)] == [CHARGE]

    # A page token is tied to its actor too; an actor id is checked like a user id.
    operator = op_grpc.OperatorServiceStub(stubs.channel)
    first_page = await operator.ListLedgerEntries(
        op_pb2.ListLedgerEntriesRequest(actor=ACTOR["operator"], page_size=1), timeout=10, metadata=_as("operator")
    )
    for request, field in [
        (op_pb2.ListLedgerEntriesRequest(actor=ACTOR["web"], page_token=first_page.next_page_token), "page_token"),
        (op_pb2.ListLedgerEntriesRequest(actor="a" * 200), "actor"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await operator.ListLedgerEntries(request, timeout=10, metadata=_as("operator"))
        code, reason, _, violations = error_info(raised.value)
        assert (code, reason, [f for f, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", [field])


async def test_without_authentication_the_actor_is_anonymous(service) -> None:  # type: ignore[no-untyped-def]
    user = new_user()
    await service.stubs.grant(user, 1)
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    entries = (await operator.ListLedgerEntries(op_pb2.ListLedgerEntriesRequest(user_id=user), timeout=10)).entries
    assert [(e.kind, e.actor, e.reason) for e in entries] == [(GRANT, "anonymous", "grant")]


async def _wait_for(stubs, job_id: str, status: int) -> job_pb2.Job:  # type: ignore[no-untyped-def]
    give_up_at = time.monotonic() + 15
    while True:
        job = (await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job_id), timeout=10, metadata=_as("operator"))).job
        if job.status == status:
            return job
        assert time.monotonic() < give_up_at, f"job {job_id} is {S.JobStatus.Name(job.status)}"
        await asyncio.sleep(0.02)


async def _balance(stubs, user: str) -> int:  # type: ignore[no-untyped-def]
    return (await stubs.credits.GetBalance(credits_pb2.GetBalanceRequest(user_id=user), timeout=10, metadata=_as("operator"))).balance
