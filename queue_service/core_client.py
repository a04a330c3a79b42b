"""Calls to the core's RunService, with deadlines and the design's reading of its status codes.

The admit path's CreateRun gets one overall deadline (QUEUE_CORE_DEADLINE_SECONDS) inside
which UNAVAILABLE is retried briefly with tenacity; past it the caller hears CORE_UNAVAILABLE
(nothing charged; retrying with the same key is safe). Release attempts are single calls: their
retries outlive processes, so they are state in the job row (see `dispatcher`).
"""

from __future__ import annotations

import dataclasses
import enum
import time
import uuid
from collections.abc import Sequence

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_random_exponential

from queue_service import errors, telemetry
from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2
from queue_service._gen.acurio.core.v1 import run_service_pb2_grpc as core_grpc

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _RETRYABLE


class ReleaseResult(enum.Enum):
    RELEASED = "released"
    TRANSIENT_FAILURE = "transient_failure"
    PERMANENT_FAILURE = "permanent_failure"


@dataclasses.dataclass(frozen=True)
class ReleaseOutcome:
    result: ReleaseResult
    error: str = ""


class CoreClient:
    def __init__(self, channel: grpc.aio.Channel, *, deadline_seconds: float) -> None:
        self._channel = channel
        self._stub = core_grpc.RunServiceStub(channel)
        self._deadline = deadline_seconds

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

    async def _with_retry(self, method: str, call, request, budget_seconds: float):  # type: ignore[no-untyped-def]
        """Calls `call(request)` until it succeeds, fails for good, or the budget is spent."""
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
                remaining = give_up_at - time.monotonic()
                if remaining <= 0.001:
                    raise errors.CoreUnavailable("the core did not answer within the admit deadline; retry with the same idempotency key")
                return await call(request, timeout=remaining)
        raise AssertionError("unreachable")

    async def create_run(
        self,
        *,
        run_id: uuid.UUID,
        user_id: str,
        document_uri: str,
        sources: Sequence[tuple[str, str]],
        hold: bool,
        delta_of_run_id: uuid.UUID | None,
    ) -> None:
        request = core_pb2.CreateRunRequest(
            run_id=str(run_id),
            user_id=user_id,
            document_uri=document_uri,
            sources=[core_pb2.RunSource(doi=doi, citation=citation) for doi, citation in sources],
            hold=hold,
            delta_of_run_id=str(delta_of_run_id) if delta_of_run_id else "",
        )
        try:
            await self._with_retry("CreateRun", self._stub.CreateRun, request, self._deadline)
        except grpc.aio.AioRpcError as exc:
            raise _admit_error(exc) from exc

    async def release_run(self, run_id: uuid.UUID) -> ReleaseOutcome:
        try:
            await self._stub.ReleaseRun(core_pb2.ReleaseRunRequest(run_id=str(run_id)), timeout=self._deadline)
        except grpc.aio.AioRpcError as exc:
            detail = f"core ReleaseRun: {exc.code().name}: {exc.details() or ''}".strip()
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                return ReleaseOutcome(ReleaseResult.PERMANENT_FAILURE, detail)
            return ReleaseOutcome(ReleaseResult.TRANSIENT_FAILURE, detail)
        return ReleaseOutcome(ReleaseResult.RELEASED)

    async def cancel_run(self, run_id: uuid.UUID) -> None:
        """Cancels a run; an unknown run counts as canceled. Raises CoreUnavailable otherwise."""
        try:
            await self._with_retry("CancelRun", self._stub.CancelRun, core_pb2.CancelRunRequest(run_id=str(run_id)), self._deadline)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return
            raise errors.CoreUnavailable(
                f"the core could not cancel the run ({exc.code().name}); retry", metadata={"coreCode": exc.code().name}
            ) from exc

    async def get_run(self, run_id: uuid.UUID) -> core_pb2.Run | None:
        """The run at the core, or None when the core does not know it. Raises AioRpcError."""
        try:
            response = await self._stub.GetRun(core_pb2.GetRunRequest(run_id=str(run_id)), timeout=self._deadline)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return response.run


def _admit_error(exc: grpc.aio.AioRpcError) -> errors.QueueError:
    code = exc.code()
    detail = exc.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        # The core's per-field reasons (google.rpc.BadRequest) reach the caller as they are.
        violations = _bad_request_violations(exc)
        return errors.CoreRejected(f"the core rejected the analysis: {detail}", metadata={"coreMessage": detail}, field_violations=violations)
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
            violations = []
            for detail in status.details:
                bad_request = error_details_pb2.BadRequest()
                if detail.Unpack(bad_request):
                    violations.extend((v.field, v.description) for v in bad_request.field_violations)
            return violations
    return []
