"""Every action of the machine: each RPC of the contract as the role that calls it (a user through
the web backend, an operator, the core's callbacks), each fault the harness can inject, waits and
quiet periods. An action has a generator (what arguments it would take now, or None when it does
not apply) and a runner; `drives` names the RPCs it calls and `uses` the harness faults it
injects, which the guard (tests/repository/test_machine_guard.py) holds against protos/ and the
harness so that a new RPC or fault cannot be left out."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import psycopg
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2 as callback_pb2
from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.api.servicers import validation
from queue_service.dev.core import ANSWER_FAULT_KINDS, AnswerFault
from tests.faults import backend_pids, frozen
from tests.harness import error_info, stranger_holds_user_locks
from tests.machine import world as w
from tests.machine.machine import CALL_TIMEOUT, TRANSIENT, Machine, fault
from tests.machine.model import JobRecord

Q = "acurio.queue.v1.AnalysisQueueService/"
OP = "acurio.queue.v1.OperatorService/"
CR = "acurio.queue.v1.CreditsService/"
CB = "acurio.queue.v1.CoreCallbackService/"
CORE = "acurio.core.v1.RunService/"
CORE_METHODS = ("CreateRun", "ReleaseRun", "CancelRun", "GetRun", "ListRuns")
METHOD_WEIGHTS = {"CreateRun": 3, "ReleaseRun": 4, "CancelRun": 2, "GetRun": 1, "ListRuns": 1}

Args = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Action:
    name: str
    weight: float
    generate: Callable[[Machine, random.Random], Args | None]
    run: Callable[[Machine, Args], Awaitable[None]]
    drives: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()


ACTIONS: dict[str, Action] = {}


def action(
    name: str, *, weight: float = 1.0, drives: tuple[str, ...] = (), uses: tuple[str, ...] = ()
) -> Callable[[Callable[[Machine, Args], Awaitable[None]]], Callable[[Machine, Args], Awaitable[None]]]:
    def register(run: Callable[[Machine, Args], Awaitable[None]]) -> Callable[[Machine, Args], Awaitable[None]]:
        generate = GENERATORS.pop(name)
        ACTIONS[name] = Action(name, weight, generate, run, drives, uses)
        return run

    return register


GENERATORS: dict[str, Callable[[Machine, random.Random], Args | None]] = {}


def generator(name: str) -> Callable[[Callable[[Machine, random.Random], Args | None]], Callable[[Machine, random.Random], Args | None]]:
    def register(generate: Callable[[Machine, random.Random], Args | None]) -> Callable[[Machine, random.Random], Args | None]:
        GENERATORS[name] = generate
        return generate

    return register


# -- payloads ---------------------------------------------------------------------------------------

WIDE = "\U0001d49c"  # a 4-byte character (MATHEMATICAL SCRIPT CAPITAL A)
INVISIBLE = ("\u200b", "\u200d", "\u2060", "\ufeff", "\u0085", "\U000e0041")
PAYLOADS = ("small", "small", "small", "many", "wide_sources", "wide_text", "invisible", "rejected", "fails_judging")


def admit_request(user_id: str, key: str, payload: str, label: str, delta_of: str = "") -> queue_pb2.AdmitRequest:
    """The request of one payload kind: what validation accepts at its largest (4-byte text
    included), what it must refuse (invisible characters), what the dev core rejects or fails."""
    uri, title = f"s3://theses/{label}.pdf", f"Thesis {label}"
    dois = [f"10.1234/{label}.{i}" for i in range(3)]
    citation = "A cited work"
    if payload == "many":
        dois = [f"10.1234/{label}.{i}" for i in range(200)]
    elif payload == "wide_sources":
        # About the largest admit validation accepts: 1 MiB in all, every character 4 bytes, every
        # DOI at its longest (its characters, or its bytes where validation bounds them).
        count = min(950, validation.MAX_SOURCES)
        doi_bytes = getattr(validation, "MAX_DOI_BYTES", 4 * validation.MAX_DOI_CHARS)
        wide_in_doi = min(validation.MAX_DOI_CHARS - 12, (doi_bytes - 12) // 4)
        dois = [f"10.1234/{i:04d}" + WIDE * wide_in_doi for i in range(count)]
        room = validation.MAX_ADMIT_BYTES - 16_384 - count * (12 + 4 * wide_in_doi + 12)
        citation = WIDE * max(1, min(validation.MAX_CITATION_CHARS, room // count // 4))
    elif payload == "wide_text":
        uri_bytes = getattr(validation, "MAX_URI_BYTES", 4 * validation.MAX_URI_CHARS)
        uri = "s3://theses/" + WIDE * min(validation.MAX_URI_CHARS - 12, (uri_bytes - 12) // 4)
        title = WIDE * min(validation.MAX_TITLE_CHARS, getattr(validation, "MAX_TITLE_BYTES", 4 * validation.MAX_TITLE_CHARS) // 4)
    elif payload == "invisible":
        mark = random.Random(label).choice(INVISIBLE)
        which = random.Random(label + "f").choice(("doi", "title", "uri"))
        if which == "doi":
            dois[0] = f"10.1234/{label}{mark}x"
        elif which == "title":
            title = f"Thesis{mark}{label}"
        else:
            uri = f"s3://theses/{mark}{label}.pdf"
    elif payload == "rejected":
        dois[1] = f"10.9999/{label}"
    elif payload == "fails_judging":
        uri = f"s3://theses/{label}-fail-judging.pdf"
    return queue_pb2.AdmitRequest(
        user_id=user_id,
        idempotency_key=key,
        document=job_pb2.Document(uri=uri, title=title),
        sources=[job_pb2.Source(doi=doi, citation=citation) for doi in dois],
        delta_of_job_id=delta_of,
    )


# -- helpers ----------------------------------------------------------------------------------------


def _user(m: Machine, rng: random.Random) -> int:
    return rng.randrange(len(m.model.users))


def _label(m: Machine, rng: random.Random, user: int | None = None, *, first_pass: bool | None = None) -> str | None:
    labels = [
        r.label
        for r in m.model.jobs.values()
        if r.job_id and (user is None or r.user == user) and (first_pass is None or r.delta != first_pass)
    ]
    return rng.choice(labels) if labels else None


def _job(m: Machine, args: Args, key: str = "job") -> JobRecord | None:
    record = m.model.jobs.get(args.get(key, ""))
    return record if record is not None and record.job_id else None


async def _admit(m: Machine, record: JobRecord, request: queue_pb2.AdmitRequest, replica: int) -> Any:
    user = m.model.users[record.user]
    before = await asyncio.to_thread(_balance_sync, m, user.user_id)
    answer = await m.ask(Q + "Admit", "web", request, replica=replica)
    if isinstance(answer, grpc.aio.AioRpcError):
        await _judge_admit_refusal(m, record, answer, before)
        if answer.code() in TRANSIENT and not record.payload.get("again"):
            m.retry_in_quiet.append(lambda: _admit_again(m, record, request))
        return answer
    if answer is not None:
        record.job_id, record.run_id, record.price = answer.job.job_id, answer.job.run_id, answer.job.price
        if record.payload.get("kind") == "invisible":
            m.violate("text fields", f"an Admit with an invisible character ({record.payload}) was accepted", once="invisible")
        if record.delta and answer.job.status == job_pb2.JOB_STATUS_QUEUED:
            m.violate("I6", f"delta {answer.job.job_id} was queued")
        if record.delta and record.price == 0:
            user.own_free_work.append((time.time(), record.job_id))
    return answer


async def _admit_again(m: Machine, record: JobRecord, request: queue_pb2.AdmitRequest) -> None:
    """An Admit that was answered "retry" is retried, same key, in a quiet period: a request that
    can succeed now succeeds (or is refused for good); one answered "retry" again never will."""
    record.payload["again"] = True
    answer: Any = None
    for attempt in range(3):  # a transient refusal (a busy pool on a starved machine) passes
        answer = await _admit(m, record, request, replica=attempt)
        if not (isinstance(answer, grpc.aio.AioRpcError) and answer.code() in TRANSIENT):
            return
        await asyncio.sleep(1.0)
    if isinstance(answer, grpc.aio.AioRpcError):
        m.violate(
            "no retryable answer without a cause",
            f"an Admit ({record.payload.get('kind')}) answered {answer.code().name} {error_info(answer)[1]} again when retried with"
            f" no fault in play: retrying can never help it ({answer.details()[:200]})",
            once=f"again:{record.payload.get('kind')}",
        )


def _balance_sync(m: Machine, user_id: str) -> int:
    try:
        with psycopg.connect(m.world.database_url, autocommit=True) as conn:
            row = conn.execute("SELECT balance FROM credit_accounts WHERE user_id = %s", (user_id,)).fetchone()
        return int(row[0]) if row else 0
    except psycopg.Error:
        return -1


async def _judge_admit_refusal(m: Machine, record: JobRecord, exc: grpc.aio.AioRpcError, balance_before: int) -> None:
    """A caller with credits is refused only for a stated reason that holds (docs/design.md)."""
    from tests.machine.machine import ADMIT_REASONS_WITH_CREDIT

    user = m.model.users[record.user]
    code, reason = exc.code(), error_info(exc)[1]
    if code not in TRANSIENT and reason not in ("OUTCOME_UNKNOWN",) and not record.payload.get("repeat"):
        user.refused.append((record.key, reason))
    if reason not in ADMIT_REASONS_WITH_CREDIT:
        m.violate("stated reasons", f"an Admit was refused {code.name} {reason}: {exc.details()[:200]}", once=f"reason:{reason}")
    if reason == "INSUFFICIENT_CREDITS":
        after = await asyncio.to_thread(_balance_sync, m, user.user_id)
        if min(balance_before, after) >= max(1, record.price or 1):
            m.violate("refused with credits", f"{user.user_id} with {min(balance_before, after)} credits was refused INSUFFICIENT_CREDITS")
    if reason == "USER_FREE_WORK_LIMIT":
        hour_ago = time.time() - 3600
        own = sum(1 for t, _ in user.own_free_work if t > hour_ago)
        if own < w.FREE_WORK_PER_HOUR:
            m.violate(
                "free work she chose",
                f"{user.user_id} was refused USER_FREE_WORK_LIMIT ({w.FREE_WORK_PER_HOUR} an hour) after {own} free jobs of her own choosing",
                once=f"freework:{user.user_id}",
            )
    if reason == "INVALID_REQUEST" and record.payload.get("kind") not in ("invisible",):
        m.violate(
            "valid request refused",
            f"a valid Admit ({record.payload.get('kind')}) was refused INVALID_REQUEST: {exc.details()[:300]}",
            once=f"invalid:{record.payload.get('kind')}",
        )
    if reason == "CORE_REJECTED" and record.payload.get("kind") != "rejected":
        m.violate("valid request refused", f"an Admit the core accepts was refused CORE_REJECTED: {exc.details()[:200]}")


# -- the web backend's calls --------------------------------------------------------------------------


@generator("admit")
def _gen_admit(m: Machine, rng: random.Random) -> Args:
    return {"user": _user(m, rng), "payload": rng.choice(PAYLOADS), "replica": rng.randrange(8)}


@action("admit", weight=10, drives=(Q + "Admit",))
async def admit(m: Machine, args: Args) -> None:
    label = f"j{m.step_index}"
    user = m.model.users[args["user"]]
    key = f"{label}-{m.world.database[-6:]}"
    record = JobRecord(label, args["user"], key, {"kind": args["payload"]})
    m.model.jobs[label] = record
    user.jobs.append(label)
    await _admit(m, record, admit_request(user.user_id, key, args["payload"], label), args["replica"])


@generator("admit_repeats")
def _gen_repeats(m: Machine, rng: random.Random) -> Args:
    return {"user": _user(m, rng), "copies": rng.randint(2, 6)}


@action("admit_repeats", weight=1.5, drives=(Q + "Admit",))
async def admit_repeats(m: Machine, args: Args) -> None:
    """A double click, or a client's retries racing: copies of one admit at once on every replica.
    They answer one job (I7), and only one reaches the core (a created-then-canceled run for each
    copy is work no limit counts)."""
    label = f"j{m.step_index}"
    user = m.model.users[args["user"]]
    key = f"{label}-{m.world.database[-6:]}"
    request = admit_request(user.user_id, key, "many", label)
    record = JobRecord(label, args["user"], key, {"kind": "many", "repeat": True})
    m.model.jobs[label] = record
    user.jobs.append(label)
    runs_before = {r for r, run in m.world.core.runs.items() if run.user_id == user.user_id}
    started = time.monotonic()
    answers = await asyncio.gather(*[_admit(m, record, request, replica) for replica in range(args["copies"])])
    # A copy waits for the first one's outcome at most half its deadline, then may take the key
    # over (the first one taken for gone): on a starved machine that is one more run, not a repeat.
    waited_out = time.monotonic() - started >= CALL_TIMEOUT / 2
    jobs = {a.job.job_id for a in answers if a is not None and not isinstance(a, grpc.aio.AioRpcError)}
    if len(jobs) > 1:
        m.violate("I7", f"{args['copies']} copies of one admit answered {len(jobs)} jobs")
    created = {r for r, run in m.world.core.runs.items() if run.user_id == user.user_id} - runs_before
    # A copy that failed (its run canceled) hands the key to the next: one more run each; and one
    # more for a first CreateRun whose answer came too late on a starved machine (canceled, and
    # the admit made again under a fresh run).
    failed = sum(1 for a in answers if isinstance(a, grpc.aio.AioRpcError) and a.code() in TRANSIENT)
    if len(created) > 2 + failed and m.model.quiet_for() > 2 and not waited_out:
        m.violate(
            "one call to the core per admit",
            f"{args['copies']} concurrent copies of one admit created {len(created)} runs at the core ({failed} of them failed)",
            once="repeats",
        )


@generator("admit_delta")
def _gen_delta(m: Machine, rng: random.Random) -> Args | None:
    base = _label(m, rng, first_pass=True)
    if base is None:
        return None
    owner = m.model.jobs[base].user
    return {"user": owner if rng.random() < 0.9 else _user(m, rng), "base": base, "replica": rng.randrange(8)}


@action("admit_delta", weight=4, drives=(Q + "Admit",))
async def admit_delta(m: Machine, args: Args) -> None:
    base = _job(m, args, "base")
    if base is None:
        return
    label = f"j{m.step_index}"
    user = m.model.users[args["user"]]
    key = f"{label}-{m.world.database[-6:]}"
    record = JobRecord(label, args["user"], key, {"kind": "delta"}, delta=True)
    m.model.jobs[label] = record
    user.jobs.append(label)
    await _admit(m, record, admit_request(user.user_id, key, "small", label, delta_of=base.job_id), args["replica"])


def _gen_job_call(m: Machine, rng: random.Random) -> Args | None:
    job = _label(m, rng)
    return None if job is None else {"job": job, "replica": rng.randrange(8)}


for _name in ("cancel_job", "cancel_job_as_operator", "get_job", "release", "retry_job", "complete_again"):
    generator(_name)(_gen_job_call)


@action("cancel_job", weight=1.5, drives=(Q + "CancelJob",))
async def cancel_job(m: Machine, args: Args) -> None:
    record = _job(m, args)
    if record is None:
        return
    user = m.model.users[record.user]
    answer = await m.ask(
        Q + "CancelJob", "web", queue_pb2.CancelJobRequest(job_id=record.job_id, user_id=user.user_id), replica=args["replica"]
    )
    if record.price > 0 and not (isinstance(answer, grpc.aio.AioRpcError) and answer.code() == grpc.StatusCode.FAILED_PRECONDITION):
        user.own_free_work.append((time.time(), record.job_id))  # her own cancel: free work she chose (maybe applied)


@action("cancel_job_as_operator", weight=0.7, drives=(Q + "CancelJob",))
async def cancel_job_as_operator(m: Machine, args: Args) -> None:
    record = _job(m, args)
    if record is None:
        return
    user = m.model.users[record.user]
    await m.ask(
        Q + "CancelJob", "operator", queue_pb2.CancelJobRequest(job_id=record.job_id, user_id=user.user_id), replica=args["replica"]
    )


@action("get_job", weight=1, drives=(Q + "GetJob",))
async def get_job(m: Machine, args: Args) -> None:
    record = _job(m, args)
    if record is None:
        return
    await m.ask(Q + "GetJob", "web", queue_pb2.GetJobRequest(job_id=record.job_id), replica=args["replica"])


def _gen_user_call(m: Machine, rng: random.Random) -> Args:
    return {"user": _user(m, rng), "replica": rng.randrange(8)}


for _name in (
    "list_jobs",
    "promote",
    "get_balance",
    "get_user_settings",
    "reopen_stream",
    "search_jobs",
    "list_ledger",
    "cancel_jobs",
    "retry_jobs",
):
    generator(_name)(_gen_user_call)


@action("list_jobs", weight=1, drives=(Q + "ListJobs",))
async def list_jobs(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    await m.ask(Q + "ListJobs", "web", queue_pb2.ListJobsRequest(user_id=user.user_id, page_size=5), replica=args["replica"])


@action("reopen_stream", weight=0.7, drives=(Q + "WatchJobs",))
async def reopen_stream(m: Machine, args: Args) -> None:
    """A dashboard reloads: one user's WatchJobs stream ends and a new one opens (they stay open
    on random replicas all through the run)."""
    m.model.rpcs_driven[Q + "WatchJobs"] += 1
    stream = m.streams[args["user"] % len(m.streams)]
    if stream.task is not None:
        stream.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stream.task
    stream.task = asyncio.create_task(w.keep_stream_open(m.world, stream, random.Random(args["replica"])))


# -- the operator's calls ------------------------------------------------------------------------------


@action("promote", weight=0.7, drives=(Q + "Promote",))
async def promote(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    await m.ask(Q + "Promote", "operator", queue_pb2.PromoteRequest(user_id=user.user_id), replica=args["replica"])


@action("release", weight=0.7, drives=(Q + "Release",))
async def release(m: Machine, args: Args) -> None:
    record = _job(m, args)
    if record is None:
        return
    await m.ask(Q + "Release", "operator", queue_pb2.ReleaseRequest(job_id=record.job_id), replica=args["replica"])


@generator("grant_credits")
def _gen_grant(m: Machine, rng: random.Random) -> Args:
    return {"user": _user(m, rng), "amount": rng.choice((1, 5, 20)), "again": rng.random() < 0.3, "replica": rng.randrange(8)}


@action("grant_credits", weight=1, drives=(CR + "GrantCredits",))
async def grant_credits(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    key = f"grant-{user.user_id}-{m.step_index if not args['again'] else 'again'}"
    await m.ask(
        CR + "GrantCredits",
        "operator",
        credits_pb2.GrantCreditsRequest(user_id=user.user_id, amount=args["amount"], idempotency_key=key),
        replica=args["replica"],
    )


@action("get_balance", weight=0.7, drives=(CR + "GetBalance",))
async def get_balance(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    await m.ask(CR + "GetBalance", "operator", credits_pb2.GetBalanceRequest(user_id=user.user_id), replica=args["replica"])


@generator("reads")
def _gen_reads(m: Machine, rng: random.Random) -> Args:
    return {"replica": rng.randrange(8)}


@action(
    "reads",
    weight=1,
    drives=(OP + "GetOverview", OP + "ListSettingChanges", OP + "ListUsersWithWork", OP + "GetQueueHistory", OP + "ListReplicas"),
)
async def reads(m: Machine, args: Args) -> None:
    """The console's Overview: what an operator's screen reads every few seconds."""
    r = args["replica"]
    await m.ask(OP + "GetOverview", "operator", op_pb2.GetOverviewRequest(), replica=r)
    await m.ask(OP + "ListSettingChanges", "operator", op_pb2.ListSettingChangesRequest(page_size=5), replica=r)
    await m.ask(OP + "ListUsersWithWork", "operator", op_pb2.ListUsersWithWorkRequest(page_size=10), replica=r)
    await m.ask(OP + "GetQueueHistory", "operator", op_pb2.GetQueueHistoryRequest(window_minutes=5), replica=r)
    await m.ask(OP + "ListReplicas", "operator", op_pb2.ListReplicasRequest(), replica=r)


generator("watch_overview")(_gen_reads)


@action("watch_overview", weight=0.5, drives=(OP + "WatchOverview",))
async def watch_overview(m: Machine, args: Args) -> None:
    m.model.rpcs_driven[OP + "WatchOverview"] += 1
    if not m.world.replicas:
        return
    replica = m.world.replicas[args["replica"] % len(m.world.replicas)]
    call = replica.stubs.operator.WatchOverview(
        op_pb2.WatchOverviewRequest(interval_ms=1000), metadata=w.RoleStubs.metadata("operator"), timeout=3
    )
    try:
        async for _ in call:
            break
        m.model.codes[OP + "WatchOverview:OK"] += 1
    except grpc.aio.AioRpcError as exc:
        m.model.codes[f"{OP}WatchOverview:{exc.code().name}"] += 1
    finally:
        call.cancel()


generator("viewer_reads")(_gen_reads)


@action("viewer_reads", weight=0.5, drives=(OP + "GetOverview", OP + "SearchJobs", OP + "ListAuditEvents"))
async def viewer_reads(m: Machine, args: Args) -> None:
    """A wall screen or support staff with a viewer token: it reads what an operator reads, and
    any change it asks for is refused (PERMISSION_DENIED), whatever else is going on."""
    r = args["replica"]
    await m.ask(OP + "GetOverview", "viewer", op_pb2.GetOverviewRequest(), replica=r)
    await m.ask(OP + "SearchJobs", "viewer", op_pb2.SearchJobsRequest(page_size=5), replica=r)
    await m.ask(OP + "ListAuditEvents", "viewer", op_pb2.ListAuditEventsRequest(page_size=5), replica=r)
    if not m.world.replicas:
        return
    replica = m.world.replicas[r % len(m.world.replicas)]
    user = m.model.users[r % len(m.model.users)]
    writes = (
        replica.stubs.operator.SetCoreCapacity(
            op_pb2.SetCoreCapacityRequest(capacity=1), metadata=w.RoleStubs.metadata("viewer"), timeout=CALL_TIMEOUT
        ),
        replica.stubs.credits.GrantCredits(
            credits_pb2.GrantCreditsRequest(user_id=user.user_id, amount=1, idempotency_key=f"viewer-{m.step_index}"),
            metadata=w.RoleStubs.metadata("viewer"),
            timeout=CALL_TIMEOUT,
        ),
    )
    for write in writes:
        try:
            await write
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.PERMISSION_DENIED, *TRANSIENT):
                continue
            m.violate("roles", f"a viewer's change was answered {exc.code().name}, not PERMISSION_DENIED", once="viewer-code")
        else:
            m.violate("roles", "a viewer token changed something (SetCoreCapacity or GrantCredits was answered OK)", once="viewer-write")


@generator("standard_services")
def _gen_standard(m: Machine, rng: random.Random) -> Args:
    return {"replica": rng.randrange(8)}


@action(
    "standard_services", weight=0.3, drives=("grpc.health.v1.Health/Check", "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
)
async def standard_services(m: Machine, args: Args) -> None:
    """The load balancer's health check and a grpcurl user's reflection."""
    if not m.world.replicas:
        return
    replica = m.world.replicas[args["replica"] % len(m.world.replicas)]
    for rpc in ACTIONS["standard_services"].drives:
        m.model.rpcs_driven[rpc] += 1
    with contextlib.suppress(grpc.aio.AioRpcError):
        await replica.health.health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT)
    stub = reflection_pb2_grpc.ServerReflectionStub(replica.channel)
    call = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=w.RoleStubs.metadata("operator"), timeout=CALL_TIMEOUT
    )
    with contextlib.suppress(grpc.aio.AioRpcError):
        async for _ in call:
            break


# Payloads whose first source's DOI is `10.1234/<label>.0` (admit_request).
_CITES_ITS_LABEL = {"small", "many", "rejected", "fails_judging"}


@action("search_jobs", weight=0.7, drives=(OP + "SearchJobs",))
async def search_jobs(m: Machine, args: Args) -> None:
    """The operator's search within one user; every other step by the DOI her latest job cites
    too, so the search by DOI's own query (its bucket index) meets every fault as well. Every job
    shown is hers."""
    user = m.model.users[args["user"]]
    search = op_pb2.JobFilter(user_id=user.user_id)
    cited = [label for label in user.jobs if m.model.jobs[label].payload.get("kind") in _CITES_ITS_LABEL]
    if cited and m.step_index % 2:
        search.source_doi = f"10.1234/{cited[-1]}.0"
    answer = await m.ask(OP + "SearchJobs", "operator", op_pb2.SearchJobsRequest(filter=search, page_size=10), replica=args["replica"])
    if answer is not None and not isinstance(answer, grpc.aio.AioRpcError):
        m.model.checks["search by DOI" if search.source_doi else "search"] += 1
        strangers = [job.job_id for job in answer.jobs if job.user_id != user.user_id]
        if strangers:
            m.violate("search", f"a search within {user.user_id} showed others' jobs: {strangers[:3]}", once=f"search:{strangers[0]}")


@action("list_ledger", weight=0.5, drives=(OP + "ListLedgerEntries",))
async def list_ledger(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    await m.ask(
        OP + "ListLedgerEntries", "operator", op_pb2.ListLedgerEntriesRequest(user_id=user.user_id, page_size=10), replica=args["replica"]
    )


@action("cancel_jobs", weight=0.4, drives=(OP + "CancelJobs",))
async def cancel_jobs(m: Machine, args: Args) -> None:
    """An operator's bulk cancel of one user's live jobs (a dry run first, as the console does)."""
    user = m.model.users[args["user"]]
    search = op_pb2.JobFilter(user_id=user.user_id)
    for dry_run in (True, False):
        await m.call(
            OP + "CancelJobs",
            "operator",
            lambda s, md, dry_run=dry_run: s.operator.CancelJobs(
                op_pb2.CancelJobsRequest(filter=search, dry_run=dry_run, max_jobs=20), metadata=md, timeout=CALL_TIMEOUT
            ),
            replica=args["replica"],
        )


@generator("set_capacity")
def _gen_capacity(m: Machine, rng: random.Random) -> Args:
    return {"capacity": rng.choice((0, 1, 1, 2, 2, 3)), "replica": rng.randrange(8)}


@action("set_capacity", weight=1.2, drives=(OP + "SetCoreCapacity",))
async def set_capacity(m: Machine, args: Args) -> None:
    """Unlimited (0), or N; lowered while full, the runs granted before may run on until they end."""
    capacity = args["capacity"]
    before = set(m.world.observer.judging)
    with psycopg.connect(m.world.database_url, autocommit=True) as conn:
        before |= {
            str(r) for (r,) in conn.execute("SELECT run_id FROM analysis_jobs WHERE capacity_token IS NOT NULL OR status = 'running'")
        }
    request = op_pb2.SetCoreCapacityRequest(unlimited=True) if capacity == 0 else op_pb2.SetCoreCapacityRequest(capacity=capacity)
    answer = await m.ask(OP + "SetCoreCapacity", "operator", request, replica=args["replica"])
    if answer is None or isinstance(answer, grpc.aio.AioRpcError):
        # Maybe applied, maybe not (a refusal during an outage applied nothing; a lost answer
        # did): the core is held to the looser of the two until the rows say which is in force
        # (Machine.settle_capacity), everything granted so far allowed to run on.
        m.model.grandfathered_runs |= before
        old = m.model.capacity
        m.model.capacity = None if old is None or not capacity else max(old, capacity)
        m.model.capacity_unsettled = capacity
        return
    old = m.model.capacity
    m.model.capacity = capacity or None
    m.model.capacity_unsettled = None
    if capacity and (old is None or capacity < old):
        m.model.grandfathered_runs |= before


@generator("pause")
def _gen_pause(m: Machine, rng: random.Random) -> Args:
    return {"fleet": rng.random() < 0.3, "user": _user(m, rng), "paused": rng.random() < 0.55, "replica": rng.randrange(8)}


@action("pause", weight=1.5, drives=(OP + "SetReleasesPaused",))
async def pause(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    request = op_pb2.SetReleasesPausedRequest(paused=args["paused"], user_id="" if args["fleet"] else user.user_id, note="machine")
    # While the call is in flight its outcome is unknown: the pause counts from before it.
    now = time.time()
    if args["paused"]:
        intervals = m.model.fleet_pauses if args["fleet"] else m.model.pauses[user.index]
        if not intervals or intervals[-1].end is not None:
            from tests.machine.model import Interval

            intervals.append(Interval(now))
    answer = await m.ask(OP + "SetReleasesPaused", "operator", request, replica=args["replica"])
    applied = answer is not None and not isinstance(answer, grpc.aio.AioRpcError)
    if args["fleet"]:
        m.model.fleet_paused = args["paused"] if applied else (m.model.fleet_paused or args["paused"])
        intervals = m.model.fleet_pauses
    else:
        user.paused = args["paused"] if applied else (user.paused or args["paused"])
        intervals = m.model.pauses[user.index]
    if not args["paused"] and applied and intervals and intervals[-1].end is None:
        intervals[-1].end = time.time()


@action("get_user_settings", weight=0.4, drives=(OP + "GetUserSettings",))
async def get_user_settings(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    await m.ask(OP + "GetUserSettings", "operator", op_pb2.GetUserSettingsRequest(user_id=user.user_id), replica=args["replica"])


@generator("set_user_limit")
def _gen_limit(m: Machine, rng: random.Random) -> Args:
    return {"user": _user(m, rng), "max_active": rng.choice((1, 1, 2)), "replica": rng.randrange(8)}


@action("set_user_limit", weight=0.5, drives=(OP + "SetUserQueueLimit",))
async def set_user_limit(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    # I9 is judged against the larger limit from here on: a lowered one is reached as runs end.
    user.max_active = max(user.max_active, args["max_active"])
    await m.ask(
        OP + "SetUserQueueLimit",
        "operator",
        op_pb2.SetUserQueueLimitRequest(user_id=user.user_id, max_active=args["max_active"]),
        replica=args["replica"],
    )


def _judge_retry_refusal(m: Machine, reason: str, message: str) -> None:
    if reason == "USER_FREE_WORK_LIMIT":
        m.violate(
            "free work she chose", f"an operator's retry was refused by the user's free-work limit: {message[:200]}", once="retry-freework"
        )


@action("retry_job", weight=1.2, drives=(OP + "RetryJob",))
async def retry_job(m: Machine, args: Args) -> None:
    record = _job(m, args)
    if record is None:
        return
    answer = await m.ask(OP + "RetryJob", "operator", op_pb2.RetryJobRequest(job_id=record.job_id), replica=args["replica"])
    if isinstance(answer, grpc.aio.AioRpcError):
        _judge_retry_refusal(m, error_info(answer)[1], answer.details())
    elif answer is not None:
        label = f"j{m.step_index}"
        retried = JobRecord(
            label,
            record.user,
            f"retry:{record.job_id}",
            {"kind": "retry"},
            job_id=answer.job.job_id,
            run_id=answer.job.run_id,
            price=answer.job.price,
        )
        m.model.jobs[label] = retried
        m.model.users[record.user].jobs.append(label)


@action("retry_jobs", weight=0.5, drives=(OP + "RetryJobs",))
async def retry_jobs(m: Machine, args: Args) -> None:
    user = m.model.users[args["user"]]
    search = op_pb2.JobFilter(user_id=user.user_id, statuses=[job_pb2.JOB_STATUS_FAILED, job_pb2.JOB_STATUS_CANCELED])
    answer = await m.ask(OP + "RetryJobs", "operator", op_pb2.RetryJobsRequest(filter=search, max_jobs=3), replica=args["replica"])
    if answer is not None and not isinstance(answer, grpc.aio.AioRpcError):
        for failure in answer.failures:
            _judge_retry_refusal(m, failure.reason, failure.message)
        for job in answer.jobs:
            label = f"j{m.step_index}.{job.job_id[:4]}"
            m.model.jobs[label] = JobRecord(
                label,
                args["user"],
                f"retry:{job.retry_of_job_id}",
                {"kind": "retry"},
                job_id=job.job_id,
                run_id=job.run_id,
                price=job.price,
            )
            user.jobs.append(label)


generator("check_with_core")(_gen_job_call)


@action("check_with_core", weight=0.5, drives=(OP + "CheckJobWithCore",))
async def check_with_core(m: Machine, args: Args) -> None:
    """An operator's "Check with the core now" on one job: the reconciliation, asked for at once."""
    record = _job(m, args)
    if record is None:
        return
    await m.ask(OP + "CheckJobWithCore", "operator", op_pb2.CheckJobWithCoreRequest(job_id=record.job_id), replica=args["replica"])


@generator("audit_reads")
def _gen_audit_reads(m: Machine, rng: random.Random) -> Args:
    return {"user": _user(m, rng), "by_user": rng.random() < 0.5, "replica": rng.randrange(8)}


@action("audit_reads", weight=0.4, drives=(OP + "ListReleasePauses", OP + "ListAuditEvents"))
async def audit_reads(m: Machine, args: Args) -> None:
    """The console's pauses in force and its audit timeline (all of it, or one user's)."""
    user_id = m.model.users[args["user"]].user_id if args["by_user"] else ""
    await m.ask(OP + "ListReleasePauses", "operator", op_pb2.ListReleasePausesRequest(), replica=args["replica"])
    await m.ask(OP + "ListAuditEvents", "operator", op_pb2.ListAuditEventsRequest(user_id=user_id, page_size=20), replica=args["replica"])


# -- the core's calls ------------------------------------------------------------------------------------


@generator("core_finishes")
def _gen_core_finishes(m: Machine, rng: random.Random) -> Args | None:
    judging = [r.label for r in m.model.jobs.values() if r.run_id and r.run_id in m.world.core.judging_all]
    if not judging:
        return None
    return {"job": rng.choice(judging), "outcome": rng.choice(("failed_refund", "failed_refund", "failed", "succeeded"))}


@action("core_finishes", weight=2, drives=(CB + "CompleteRun",))
async def core_finishes(m: Machine, args: Args) -> None:
    """The core ends a judging run now: succeeded, failed, or failed with the credit refunded
    (the provider failed), and calls CompleteRun."""
    record = _job(m, args)
    if record is None or record.run_id not in m.world.core.judging_all:
        return
    outcome = args["outcome"]
    m.model.rpcs_driven[CB + "CompleteRun"] += 1
    with contextlib.suppress(grpc.aio.AioRpcError, KeyError):
        await m.world.core.finish(record.run_id, succeeded=outcome == "succeeded", refund_credit=outcome == "failed_refund")


@action("complete_again", weight=0.6, drives=(CB + "CompleteRun",))
async def complete_again(m: Machine, args: Args) -> None:
    """The core sends a completion again (its retry after a lost answer), or one for a run it
    never judged: a harmless no-op either way (a run never released, QUEUED or waiting for the
    capacity, is RUN_NOT_RELEASED and its job keeps its place; I10 sees the held run stay live)."""
    record = _job(m, args)
    if record is None:
        return
    request = callback_pb2.CompleteRunRequest(run_id=record.run_id, outcome=callback_pb2.RUN_OUTCOME_SUCCEEDED, message="again")
    await m.ask(CB + "CompleteRun", "core", request, replica=args["replica"])


# -- faults -------------------------------------------------------------------------------------------------


@generator("answer_fault")
def _gen_answer_fault(m: Machine, rng: random.Random) -> Args:
    # Weighted by how much rides on each call: a release and a create decide the most.
    kind = rng.choices(ANSWER_FAULT_KINDS, weights=[3 if k == "lose" else 2 for k in ANSWER_FAULT_KINDS])[0]
    return {
        "method": rng.choices(CORE_METHODS, weights=[METHOD_WEIGHTS[m] for m in CORE_METHODS])[0],
        "kind": kind,
        "probability": rng.choice((0.5, 1.0, 1.0)),
        "code": rng.choice(("UNAVAILABLE", "RESOURCE_EXHAUSTED")) if kind == "refuse" else "",
        "seconds": rng.uniform(1.2, 3.0) * w.CORE_DEADLINE if kind in ("late", "late_arrival") else 0.0,
    }


@action("answer_fault", weight=2, drives=tuple(CORE + m for m in CORE_METHODS), uses=tuple(f"answer:{k}" for k in ANSWER_FAULT_KINDS))
async def answer_fault(m: Machine, args: Args) -> None:
    """From now until a heal: a share of one core method's calls is applied with its answer lost,
    answered late, arrives late, or is refused."""
    code = grpc.StatusCode[args["code"]] if args["code"] else grpc.StatusCode.UNAVAILABLE
    m.world.core.answer_faults[args["method"]] = AnswerFault(args["kind"], args["seconds"], args["probability"], code)
    m.model.fault_started(f"answer:{args['method']}:{args['kind']}")
    m.model.rpcs_driven[CORE + args["method"]] += 1


SWITCHES = {
    "unavailable": True,
    "slow_seconds": 1.5 * w.CORE_DEADLINE,
    "fail_releases": True,
    "refuse_releases": True,
    "drop_callbacks": True,
    "fail_canceled_runs": True,
    "judging_ceiling": 1,
    "daily_budget": 0,
    "hold_expiry_seconds": 8.0,
}


@generator("core_switch")
def _gen_switch(m: Machine, rng: random.Random) -> Args:
    return {"switch": rng.choice(sorted(SWITCHES))}


@action("core_switch", weight=0.8, uses=tuple(f"switch:{s}" for s in SWITCHES))
async def core_switch(m: Machine, args: Args) -> None:
    """The core misbehaves from now until a heal (unavailable, slow, failing or refusing releases,
    dropping its callbacks, failing canceled runs, at its ceiling, out of budget, expiring holds)."""
    setattr(m.world.core, args["switch"], SWITCHES[args["switch"]])
    m.model.fault_started(f"switch:{args['switch']}")


@generator("heal")
def _gen_heal(m: Machine, rng: random.Random) -> Args | None:
    return {"fault": rng.choice(sorted(m.model.faults))} if m.model.faults else None


@action("heal", weight=2.5)
async def heal(m: Machine, args: Args) -> None:
    name = args["fault"]
    core = m.world.core
    if name.startswith("answer:"):
        core.answer_faults.pop(name.split(":")[1], None)
    elif name.startswith("switch:"):
        switch = name.split(":")[1]
        setattr(core, switch, getattr(w.WatchedCore(w.CoreObserver()), switch))
    elif name == "database_outage":
        await m.world.proxy.up()
    elif name == "late_commits":
        with contextlib.suppress(psycopg.Error):
            await asyncio.to_thread(m.world.commits_acknowledged_late, False)
    elif name == "cut_at_statement":
        m.world.proxy._cut_pattern = None
    m.model.fault_ended(name)


@generator("core_restart")
def _gen_core_restart(m: Machine, rng: random.Random) -> Args:
    return {"forget_runs": rng.random() < 0.6}


@action("core_restart", weight=0.6, uses=("core_restart:keep_runs", "core_restart:forget_runs", "World.restart_core"))
async def core_restart(m: Machine, args: Args) -> None:
    name = "core_restart"
    with fault(m.model, name):
        await m.world.restart_core(forget_runs=args["forget_runs"])


@generator("replica_kill")
def _gen_replica(m: Machine, rng: random.Random) -> Args:
    return {"seed": rng.randrange(1000)}


async def _database_reachable(m: Machine) -> None:
    """A replica comes up only once PostgreSQL answers and commits (as a new pod is not ready
    before): a kill or a deploy ends an outage or late commits first, or it would wait for ever."""
    for name in ("database_outage", "late_commits"):
        if name in m.model.faults:
            await ACTIONS["heal"].run(m, {"fault": name})


@action("replica_kill", weight=0.5, uses=("World.kill_replica",))
async def replica_kill(m: Machine, args: Args) -> None:
    await _database_reachable(m)
    with fault(m.model, "replica_kill"):
        await m.world.kill_replica(random.Random(args["seed"]))


generator("rolling_deploy")(_gen_replica)


@action("rolling_deploy", weight=0.25, uses=("World.rolling_deploy",))
async def rolling_deploy(m: Machine, args: Args) -> None:
    await _database_reachable(m)
    with fault(m.model, "rolling_deploy"):
        for problem in await m.world.rolling_deploy():
            m.violate("drain", problem)


generator("database_restart")(_gen_replica)


@action("database_restart", weight=0.3, uses=("World.restart_database",))
async def database_restart(m: Machine, args: Args) -> None:
    with fault(m.model, "database_restart"):
        await m.world.restart_database()


generator("database_outage")(_gen_replica)


@action("database_outage", weight=0.5, uses=("TcpProxy.down", "TcpProxy.up"))
async def database_outage(m: Machine, args: Args) -> None:
    """PostgreSQL unreachable for the replicas (connections cut, new ones refused) until a heal."""
    await m.world.proxy.down(hold_port=True)
    m.model.fault_started("database_outage")


generator("cut_connections")(_gen_replica)


@action("cut_connections", weight=0.4, uses=("TcpProxy.cut",))
async def cut_connections(m: Machine, args: Args) -> None:
    with fault(m.model, "cut_connections"):
        await m.world.proxy.cut()


@generator("cut_at_statement")
def _gen_cut_at(m: Machine, rng: random.Random) -> Args:
    return {"statement": rng.choice(("queue_admit_job", "queue_end_job", "COMMIT", "queue_grant_capacity"))}


@action("cut_at_statement", weight=0.4, uses=("TcpProxy.cut_when_sent",))
async def cut_at_statement(m: Machine, args: Args) -> None:
    """The next connection that sends this statement breaks before the server sees it."""
    m.world.proxy.cut_when_sent(args["statement"].encode())
    m.model.fault_started("cut_at_statement")


generator("late_commits")(_gen_replica)


@action("late_commits", weight=0.4, uses=("World.commits_acknowledged_late",))
async def late_commits(m: Machine, args: Args) -> None:
    """Commits are acknowledged late (a synchronous standby that never answers) until a heal."""
    with contextlib.suppress(psycopg.Error):
        await asyncio.to_thread(m.world.commits_acknowledged_late, True)
        m.model.fault_started("late_commits")


generator("listener_kill")(_gen_replica)


@action("listener_kill", weight=0.5, uses=("World.kill_listeners",))
async def listener_kill(m: Machine, args: Args) -> None:
    with fault(m.model, "listener_kill"), contextlib.suppress(psycopg.Error):
        await asyncio.to_thread(m.world.kill_listeners)


@generator("stranger_lock")
def _gen_stranger(m: Machine, rng: random.Random) -> Args:
    return {"user": _user(m, rng), "seconds": rng.choice((1.0, 2.5))}


@action("stranger_lock", weight=0.4, uses=("stranger_holds_user_locks",))
async def stranger_lock(m: Machine, args: Args) -> None:
    """A stranger's transaction (an operator's psql, an old replica) holds a user's queue lock."""
    with fault(m.model, "stranger_lock"), contextlib.suppress(psycopg.Error):
        await stranger_holds_user_locks(m.world.database_url, [m.model.users[args["user"]].user_id], args["seconds"])


generator("freeze_backends")(_gen_replica)


@action("freeze_backends", weight=0.3, uses=("frozen", "backend_pids"))
async def freeze_backends(m: Machine, args: Args) -> None:
    """Two of the replicas' PostgreSQL backends stop answering (SIGSTOP) for two seconds: their
    sockets stay open, nothing they were asked is answered. The fault is in play only while one
    is frozen: a backend listed here may have exited before its SIGSTOP (`frozen` leaves it out),
    and a step that froze none relaxes no check. Nothing awaits between the SIGSTOP and
    `fault_started`, so no call the machine sees ends in between."""
    try:
        pids = await asyncio.to_thread(
            backend_pids, m.world.database_url, "backend_type = 'client backend' AND application_name <> 'machine'"
        )
    except psycopg.Error:
        return  # the database is down (another fault): nothing to freeze
    chosen = random.Random(args["seed"]).sample(pids, min(2, len(pids)))
    with frozen(chosen) as stopped:
        if not stopped:
            return
        with fault(m.model, "freeze_backends"):
            await asyncio.sleep(2.0)


generator("an_hour_passes")(_gen_reads)


@action("an_hour_passes", weight=0.4)
async def an_hour_passes(m: Machine, args: Args) -> None:
    """An hour passes for the ended jobs (their admit, start and end an hour earlier, as the
    database's clock reads them): the free-work limit stops counting them and the pruner may
    delete them, within a run of minutes. What the machine counts of her free work moves with them."""
    with psycopg.connect(m.world.database_url, autocommit=True) as conn:
        moved = {
            str(job_id)
            for (job_id,) in conn.execute(
                """UPDATE analysis_jobs SET create_time = create_time - interval '1 hour',
                          start_time = start_time - interval '1 hour', end_time = end_time - interval '1 hour'
                    WHERE status IN ('succeeded', 'failed', 'canceled') AND create_time > clock_timestamp() - interval '1 hour'
                RETURNING job_id"""
            )
        }
    m.model.time_shifted |= moved
    for user in m.model.users:
        user.own_free_work = [(t - 3600, j) if j in moved else (t, j) for t, j in user.own_free_work]


@generator("wait")
def _gen_wait(m: Machine, rng: random.Random) -> Args:
    return {"seconds": rng.choice((0.3, 0.8, 1.5, 3.0, 5.0))}


@action("wait", weight=2)
async def wait(m: Machine, args: Args) -> None:
    """Time passes: releases retry, judging ends, the sweeper and the pruner turn."""
    await asyncio.sleep(args["seconds"])


@generator("quiesce")
def _gen_quiesce(m: Machine, rng: random.Random) -> Args:
    return {}


@action("quiesce", weight=0.6)
async def quiesce(m: Machine, args: Args) -> None:
    await m.quiesce()


# What the harness can do that is no fault for the machine to inject, each with why.
NOT_FAULTS = {
    "TcpProxy.dsn": "where the proxy listens",
    "TcpProxy.retarget": "moves the proxy to another PostgreSQL (the failover tests); the machine has one",
    "World.start_replica": "starting a replica is part of a kill and a deploy",
    "World.heal": "ends every fault",
    "World.start": "brings the world up",
    "World.stop": "ends every process of the world",
    "World.pick": "chooses a replica",
    "World.point_core_at_replicas": "tells the core where to send completions",
}
# Faults in play all through a run rather than as a step.
STANDING_FAULTS = ("World.skewed_clock",)
