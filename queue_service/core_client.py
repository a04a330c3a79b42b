"""Calls to the core's RunService, with deadlines and the design's reading of its status codes.

Every call has three outcomes, not two: the core answered (a `RunReport` says what it knows of
the run), the core refused (a domain error), or the outcome is unknown: the call may have been
applied and its answer lost or late. Unknown outcomes raise `CoreUnavailable`; the engine treats
them as *maybe applied* (see docs/design.md, "Settled runs").

Each call's deadline is QUEUE_CORE_DEADLINE_SECONDS, shortened to fit the caller's own deadline
(see `deadline`). CreateRun and CancelRun retry UNAVAILABLE briefly (tenacity) inside that
deadline; release attempts are single calls whose retries outlive processes, so they are state in
the job row (see `dispatcher`).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_random_exponential

from queue_service import deadline, errors, telemetry
from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2
from queue_service._gen.acurio.core.v1 import run_service_pb2_grpc as core_grpc
from queue_service.model import (
    CORE_DEGRADED_AFTER_FAILURE,
    CORE_LATENCY_BOUNDS_MS,
    CORE_WINDOW_MINUTES,
    CoreHealthReport,
    CoreMethodCalls,
    CoreMethodFailure,
    CoreMinute,
    CoreRun,
    CoreState,
    RunFate,
    RunReport,
)

T = TypeVar("T")
_P = ParamSpec("_P")
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

# The admit path's CreateRun may use at most this share of what is left of the caller's deadline:
# the locked transaction after it needs time too.
_CREATE_SHARE_OF_CALL = 0.6
# The probe's deadline (`CoreClient.probe`), at most: a core that answers nothing within it is
# unreachable for the probe.
PROBE_DEADLINE_SECONDS = 2.0
# The run the probe asks about: no run has the nil UUID.
_PROBE_RUN_ID = uuid.UUID(int=0)
# The largest message the core receives (gRPC's default receive limit, which the core keeps).
CORE_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _RETRYABLE


_FATE_OF_STATE = {
    core_pb2.RUN_STATE_HELD: RunFate.HELD,
    core_pb2.RUN_STATE_JUDGING: RunFate.JUDGING,
    core_pb2.RUN_STATE_SUCCEEDED: RunFate.SUCCEEDED,
    core_pb2.RUN_STATE_FAILED: RunFate.FAILED,
    core_pb2.RUN_STATE_CANCELED: RunFate.CANCELED,
}


def _report_of(run: core_pb2.Run) -> RunReport:
    """The core's answer about a run, as the queue reads it."""
    fate = _FATE_OF_STATE.get(run.state)
    if fate is None:
        raise errors.CoreUnavailable(
            f"the core answered with run state {run.state}, which the queue does not know",
            metadata={"coreCode": "OK"},
        )
    return RunReport(fate, run.message)


def _unknown_outcome(method: str, exc: grpc.aio.AioRpcError) -> errors.CoreUnavailable:
    return errors.CoreUnavailable(
        f"core {method} gave no answer ({exc.code().name}); it may have been applied",
        metadata={"coreCode": exc.code().name, "coreMethod": method},
    )


class RecentCoreCalls:
    """The core's recent health as this replica sees it, for its heartbeat: per-minute buckets of
    the last `CORE_WINDOW_MINUTES` (answered, refused, unknown, admits answered CORE_UNAVAILABLE,
    latencies), the last answer and the last failure (no answer, or a refusal of service: the
    provider's budget used up), and what the core said since the previous heartbeat, which
    decides the state the heartbeat reports. A refusal of one request (CORE_REJECTED,
    CORE_AT_CAPACITY) is an answer: the core works. The counts are kept by core method too
    (`method`: CreateRun, ReleaseRun ...), with each method's latest failure, so the Overview
    names the calls that fail."""

    def __init__(self) -> None:
        self._minutes: collections.deque[dict[str, Any]] = collections.deque(maxlen=CORE_WINDOW_MINUTES)
        self.last_success_at: dt.datetime | None = None
        self.last_failure_at: dt.datetime | None = None
        self.last_failure_reason = ""
        self._method_failures: dict[str, CoreMethodFailure] = {}
        # Whether the latest call got no answer (until one is answered or refused), and whether
        # the latest heartbeat read the core as unreachable.
        self._silent = self._unreachable_at_beat = False
        self._answered_since_beat = self._refused_since_beat = self._silent_since_beat = self._created_since_beat = False

    def _bucket(self, now: dt.datetime) -> dict[str, Any]:
        minute = now.replace(second=0, microsecond=0)
        if not self._minutes or self._minutes[-1]["minute"] != minute:
            self._minutes.append(
                {"minute": minute, "answered": 0, "refused": 0, "unknown": 0, "admits_unavailable": 0,
                 "latency_counts": [0] * (len(CORE_LATENCY_BOUNDS_MS) + 1), "latency_max_ms": 0.0, "methods": {}}
            )  # fmt: skip
        return self._minutes[-1]

    def _count(self, now: dt.datetime, outcome: str, method: str, failure_reason: str = "") -> dict[str, Any]:
        """Counts one call's outcome in the minute's bucket, by method too (when named)."""
        bucket = self._bucket(now)
        bucket[outcome] += 1
        if method:
            by_method = bucket["methods"].setdefault(method, {"answered": 0, "refused": 0, "unknown": 0})
            by_method[outcome] += 1
            if failure_reason:
                self._method_failures[method] = CoreMethodFailure(method=method, at=now, reason=failure_reason)
        return bucket

    def _heard(self, outcome: str, latency_seconds: float, method: str, failure_reason: str = "") -> dt.datetime:
        now = dt.datetime.now(dt.UTC)
        bucket = self._count(now, outcome, method, failure_reason)
        latency_ms = latency_seconds * 1000
        bucket["latency_counts"][bisect.bisect_left(CORE_LATENCY_BOUNDS_MS, latency_ms)] += 1
        bucket["latency_max_ms"] = max(bucket["latency_max_ms"], latency_ms)
        self._silent = False
        return now

    def answered(
        self, latency_seconds: float, *, refused: bool = False, created_run: bool = False, method: str = "", reason: str = ""
    ) -> None:
        """The core answered `method` (`refused`: it refused this request, `reason` why, and
        works; `created_run`: it took a new run)."""
        self.last_success_at = self._heard("refused" if refused else "answered", latency_seconds, method, reason if refused else "")
        self._answered_since_beat = True
        self._created_since_beat |= created_run

    def refused_service(self, reason: str, latency_seconds: float, *, method: str = "") -> None:
        """The core answered `method` only to refuse service (`reason`: PROVIDER_BUDGET_EXHAUSTED)."""
        self.last_failure_at, self.last_failure_reason = self._heard("refused", latency_seconds, method, reason), reason
        self._refused_since_beat = True

    def unanswered(self, code: str, *, method: str = "") -> None:
        """No answer to `method` (`code`: UNAVAILABLE, DEADLINE_EXCEEDED): the outcome is unknown."""
        now = dt.datetime.now(dt.UTC)
        self._count(now, "unknown", method, code)
        self.last_failure_at, self.last_failure_reason = now, code
        self._silent = self._silent_since_beat = True

    def admit_unavailable(self) -> None:
        """An admit answered CORE_UNAVAILABLE (the caller retries with the same key)."""
        self._bucket(dt.datetime.now(dt.UTC))["admits_unavailable"] += 1

    @property
    def heard_since_beat(self) -> bool:
        """Whether the core said anything (an answer or a refusal) since the previous heartbeat."""
        return self._answered_since_beat or self._refused_since_beat

    def reachable(self) -> bool:
        """False from a heartbeat that read the core as unreachable until its next answer: no
        start at the core can be promised meanwhile. (One unanswered call among answers is not
        enough: estimates would come and go with each failed release.)"""
        return not (self._silent and self._unreachable_at_beat)

    def state(self, now: dt.datetime) -> CoreState:
        """The state since the previous heartbeat (see CoreState)."""
        if not self._answered_since_beat and self._silent_since_beat and self._silent:
            return CoreState.UNREACHABLE
        if self._refused_since_beat and not self._created_since_beat:
            # It may answer the rest (cancels, reads, the probe), but takes no new run.
            return CoreState.REFUSING
        if self.last_failure_at is not None and now - self.last_failure_at < CORE_DEGRADED_AFTER_FAILURE:
            return CoreState.DEGRADED
        return CoreState.HEALTHY if self.last_success_at is not None else CoreState.UNKNOWN

    def beat(self) -> CoreHealthReport:
        """The report of this heartbeat; the next state is read from what happens after it."""
        now = dt.datetime.now(dt.UTC)
        report = CoreHealthReport(
            state=self.state(now),
            last_success_at=self.last_success_at,
            last_failure_at=self.last_failure_at,
            last_failure_reason=self.last_failure_reason,
            minutes=tuple(
                CoreMinute(
                    **{
                        **bucket,
                        "latency_counts": tuple(bucket["latency_counts"]),
                        "methods": tuple(CoreMethodCalls(method=method, **calls) for method, calls in bucket["methods"].items()),
                    }
                )
                for bucket in self._minutes
            ),
            method_failures=tuple(self._method_failures.values()),
        )
        self._answered_since_beat = self._refused_since_beat = self._silent_since_beat = self._created_since_beat = False
        self._unreachable_at_beat = report.state is CoreState.UNREACHABLE
        return report


@dataclasses.dataclass
class CoreCallTally:
    """The core's health as this replica saw it since it started: calls it answered (a run's
    state, NOT_FOUND and the like included), refused (a domain error: the admit rejected, the
    budget or the capacity used up), and whose outcome is unknown (no answer: maybe applied).
    Reported in the replica's heartbeat (OperatorService.ListReplicas), with the recent minutes
    (`recent`)."""

    answered: int = 0
    refused: int = 0
    unknown: int = 0
    last_unknown_at: dt.datetime | None = None
    recent: RecentCoreCalls = dataclasses.field(default_factory=RecentCoreCalls)

    def count_answer(self, elapsed: float, *, creates_run: bool, method: str = "") -> None:
        self.answered += 1
        self.recent.answered(elapsed, created_run=creates_run, method=method)

    def count_failure(self, error: errors.QueueError, elapsed: float, *, method: str = "") -> None:
        if isinstance(error, errors.CoreUnavailable):
            self.unknown += 1
            self.last_unknown_at = dt.datetime.now(dt.UTC)
            self.recent.unanswered(error.metadata.get("coreCode", error.reason), method=method)
        elif isinstance(error, errors.ProviderBudgetExhausted):
            self.refused += 1
            self.recent.refused_service(error.reason, elapsed, method=method)
        else:
            self.refused += 1
            self.recent.answered(elapsed, refused=True, method=method, reason=error.reason)


# The core method each tallied call makes (the probe is a GetRun), as the Overview names it.
_CORE_METHOD_OF_CALL = {
    "probe": "GetRun",
    "create_run": "CreateRun",
    "release_run": "ReleaseRun",
    "cancel_run": "CancelRun",
    "get_run": "GetRun",
    "get_run_record": "GetRun",
    "list_runs": "ListRuns",
}


def _tallied(
    call: Callable[Concatenate[CoreClient, _P], Awaitable[T]],
) -> Callable[Concatenate[CoreClient, _P], Coroutine[Any, Any, T]]:
    """Counts the call's outcome in the client's tally (answered, refused, unknown); in the one
    coroutine that wraps the call (every admit's CreateRun goes through it)."""
    # A core that takes new runs is not refusing service, whatever else it refuses.
    creates_run = call.__name__ == "create_run"
    method = _CORE_METHOD_OF_CALL[call.__name__]

    async def counted(client: CoreClient, /, *args: _P.args, **kwargs: _P.kwargs) -> T:
        started = time.monotonic()
        try:
            result = await call(client, *args, **kwargs)
        except errors.QueueError as error:
            client.tally.count_failure(error, time.monotonic() - started, method=method)
            raise
        client.tally.count_answer(time.monotonic() - started, creates_run=creates_run, method=method)
        return result

    return counted


class CoreClient:
    def __init__(self, channel: grpc.aio.Channel, *, deadline_seconds: float) -> None:
        self._channel = channel
        self._stub = core_grpc.RunServiceStub(channel)
        self._deadline = deadline_seconds
        self.tally = CoreCallTally()

    @classmethod
    def connect(cls, address: str, *, deadline_seconds: float, credentials: grpc.ChannelCredentials | None = None) -> CoreClient:
        options = [("grpc.keepalive_time_ms", 30_000), ("grpc.enable_retries", 0)]
        channel = (
            grpc.aio.secure_channel(address, credentials, options=options)
            if credentials is not None
            else grpc.aio.insecure_channel(address, options=options)
        )
        return cls(channel, deadline_seconds=deadline_seconds)

    async def close(self) -> None:
        await self._channel.close()

    async def _with_retry(
        self, method: str, call: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response], request: _Request, budget_seconds: float
    ) -> _Response:
        """Calls `call(request)` until it succeeds, fails for good, or the budget is spent.
        Raises the last AioRpcError, or CoreUnavailable when no time is left to try."""
        if budget_seconds <= 0.001:
            raise errors.CoreUnavailable(
                f"no time was left in the call's deadline to ask the core ({method}); retry",
                metadata={"coreCode": "DEADLINE_EXCEEDED", "coreMethod": method},
            )
        give_up_at = time.monotonic() + budget_seconds
        try:
            return await call(request, timeout=budget_seconds)
        except grpc.aio.AioRpcError as exc:
            # The common case above costs no retry machinery; tenacity only after a failure.
            if not _is_retryable(exc) or time.monotonic() >= give_up_at - 0.001:
                raise
        retrying = AsyncRetrying(
            retry=retry_if_exception(_is_retryable),
            stop=stop_after_delay(max(0.0, give_up_at - time.monotonic())),
            wait=wait_random_exponential(multiplier=0.05, max=0.5),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                telemetry.metrics.core_retries.add(1, {"method": method})
                left = give_up_at - time.monotonic()
                if left <= 0.001:
                    raise errors.CoreUnavailable(
                        f"the core did not answer {method} within the deadline; retry",
                        metadata={"coreCode": "DEADLINE_EXCEEDED", "coreMethod": method},
                    )
                return await call(request, timeout=left)
        raise AssertionError("unreachable")

    @_tallied
    async def probe(self) -> None:
        """A cheap call that proves the core answers: GetRun of a run that never exists (NOT_FOUND,
        or any status but UNAVAILABLE and DEADLINE_EXCEEDED, is an answer). No answer raises
        CoreUnavailable."""
        request = core_pb2.GetRunRequest(run_id=str(_PROBE_RUN_ID))
        with telemetry.tracer.start_as_current_span("core.probe"):
            try:
                await self._stub.GetRun(request, timeout=min(self._deadline, PROBE_DEADLINE_SECONDS))
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _RETRYABLE:
                    raise _unknown_outcome("GetRun", exc) from exc

    async def probe_if_quiet(self) -> None:
        """Probes the core when it said nothing since the previous heartbeat, so that
        an idle replica still finds out the core stopped (and an idle, healthy one costs one
        call per heartbeat at most)."""
        if self.tally.recent.heard_since_beat:
            return
        with contextlib.suppress(errors.CoreUnavailable):
            await self.probe()

    @_tallied
    async def create_run(
        self,
        *,
        run_id: uuid.UUID,
        user_id: str,
        document_uri: str,
        sources: Sequence[tuple[str, str]],
        hold: bool,
        delta_of_run_id: uuid.UUID | None,
        job_id: uuid.UUID | None,
        idempotency_key: str,
        request_digest: bytes,
        price: int,
    ) -> RunReport:
        """Creates the run. Raises CoreRejected / ProviderBudgetExhausted for the core's refusals
        and CoreUnavailable when the outcome is unknown (the run may exist)."""
        request = core_pb2.CreateRunRequest(
            run_id=str(run_id),
            user_id=user_id,
            document_uri=document_uri,
            sources=[core_pb2.RunSource(doi=doi, citation=citation) for doi, citation in sources],
            hold=hold,
            delta_of_run_id=str(delta_of_run_id) if delta_of_run_id else "",
            # The core stores these and lists them back: the second copy of the admit (I14).
            job_id=str(job_id) if job_id else "",
            idempotency_key=idempotency_key,
            request_digest=request_digest,
            price=price,
        )
        size = request.ByteSize()
        if size > CORE_MAX_MESSAGE_BYTES:
            # The core's transport would refuse it RESOURCE_EXHAUSTED, which reads as a spent
            # provider budget; admits are bounded so this does not happen (`validation`).
            raise errors.InvalidRequest(
                f"the run is {size} bytes, over the core's message limit of {CORE_MAX_MESSAGE_BYTES} bytes",
                field_violations=[
                    (
                        "sources",
                        f"the run sent to the core would be {size} bytes; at most {CORE_MAX_MESSAGE_BYTES} bytes fit: send fewer or shorter sources",
                    )
                ],
            )
        budget = deadline.bound(self._deadline, _CREATE_SHARE_OF_CALL)
        try:
            response = await self._with_retry("CreateRun", self._stub.CreateRun, request, budget)
        except grpc.aio.AioRpcError as exc:
            raise _admit_error(exc) from exc
        return _report_of(response.run)

    @_tallied
    async def release_run(self, run_id: uuid.UUID) -> RunReport:
        """Releases a held run. NOT_FOUND reads as UNKNOWN_TO_CORE, FAILED_PRECONDITION (the core
        refuses to release a canceled run) as CANCELED; RESOURCE_EXHAUSTED (the core is at its
        concurrency ceiling, nothing applied) raises CoreAtCapacity; no answer raises CoreUnavailable."""
        request = core_pb2.ReleaseRunRequest(run_id=str(run_id))
        try:
            response = await self._stub.ReleaseRun(request, timeout=deadline.bound(self._deadline))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return RunReport(RunFate.UNKNOWN_TO_CORE, f"core ReleaseRun: NOT_FOUND: {exc.details() or ''}".strip())
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return RunReport(RunFate.CANCELED, f"core ReleaseRun: FAILED_PRECONDITION: {exc.details() or ''}".strip())
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                # The core's "not now": at its concurrency ceiling, nothing applied (the contract).
                raise errors.CoreAtCapacity(
                    f"core ReleaseRun: RESOURCE_EXHAUSTED: {exc.details() or ''}".strip(), metadata={"coreCode": exc.code().name}
                ) from exc
            raise _unknown_outcome("ReleaseRun", exc) from exc
        return _report_of(response.run)

    @_tallied
    async def cancel_run(self, run_id: uuid.UUID) -> RunReport:
        """Cancels a run. The answer says what the run is now (CANCELED, or how it had finished
        before the cancel); NOT_FOUND reads as UNKNOWN_TO_CORE. No answer raises CoreUnavailable."""
        request = core_pb2.CancelRunRequest(run_id=str(run_id))
        try:
            response = await self._with_retry("CancelRun", self._stub.CancelRun, request, deadline.bound(self._deadline))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return RunReport(RunFate.UNKNOWN_TO_CORE)
            raise _unknown_outcome("CancelRun", exc) from exc
        return _report_of(response.run)

    @_tallied
    async def get_run(self, run_id: uuid.UUID) -> RunReport:
        """The run as the core sees it; NOT_FOUND reads as UNKNOWN_TO_CORE. No answer raises
        CoreUnavailable."""
        request = core_pb2.GetRunRequest(run_id=str(run_id))
        try:
            response = await self._stub.GetRun(request, timeout=deadline.bound(self._deadline))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return RunReport(RunFate.UNKNOWN_TO_CORE)
            raise _unknown_outcome("GetRun", exc) from exc
        return _report_of(response.run)

    @_tallied
    async def get_run_record(self, run_id: uuid.UUID) -> CoreRun | None:
        """The run with what it was created with; None when the core does not know it. No answer
        raises CoreUnavailable."""
        request = core_pb2.GetRunRequest(run_id=str(run_id))
        try:
            response = await self._stub.GetRun(request, timeout=deadline.bound(self._deadline))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise _unknown_outcome("GetRun", exc) from exc
        return _core_run_of(response.run)

    @_tallied
    async def list_runs(self, *, user_id: str = "", judging_only: bool = False, page_size: int = 500) -> list[CoreRun] | None:
        """Every live run the core holds or judges (of `user_id` when given; judging ones only
        when asked), all pages, within one deadline. None when the core does not list runs
        (UNIMPLEMENTED: an older core). No answer, or a refusal, raises CoreUnavailable: a
        partial list is never returned (a run missing from it would look settled)."""
        budget = deadline.bound(self._deadline)
        give_up_at = time.monotonic() + budget
        runs: list[CoreRun] = []
        token = ""
        with telemetry.tracer.start_as_current_span("core.list_runs") as span:
            while True:
                request = core_pb2.ListRunsRequest(page_size=page_size, page_token=token, user_id=user_id, judging_only=judging_only)
                try:
                    response = await self._with_retry("ListRuns", self._stub.ListRuns, request, give_up_at - time.monotonic())
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                        return None
                    raise _unknown_outcome("ListRuns", exc) from exc
                runs.extend(_core_run_of(run) for run in response.runs)
                token = response.next_page_token
                if not token:
                    span.set_attribute("queue.core.live_runs", len(runs))
                    return runs


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text) if text else None
    except ValueError:
        return None


def _core_run_of(run: core_pb2.Run) -> CoreRun:
    creation = run.creation
    run_id = _uuid_or_none(run.run_id)
    if run_id is None:
        raise errors.CoreUnavailable(f"the core listed a run whose id is not a UUID ({run.run_id!r})", metadata={"coreCode": "OK"})
    return CoreRun(
        run_id=run_id,
        fate=_report_of(run).fate,
        user_id=creation.user_id,
        document_uri=creation.document_uri,
        delta_of_run_id=_uuid_or_none(creation.delta_of_run_id),
        job_id=_uuid_or_none(creation.job_id),
        idempotency_key=creation.idempotency_key,
        request_digest=creation.request_digest,
        price=creation.price,
    )


def _admit_error(exc: grpc.aio.AioRpcError) -> errors.QueueError:
    code = exc.code()
    detail = exc.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        # The core's per-field reasons (google.rpc.BadRequest) reach the caller as they are.
        violations = _bad_request_violations(exc)
        return errors.CoreRejected(
            f"the core rejected the analysis: {detail}", metadata={"coreMessage": detail}, field_violations=violations
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.ProviderBudgetExhausted(f"the provider budget is exhausted: {detail}", metadata={"coreMessage": detail})
    return errors.CoreUnavailable(
        f"the core did not accept the run ({code.name}); retry with the same idempotency key",
        metadata={"coreCode": code.name},
    )


def _bad_request_violations(exc: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    """The (field, description) pairs of a google.rpc.BadRequest in the status details, if any."""
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            try:
                status = status_pb2.Status.FromString(value)
            except DecodeError:
                return []  # a malformed detail must not hide the rejection itself
            violations: list[tuple[str, str]] = []
            for detail in status.details:
                bad_request = error_details_pb2.BadRequest()
                if detail.Unpack(bad_request):
                    violations.extend((v.field, v.description) for v in bad_request.field_violations)
            return violations
    return []
