"""The dev core: a faithful stand-in for the Rust core's `acurio.core.v1.RunService`.

Deterministic behaviour from the design: a document whose uri contains `unparseable` and any
DOI under `10.9999/` are rejected (INVALID_ARGUMENT with a google.rpc.BadRequest naming each
field, `document_uri` and `sources[i].doi`, as the real core answers); a daily provider budget
(RESOURCE_EXHAUSTED past it); runs created held wait for ReleaseRun; a released run judges for
`judging_seconds` and is then reported through `CoreCallbackService.CompleteRun` (never, in
manual mode, where a test calls `finish`). A document uri containing `fail-judging` ends FAILED;
one containing `fail-release` has every ReleaseRun answered UNAVAILABLE, so its job stays
PENDING with the release retried (a stuck release, for the console and client tests).

Fault switches (attributes, flipped by tests; flags when run as a process): `unavailable`
(every call UNAVAILABLE), `slow_seconds` (every call sleeps first), `fail_releases`
(ReleaseRun UNAVAILABLE), `refuse_releases` (ReleaseRun NOT_FOUND), `drop_callbacks` (judge but
never call back), and per method `answer_faults` (an `AnswerFault`: the call is applied but its
answer lost, or late, or the request itself arrives late), counted in `faults_injected`.
`toggle_serving` stops the listener or starts it again on the same port (a core down and back).
`max_concurrent_judging` records the most first-pass runs of each user ever judging at once (the
core's own view of I1, checked as I9). `judging_ceiling` (None: none) makes ReleaseRun answer
RESOURCE_EXHAUSTED while that many runs judge (the core contract's "not now"; `refusals` counts
them); `most_first_pass_judging` is the most first-pass runs of all users judging at once (I12 at
the core's side) and `start_order` the users of first-pass runs in the order they began judging
(I13). Unreleased held runs expire after `hold_expiry_seconds`,
like the real core. A failed CompleteRun is retried for a minute, as the core contract asks.
`ListRuns` lists the live runs (held or judging; by user, judging only) in run id order, a page
at a time, each with what it was created with (`Run.creation`, which `GetRun` returns too; kept
in the saved state), so the queue can adopt runs its database lost; `list_calls` counts them.
The completion callback carries the trace context of the release that started the run, and a
bearer token when `callback_token` is set (QUEUE_DEV_CORE_CALLBACK_TOKEN for the process); the
dev core serves gRPC health too.

For benchmarks, `record_path` appends one JSON line per run created, ReleaseRun received and
CompleteRun sent and returned, stamped with `time.monotonic_ns()` (CLOCK_MONOTONIC, comparable
across processes on one host) and `time.time_ns()`; `start_judging` turns a manual core
automatic so a whole prepared batch starts judging at one instant.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import datetime as dt
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from os import PathLike
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from queue_service._gen.acurio.core.v1 import run_service_pb2 as pb
from queue_service._gen.acurio.core.v1 import run_service_pb2_grpc as pb_grpc
from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2 as callback_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2_grpc as callback_grpc,
)

log = logging.getLogger(__name__)

UNREGISTERED_DOI_PREFIX = "10.9999/"
FAILED_RELEASE_MARKER = "fail-release"
_TRACE_HEADERS = ("traceparent", "tracestate")
# The trace headers of a call, as grpc hands over invocation metadata.
_TraceHeaders = tuple[tuple[str, str | bytes], ...]
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_FINISHED = (pb.RUN_STATE_SUCCEEDED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELED)
_COMPLETION_RETRY_SECONDS = 60.0
_LIST_PAGE_DEFAULT = 100
_LIST_PAGE_MAX = 1000


def _stored_creation(request: pb.CreateRunRequest) -> pb.CreateRunRequest:
    """What the core keeps of a CreateRun: all of it (`hold` says how it began)."""
    stored = pb.CreateRunRequest()
    stored.CopyFrom(request)
    return stored


@dataclasses.dataclass
class DevRun:
    run_id: str
    user_id: str
    document_uri: str
    state: pb.RunState.ValueType
    created_at: float
    message: str = ""
    judge_task: asyncio.Task[None] | None = None
    trace_headers: _TraceHeaders = ()
    # A first-pass run takes one of the user's slots; a delta re-check does not.
    first_pass: bool = True
    # What the run was created with (ListRuns' `Run.creation`), the queue's fields included.
    creation: pb.CreateRunRequest = dataclasses.field(default_factory=pb.CreateRunRequest)


@dataclasses.dataclass
class AnswerFault:
    """What the network does to one method's calls (a share of them, `probability`):
    `lose`: applied, then the answer is lost (the caller hears UNAVAILABLE);
    `late`: applied at once, answered `seconds` later (usually after the caller's deadline);
    `late_arrival`: the request arrives `seconds` late and is applied then, even if the caller
    has given up meanwhile;
    `refuse`: not applied, answered `code` at once (RESOURCE_EXHAUSTED: the core at a ceiling of
    its own; UNAVAILABLE: a proxy in front of it with no healthy backend)."""

    kind: str
    seconds: float = 0.0
    probability: float = 1.0
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE


# Every kind of AnswerFault, for whoever must cover them all (the invariant machine's guard).
ANSWER_FAULT_KINDS = ("lose", "late", "late_arrival", "refuse")


class _Refusal(Exception):
    """The core refuses a call (a status code and message for the caller; for INVALID_ARGUMENT,
    the fields at fault, sent as a google.rpc.BadRequest in the status details)."""

    def __init__(self, code: grpc.StatusCode, message: str, field_violations: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field_violations = field_violations or []

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        """`grpc-status-details-bin` with the BadRequest, as the real core sends it; none without violations."""
        if not self.field_violations:
            return ()
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=field, description=text) for field, text in self.field_violations
                ]
            )
        )
        status = status_pb2.Status(code=self.code.value[0], message=self.message, details=[detail])
        return (("grpc-status-details-bin", status.SerializeToString()),)

    async def abort(self, context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
        await context.abort(self.code, self.message, trailing_metadata=self.trailing_metadata())


def _violations(request: pb.CreateRunRequest) -> list[tuple[str, str]]:
    """The CreateRun checks the core makes before it accepts work, as (field, description)."""
    found: list[tuple[str, str]] = []
    if "unparseable" in request.document_uri:
        found.append(("document_uri", "the document could not be parsed"))
    for index, source in enumerate(request.sources):
        if source.doi.startswith(UNREGISTERED_DOI_PREFIX):
            found.append((f"sources[{index}].doi", f"DOI {source.doi} is not registered"))
    return found


class DevCore(pb_grpc.RunServiceServicer):
    # The switches that make the dev core misbehave on purpose, besides `answer_faults` (per
    # method, ANSWER_FAULT_KINDS) and a restart that forgets its runs (a new DevCore on the same
    # port). Every other public attribute is a setting or an observation; the invariant machine's
    # guard (tests/repository/test_machine_guard.py) fails on a public attribute that is none of these.
    FAULT_SWITCHES = (
        "unavailable",
        "slow_seconds",
        "fail_releases",
        "refuse_releases",
        "drop_callbacks",
        "fail_canceled_runs",
        "judging_ceiling",
        "daily_budget",
        "hold_expiry_seconds",
        "answer_faults",
    )
    SETTINGS = ("callback_addr", "callback_token", "judging_seconds", "manual", "delta_judging_seconds", "port")
    OBSERVATIONS = (
        "faults_injected",
        "list_calls",
        "user_list_calls",
        "runs",
        "release_log",
        "completion_log",
        "judging_now",
        "max_concurrent_judging",
        "judging_log",
        "refusals",
        "judging_all",
        "most_first_pass_judging",
        "most_judging",
        "start_order",
    )

    def __init__(
        self,
        *,
        callback_addr: str = "",
        callback_token: str = "",
        judging_seconds: float = 1.0,
        manual: bool = False,
        daily_budget: int = 1_000_000,
        hold_expiry_seconds: float = 24 * 3600,
        record_path: str | None = None,
    ) -> None:
        self.callback_addr = callback_addr
        self.callback_token = callback_token  # sent as a bearer token when the queue authenticates
        self.judging_seconds = judging_seconds
        self.manual = manual
        self.daily_budget = daily_budget
        self.hold_expiry_seconds = hold_expiry_seconds
        self.unavailable = False
        self.slow_seconds = 0.0
        self.fail_releases = False
        self.refuse_releases = False
        self.drop_callbacks = False
        # A judging run asked to cancel ends FAILED (no refund), reported by CompleteRun before
        # the CancelRun answer: a core that treats cancels as failures.
        self.fail_canceled_runs = False
        # Per method (CreateRun, ReleaseRun, CancelRun, GetRun): applied-but-unanswered and late calls.
        self.answer_faults: dict[str, AnswerFault] = {}
        self.faults_injected: collections.Counter[str] = collections.Counter()
        self.list_calls = 0  # ListRuns calls received
        self.user_list_calls = 0  # of which for one user's runs (the queue's check before a release)
        self._late_applications: set[asyncio.Future[Any]] = set()
        # Judging time of delta re-checks (None: judging_seconds); 0 completes them at once.
        self.delta_judging_seconds: float | None = None
        self.runs: dict[str, DevRun] = {}
        self.release_log: list[tuple[str, float]] = []  # (run_id, monotonic time received)
        self.completion_log: list[tuple[str, float]] = []  # (run_id, monotonic time CompleteRun returned)
        # user_id -> first-pass runs judging now, and the most ever judging at once (I9, the
        # core's own view of I1).
        self.judging_now: dict[str, set[str]] = {}
        self.max_concurrent_judging: dict[str, int] = {}
        # (monotonic time, "begin" or "end", run_id, user_id) of every first-pass run's judging:
        # when a user had two judging at once, and since when (I9's timeline).
        self.judging_log: list[tuple[float, str, str, str]] = []
        # The core's concurrency ceiling (None: none): ReleaseRun answers RESOURCE_EXHAUSTED while
        # this many runs (first-pass and delta) are judging.
        self.judging_ceiling: int | None = None
        self.refusals = 0
        self.judging_all: set[str] = set()
        self.most_first_pass_judging = 0
        self.most_judging = 0
        self.start_order: list[str] = []
        self._budget_day = dt.date.today()
        self._budget_used = 0
        self._channel: grpc.aio.Channel | None = None
        self._callback: callback_grpc.CoreCallbackServiceAsyncStub | None = None
        self._server: grpc.aio.Server | None = None
        self._listen: tuple[str, grpc.ServerCredentials | None] = ("127.0.0.1:0", None)
        self._toggling: asyncio.Task[None] | None = None
        self.port = 0
        self._record_file = open(record_path, "a", buffering=1 << 16) if record_path else None  # noqa: SIM115

    # -- serving -------------------------------------------------------------------------------

    async def start(self, listen_addr: str = "127.0.0.1:0", credentials: grpc.ServerCredentials | None = None) -> int:
        self._listen = (listen_addr, credentials)
        self._server = grpc.aio.server()
        pb_grpc.add_RunServiceServicer_to_server(self, self._server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self._server)
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        if credentials is not None:
            self.port = self._server.add_secure_port(listen_addr, credentials)
        else:
            self.port = self._server.add_insecure_port(listen_addr)
        await self._server.start()
        return self.port

    def toggle_serving(self) -> None:
        """Stops listening (calls find nothing there: a stopped core), or listens again on the same
        port, keeping the runs (`queue-service dev` on SIGUSR2)."""
        previous = self._toggling
        self._toggling = asyncio.create_task(self._toggle_serving(previous), name="dev-core-toggle")

    async def _toggle_serving(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await previous
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
            log.warning("dev core stopped listening (SIGUSR2 starts it again)")
        else:
            listen_addr, credentials = self._listen
            await self.start(f"{listen_addr.rpartition(':')[0]}:{self.port}", credentials)
            log.warning("dev core listening again on port %d", self.port)

    async def stop(self) -> None:
        for applying in list(self._late_applications):
            applying.cancel()
        for run in self.runs.values():
            if run.judge_task is not None:
                run.judge_task.cancel()
        if self._server is not None:
            await self._server.stop(0)
        if self._channel is not None:
            await self._channel.close()
        if self._record_file is not None:
            self._record_file.close()
            self._record_file = None

    def record(self, event: str, run_id: str = "", user_id: str = "", **extra: Any) -> None:
        """Appends one timestamped event line for the benchmark (no-op without `record_path`);
        `extra` adds fields (a created run's `first_pass`, which the soak's promotion gap needs:
        a delta re-check's completion frees no slot, and under a capacity it is released too)."""
        if self._record_file is not None:
            line = {"event": event, "run_id": run_id, "user_id": user_id, "mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}
            line.update(extra)
            self._record_file.write(json.dumps(line) + "\n")

    def start_judging(self, spread_seconds: float = 0.0) -> None:
        """Leaves manual mode: every run judging now completes `judging_seconds` from this call,
        the i-th of n delayed by i/n x `spread_seconds` (0: all in step)."""
        self.manual = False
        self.record("judging_started")
        waiting = [run for run in self.runs.values() if run.state == pb.RUN_STATE_JUDGING and run.judge_task is None]
        for index, run in enumerate(waiting):
            run.judge_task = asyncio.create_task(self._judge(run, delay=spread_seconds * index / len(waiting)))

    def set_callback_addr(self, addr: str) -> None:
        """Where completions go: one host:port, or several separated by commas (spread round-robin,
        as a load balancer in front of the queue's replicas would)."""
        self.callback_addr = addr
        self._callback = None

    # -- the contract ----------------------------------------------------------------------------

    async def _enter(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if self.slow_seconds:
            await asyncio.sleep(self.slow_seconds)
        if self.unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "dev core switched to unavailable")

    def _run_message(self, run: DevRun) -> pb.Run:
        return pb.Run(run_id=run.run_id, state=run.state, message=run.message)

    async def _serve(
        self,
        method: str,
        apply: Callable[[_Request, _TraceHeaders], _Response],
        request: _Request,
        context: grpc.aio.ServicerContext[_Request, _Response],
    ) -> _Response:
        """Applies one call, with the answer fault set for `method`, if any (see AnswerFault)."""
        await self._enter(context)
        metadata = tuple((key, value) for key, value in (context.invocation_metadata() or ()) if key in _TRACE_HEADERS)
        fault = self.answer_faults.get(method)
        if fault is None or random.random() >= fault.probability:
            return await self._answer(apply, request, metadata, context)
        self.faults_injected[f"{method}:{fault.kind}"] += 1
        if fault.kind == "refuse":
            await context.abort(fault.code, f"dev core: {method} refused ({fault.code.name}), not applied")
        if fault.kind == "late_arrival":
            # The request reaches the core late: it is applied even if the caller gave up meanwhile.
            applying = asyncio.ensure_future(self._apply_later(fault.seconds, apply, request, metadata))
            self._late_applications.add(applying)
            applying.add_done_callback(self._forget_late_application)
            try:
                response = await asyncio.shield(applying)
            except _Refusal as refusal:
                await refusal.abort(context)
            return response
        outcome: _Response | _Refusal
        try:
            outcome = apply(request, metadata)
        except _Refusal as refused:
            outcome = refused
        if fault.kind == "lose":
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"dev core: {method} was applied, its answer lost")
        await asyncio.sleep(fault.seconds)  # "late": applied now, answered after the caller's deadline
        if isinstance(outcome, _Refusal):
            await outcome.abort(context)
        return outcome

    def _forget_late_application(self, applying: asyncio.Future[Any]) -> None:
        self._late_applications.discard(applying)
        if not applying.cancelled():
            applying.exception()  # read: a refusal nobody waits for any more is not an error

    @staticmethod
    async def _answer(
        apply: Callable[[_Request, _TraceHeaders], _Response],
        request: _Request,
        metadata: _TraceHeaders,
        context: grpc.aio.ServicerContext[_Request, _Response],
    ) -> _Response:
        try:
            return apply(request, metadata)
        except _Refusal as refusal:
            await refusal.abort(context)

    @staticmethod
    async def _apply_later(
        seconds: float, apply: Callable[[_Request, _TraceHeaders], _Response], request: _Request, metadata: _TraceHeaders
    ) -> _Response:
        await asyncio.sleep(seconds)
        return apply(request, metadata)

    async def CreateRun(
        self, request: pb.CreateRunRequest, context: grpc.aio.ServicerContext[pb.CreateRunRequest, pb.CreateRunResponse]
    ) -> pb.CreateRunResponse:
        return await self._serve("CreateRun", self._create_run, request, context)

    async def ReleaseRun(
        self, request: pb.ReleaseRunRequest, context: grpc.aio.ServicerContext[pb.ReleaseRunRequest, pb.ReleaseRunResponse]
    ) -> pb.ReleaseRunResponse:
        self.release_log.append((request.run_id, time.monotonic()))
        known = self.runs.get(request.run_id)
        self.record("release_received", request.run_id, known.user_id if known is not None else "")
        return await self._serve("ReleaseRun", self._release_run, request, context)

    async def CancelRun(
        self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext[pb.CancelRunRequest, pb.CancelRunResponse]
    ) -> pb.CancelRunResponse:
        run = self.runs.get(request.run_id)
        if self.fail_canceled_runs and run is not None and run.state == pb.RUN_STATE_JUDGING:
            # Like a core that ends a run it is asked to cancel as failed, reporting that first.
            await self.finish(run.run_id, succeeded=False, refund_credit=False, message="canceled at the core")
        return await self._serve("CancelRun", self._cancel_run, request, context)

    async def GetRun(
        self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext[pb.GetRunRequest, pb.GetRunResponse]
    ) -> pb.GetRunResponse:
        return await self._serve("GetRun", self._get_run, request, context)

    async def ListRuns(
        self, request: pb.ListRunsRequest, context: grpc.aio.ServicerContext[pb.ListRunsRequest, pb.ListRunsResponse]
    ) -> pb.ListRunsResponse:
        self.list_calls += 1
        if request.user_id:
            self.user_list_calls += 1
        return await self._serve("ListRuns", self._list_runs, request, context)

    def _create_run(self, request: pb.CreateRunRequest, _metadata: _TraceHeaders) -> pb.CreateRunResponse:
        existing = self.runs.get(request.run_id)
        if existing is not None:
            return pb.CreateRunResponse(run=self._run_message(existing))
        try:
            uuid.UUID(request.run_id)
        except ValueError:
            raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, "run_id must be a UUID") from None
        problems = _violations(request)
        if problems:
            raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"{len(problems)} problem(s) with the analysis", problems)
        if dt.date.today() != self._budget_day:
            self._budget_day, self._budget_used = dt.date.today(), 0
        if self._budget_used >= self.daily_budget:
            raise _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "the provider budget for today is used up")
        self._budget_used += 1
        run = DevRun(
            run_id=request.run_id,
            user_id=request.user_id,
            document_uri=request.document_uri,
            state=pb.RUN_STATE_HELD if request.hold else pb.RUN_STATE_JUDGING,
            created_at=time.monotonic(),
            first_pass=not request.delta_of_run_id,
            creation=_stored_creation(request),
        )
        self.runs[run.run_id] = run
        self.record("create", run.run_id, run.user_id, first_pass=run.first_pass)
        if not request.hold:
            self._begin_judging(run)
        return pb.CreateRunResponse(run=self._run_message(run))

    def _release_run(self, request: pb.ReleaseRunRequest, metadata: _TraceHeaders) -> pb.ReleaseRunResponse:
        run = self.runs.get(request.run_id)
        if self.refuse_releases or run is None or self._expired(run):
            raise _Refusal(grpc.StatusCode.NOT_FOUND, f"run {request.run_id} is unknown or expired")
        if self.fail_releases:
            raise _Refusal(grpc.StatusCode.UNAVAILABLE, "dev core switched to fail releases")
        if FAILED_RELEASE_MARKER in run.document_uri:
            raise _Refusal(grpc.StatusCode.UNAVAILABLE, f"dev core fails every release of a document named {FAILED_RELEASE_MARKER}")
        if run.state == pb.RUN_STATE_CANCELED:
            raise _Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"run {run.run_id} was canceled")
        if run.state == pb.RUN_STATE_HELD and self.judging_ceiling is not None and len(self.judging_all) >= self.judging_ceiling:
            self.refusals += 1
            raise _Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"the core is at its concurrency ceiling ({self.judging_ceiling} runs judging)"
            )
        if run.state == pb.RUN_STATE_HELD:
            # Like the real core: the completion callback continues the trace of the release.
            run.trace_headers = metadata
            run.state = pb.RUN_STATE_JUDGING
            self._begin_judging(run)
        return pb.ReleaseRunResponse(run=self._run_message(run))

    def _cancel_run(self, request: pb.CancelRunRequest, _metadata: _TraceHeaders) -> pb.CancelRunResponse:
        run = self.runs.get(request.run_id)
        if run is None:
            # The contract: a cancel of a run id never seen leaves it canceled, so a CreateRun that
            # arrives later (its caller long gone) finds the canceled run instead of creating one.
            run = self.runs[request.run_id] = DevRun(
                run_id=request.run_id, user_id="", document_uri="", state=pb.RUN_STATE_CANCELED, created_at=time.monotonic()
            )
            return pb.CancelRunResponse(run=self._run_message(run))
        if run.state not in _FINISHED:
            self._stop_judging(run)
            run.state = pb.RUN_STATE_CANCELED
            if run.judge_task is not None:
                run.judge_task.cancel()
        return pb.CancelRunResponse(run=self._run_message(run))

    def _get_run(self, request: pb.GetRunRequest, _metadata: _TraceHeaders) -> pb.GetRunResponse:
        run = self.runs.get(request.run_id)
        if run is None or self._expired(run):
            # An expired held run is gone, as ReleaseRun and ListRuns already treat it.
            raise _Refusal(grpc.StatusCode.NOT_FOUND, f"run {request.run_id} is unknown or expired")
        return pb.GetRunResponse(run=self._recorded_run(run))

    def _recorded_run(self, run: DevRun) -> pb.Run:
        message = self._run_message(run)
        message.creation.CopyFrom(run.creation)
        return message

    def _list_runs(self, request: pb.ListRunsRequest, _metadata: _TraceHeaders) -> pb.ListRunsResponse:
        """The live runs in run id order after the page token (the last run id of the previous page)."""
        if request.page_size < 0:
            raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, "page_size must not be negative")
        size = min(request.page_size or _LIST_PAGE_DEFAULT, _LIST_PAGE_MAX)
        after = request.page_token
        live = sorted(
            (
                run
                for run in self.live_runs().values()
                if run.run_id > after
                and (not request.user_id or run.user_id == request.user_id)
                and (not request.judging_only or run.state == pb.RUN_STATE_JUDGING)
                and not self._expired(run)
            ),
            key=lambda run: run.run_id,
        )
        page = live[:size]
        next_token = page[-1].run_id if len(live) > size else ""
        return pb.ListRunsResponse(runs=[self._recorded_run(run) for run in page], next_page_token=next_token)

    # -- what the core holds, for invariant checks ---------------------------------------------

    def live_runs(self) -> dict[str, DevRun]:
        """Runs held or judging right now (I10: after quiescence each belongs to a live job)."""
        return {run_id: run for run_id, run in self.runs.items() if run.state in (pb.RUN_STATE_HELD, pb.RUN_STATE_JUDGING)}

    # -- judging ---------------------------------------------------------------------------------

    def _expired(self, run: DevRun) -> bool:
        return run.state == pb.RUN_STATE_HELD and time.monotonic() - run.created_at > self.hold_expiry_seconds

    def first_pass_judging(self) -> int:
        """First-pass runs of all users judging now."""
        return sum(len(runs) for runs in self.judging_now.values())

    def _begin_judging(self, run: DevRun) -> None:
        self.judging_all.add(run.run_id)
        self.most_judging = max(self.most_judging, len(self.judging_all))
        if run.first_pass:
            judging = self.judging_now.setdefault(run.user_id, set())
            judging.add(run.run_id)
            self.judging_log.append((time.monotonic(), "begin", run.run_id, run.user_id))
            self.max_concurrent_judging[run.user_id] = max(self.max_concurrent_judging.get(run.user_id, 0), len(judging))
            self.most_first_pass_judging = max(self.most_first_pass_judging, self.first_pass_judging())
            self.start_order.append(run.user_id)
        if not self.manual:
            run.judge_task = asyncio.create_task(self._judge(run))

    def _stop_judging(self, run: DevRun) -> None:
        if run.first_pass and run.run_id in self.judging_now.get(run.user_id, ()):
            self.judging_log.append((time.monotonic(), "end", run.run_id, run.user_id))
        self.judging_all.discard(run.run_id)
        self.judging_now.get(run.user_id, set()).discard(run.run_id)

    async def _judge(self, run: DevRun, delay: float = 0.0) -> None:
        seconds = self.judging_seconds if run.first_pass or self.delta_judging_seconds is None else self.delta_judging_seconds
        await asyncio.sleep(delay + seconds)
        await self.finish(run.run_id, succeeded="fail-judging" not in run.document_uri)

    async def finish(
        self, run_id: str, *, succeeded: bool = True, refund_credit: bool = False, message: str = ""
    ) -> callback_pb2.CompleteRunResponse | None:
        """Ends a judging run and reports it (unless callbacks are dropped)."""
        run = self.runs[run_id]
        if run.state != pb.RUN_STATE_JUDGING:
            return None
        self._stop_judging(run)
        run.state = pb.RUN_STATE_SUCCEEDED if succeeded else pb.RUN_STATE_FAILED
        run.message = message or ("" if succeeded else "judging failed")
        if self.drop_callbacks or not self.callback_addr:
            return None
        return await self._report(run, refund_credit)

    async def _report(self, run: DevRun, refund_credit: bool) -> callback_pb2.CompleteRunResponse | None:
        if self._callback is None:
            addresses = self.callback_addr.split(",")
            target = self.callback_addr if len(addresses) == 1 else "ipv4:" + ",".join(addresses)
            self._channel = grpc.aio.insecure_channel(target, options=[("grpc.lb_policy_name", "round_robin")])
            self._callback = callback_grpc.CoreCallbackServiceStub(self._channel)
        request = callback_pb2.CompleteRunRequest(
            run_id=run.run_id,
            outcome=callback_pb2.RUN_OUTCOME_SUCCEEDED if run.state == pb.RUN_STATE_SUCCEEDED else callback_pb2.RUN_OUTCOME_FAILED,
            refund_credit=refund_credit,
            message=run.message,
        )
        metadata = list(run.trace_headers)
        if self.callback_token:
            metadata.append(("authorization", f"Bearer {self.callback_token}"))
        # Like the real core must: retry what may not have arrived, for at least a minute.
        give_up_at = time.monotonic() + _COMPLETION_RETRY_SECONDS
        attempt = 0
        while True:
            try:
                self.record("complete_sent", run.run_id, run.user_id)
                response = await self._callback.CompleteRun(request, timeout=5, metadata=metadata or None)
                self.completion_log.append((run.run_id, time.monotonic()))
                self.record("complete_returned", run.run_id, run.user_id)
                return response
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED):
                    log.warning("CompleteRun for %s refused: %s", run.run_id, exc.code().name)
                    return None
            pause = min(2.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.0)
            attempt += 1
            if time.monotonic() + pause > give_up_at:
                break
            await asyncio.sleep(pause)
        log.warning("CompleteRun for %s never got through; the queue's sweeper reconciles it", run.run_id)
        return None

    # -- remembering runs across restarts (`queue-service dev`) ----------------------------------

    def save_runs(self, path: str | PathLike[str]) -> None:
        """Writes (atomically) every run the queue may still ask about: all but finished runs
        whose completion the queue has acknowledged."""
        import os as _os

        delivered = {run_id for run_id, _ in self.completion_log}
        runs = [
            {
                "run_id": r.run_id,
                "user_id": r.user_id,
                "document_uri": r.document_uri,
                "state": r.state,
                "message": r.message,
                "first_pass": r.first_pass,
                "creation": base64.b64encode(r.creation.SerializeToString()).decode(),
            }
            for r in self.runs.values()
            if not (r.state in _FINISHED and r.run_id in delivered)
        ]
        temporary = f"{_os.fspath(path)}.tmp"
        with open(temporary, "w") as out:
            json.dump(runs, out)
        _os.replace(temporary, path)

    def load_runs(self, path: str | PathLike[str]) -> int:
        """Restores runs saved by `save_runs` (none when the file is missing); returns how many.

        Held runs stay held (their jobs can still be released). A run that was judging judges
        again from the start, and a succeeded or failed run whose completion was never
        acknowledged is judged and reported again (CompleteRun is idempotent), so the user's
        queue moves on as soon as the core is back. Restored judging runs start judging at
        `start_judging()`: call it once the queue can take their completions.
        """
        try:
            with open(path) as saved:
                entries = json.load(saved)
        except FileNotFoundError:
            return 0
        for entry in entries:
            state = entry["state"]
            if state in (pb.RUN_STATE_SUCCEEDED, pb.RUN_STATE_FAILED):
                state = pb.RUN_STATE_JUDGING
            run = DevRun(
                run_id=entry["run_id"],
                user_id=entry["user_id"],
                document_uri=entry["document_uri"],
                state=state,
                created_at=time.monotonic(),
                message=entry.get("message", ""),
                first_pass=entry.get("first_pass", True),
                creation=pb.CreateRunRequest.FromString(base64.b64decode(entry.get("creation", ""))),
            )
            self.runs[run.run_id] = run
        return len(entries)
