"""Domain errors: one root type carrying everything a caller needs to act.

The domain raises these; `error_interceptor` alone turns them into a gRPC status with
`google.rpc.ErrorInfo` (and `BadRequest` for field violations). Reasons are a stable
vocabulary: callers in other languages branch on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

ERROR_DOMAIN = "queue.acurio.app"


class QueueError(Exception):
    """A failure the caller is told about as a status code plus an ErrorInfo reason."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "INTERNAL"
    # When set, the status carries google.rpc.RetryInfo with this delay: the same request (same
    # idempotency key) may be sent again after it.
    retry_delay_seconds: float | None = None

    def __init__(
        self,
        message: str,
        *,
        metadata: Mapping[str, str] | None = None,
        field_violations: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = dict(metadata or {})
        self.field_violations = list(field_violations)


def _error(name: str, code: grpc.StatusCode, reason: str, doc: str, retry_delay_seconds: float | None = None) -> type[QueueError]:
    attributes = {"code": code, "reason": reason, "__doc__": doc, "retry_delay_seconds": retry_delay_seconds}
    return type(name, (QueueError,), attributes)


InvalidRequest = _error("InvalidRequest", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", "The request is malformed; see the field violations.")
CoreRejected = _error("CoreRejected", grpc.StatusCode.INVALID_ARGUMENT, "CORE_REJECTED", "The core rejected the document or a source.")
InsufficientCredits = _error("InsufficientCredits", grpc.StatusCode.FAILED_PRECONDITION, "INSUFFICIENT_CREDITS", "The balance does not cover the price.")
IdempotencyKeyReused = _error("IdempotencyKeyReused", grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED", "The key was used with another payload.")
DeltaBaseNotFound = _error("DeltaBaseNotFound", grpc.StatusCode.NOT_FOUND, "DELTA_BASE_NOT_FOUND", "The delta base job is unknown or another user's.")
DeltaBaseNotFinished = _error("DeltaBaseNotFinished", grpc.StatusCode.FAILED_PRECONDITION, "DELTA_BASE_NOT_FINISHED", "The delta base job has not succeeded.")
ProviderBudgetExhausted = _error("ProviderBudgetExhausted", grpc.StatusCode.RESOURCE_EXHAUSTED, "PROVIDER_BUDGET_EXHAUSTED", "The core's provider budget is used up.")
UserQueueFull = _error("UserQueueFull", grpc.StatusCode.RESOURCE_EXHAUSTED, "USER_QUEUE_FULL", "The user has the maximum number of queued jobs.")
CoreUnavailable = _error("CoreUnavailable", grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE", "The core did not answer in time.", retry_delay_seconds=1.0)
JobNotFound = _error("JobNotFound", grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND", "No such job (for this user).")
JobNotPending = _error("JobNotPending", grpc.StatusCode.FAILED_PRECONDITION, "JOB_NOT_PENDING", "The job is not PENDING.")
JobAlreadyFinished = _error("JobAlreadyFinished", grpc.StatusCode.FAILED_PRECONDITION, "JOB_ALREADY_FINISHED", "The job already succeeded or failed.")
RunNotFound = _error("RunNotFound", grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND", "No job owns this run.")
RunNotYetAdmitted = _error("RunNotYetAdmitted", grpc.StatusCode.UNAVAILABLE, "RUN_NOT_YET_ADMITTED", "The run's admit has not committed yet; retry the completion.", retry_delay_seconds=0.2)
UserDeltaLimit = _error("UserDeltaLimit", grpc.StatusCode.RESOURCE_EXHAUSTED, "USER_DELTA_LIMIT", "The user has the maximum number of delta re-checks running.")
RunNotReleased = _error("RunNotReleased", grpc.StatusCode.FAILED_PRECONDITION, "RUN_NOT_RELEASED", "The run's job is still queued.")
TooManyStreams = _error("TooManyStreams", grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS", "Too many WatchJobs streams are open.")
DatabaseUnavailable = _error("DatabaseUnavailable", grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE", "The database cannot be reached or is busy; retry.", retry_delay_seconds=1.0)
LockTimeout = _error("LockTimeout", grpc.StatusCode.UNAVAILABLE, "LOCK_TIMEOUT", "The user's queue is busy; retry.", retry_delay_seconds=0.2)
Conflict = _error("Conflict", grpc.StatusCode.ABORTED, "CONFLICT", "A concurrent change won; retry.", retry_delay_seconds=0.05)
ShuttingDown = _error("ShuttingDown", grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", "This replica is draining; retry on another.", retry_delay_seconds=0.1)
ReplicaBusy = _error("ReplicaBusy", grpc.StatusCode.UNAVAILABLE, "REPLICA_BUSY", "This replica cannot take the call in time; retry, ideally on another.", retry_delay_seconds=0.1)
Unauthenticated = _error("Unauthenticated", grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED", "No valid credentials.")
PermissionDenied = _error("PermissionDenied", grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED", "The caller's role may not call this method.")
