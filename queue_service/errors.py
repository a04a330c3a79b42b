"""Domain errors: one root type carrying everything a caller needs to act.

The domain raises these with a reason (a stable vocabulary: callers in other languages branch on
it), a message and metadata. The table from reason to status code lives at the edge
(`api/road/status.py`), which alone turns them into a gRPC status with `google.rpc.ErrorInfo` (and
`BadRequest` for field violations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ERROR_DOMAIN = "queue.acurio.app"


class QueueError(Exception):
    """A failure the caller is told about as a status code plus an ErrorInfo reason."""

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
        quota_violations: Sequence[tuple[str, str]] = (),
        retry_delay_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = dict(metadata or {})
        self.field_violations = list(field_violations)
        # (subject, description) of each quota exceeded: a google.rpc.QuotaFailure.
        self.quota_violations = list(quota_violations)
        if retry_delay_seconds is not None:
            self.retry_delay_seconds = retry_delay_seconds


class InvalidRequest(QueueError):
    """The request is malformed; see the field violations."""

    reason = "INVALID_REQUEST"


class CoreRejected(QueueError):
    """The core rejected the document or a source."""

    reason = "CORE_REJECTED"


class InsufficientCredits(QueueError):
    """The balance does not cover the price."""

    reason = "INSUFFICIENT_CREDITS"


class IdempotencyKeyReused(QueueError):
    """The key was used with another payload."""

    reason = "IDEMPOTENCY_KEY_REUSED"


class DeltaBaseNotFound(QueueError):
    """The delta base job is unknown or another user's."""

    reason = "DELTA_BASE_NOT_FOUND"


class DeltaBaseNotFinished(QueueError):
    """The delta base job has not succeeded."""

    reason = "DELTA_BASE_NOT_FINISHED"


class ProviderBudgetExhausted(QueueError):
    """The core's provider budget is used up."""

    reason = "PROVIDER_BUDGET_EXHAUSTED"


class UserQueueFull(QueueError):
    """The user has the maximum number of queued jobs."""

    reason = "USER_QUEUE_FULL"


class CoreUnavailable(QueueError):
    """The core did not answer in time."""

    reason = "CORE_UNAVAILABLE"
    retry_delay_seconds = 1.0


class CoreAtCapacity(QueueError):
    """The core answered RESOURCE_EXHAUSTED to a release: at its concurrency ceiling now, nothing
    applied. The job waits for capacity again; no caller hears it but a tooling Release."""

    reason = "CORE_AT_CAPACITY"
    retry_delay_seconds = 1.0


class JobNotFound(QueueError):
    """No such job (for this user)."""

    reason = "JOB_NOT_FOUND"


class JobNotPending(QueueError):
    """The job is not PENDING."""

    reason = "JOB_NOT_PENDING"


class JobNotRetryable(QueueError):
    """The job cannot be admitted again: it has not failed or been canceled, or what it judges
    was not stored (admitted before the service stored it)."""

    reason = "JOB_NOT_RETRYABLE"


class JobInputsPruned(QueueError):
    """The job's full sources were deleted past QUEUE_JOB_INPUTS_RETENTION_SECONDS: it cannot be
    admitted again from what the queue kept (admit it again from the web app)."""

    reason = "JOB_INPUTS_PRUNED"


class JobAlreadyFinished(QueueError):
    """The job already succeeded or failed."""

    reason = "JOB_ALREADY_FINISHED"


class RunNotFound(QueueError):
    """No job owns this run."""

    reason = "RUN_NOT_FOUND"


class RunNotYetAdmitted(QueueError):
    """The run's admit has not committed yet; retry the completion."""

    reason = "RUN_NOT_YET_ADMITTED"
    retry_delay_seconds = 0.2


class UserDeltaLimit(QueueError):
    """The user has the maximum number of delta re-checks running."""

    reason = "USER_DELTA_LIMIT"


class UserFreeWorkLimit(QueueError):
    """The user had QUEUE_MAX_FREE_ADMITS_PER_USER_PER_HOUR jobs within the last hour that cost
    nothing in the end (free delta re-checks, refunded jobs): each stores its sources all the
    same. RetryInfo says when the oldest of them leaves the hour; a QuotaFailure names the quota."""

    reason = "USER_FREE_WORK_LIMIT"


class RunNotReleased(QueueError):
    """The run's job is still queued."""

    reason = "RUN_NOT_RELEASED"


class TooManyStreams(QueueError):
    """Too many WatchJobs streams are open."""

    reason = "TOO_MANY_STREAMS"


class DatabaseUnavailable(QueueError):
    """The database cannot be reached or is busy; retry."""

    reason = "DATABASE_UNAVAILABLE"
    retry_delay_seconds = 1.0


class OutcomeUnknown(QueueError):
    """A change was sent to the database and its answer did not come (the call's deadline passed
    and the statement was cancelled, a commit acknowledged late being kept; or the connection
    broke): it may have committed.
    Retrying the same request (the same idempotency key) is safe and is how to learn what
    happened; whatever the committed change owes (a release, a promotion) is still done."""

    reason = "OUTCOME_UNKNOWN"
    retry_delay_seconds = 0.5


class LockTimeout(QueueError):
    """The user's queue is busy; retry."""

    reason = "LOCK_TIMEOUT"
    retry_delay_seconds = 0.2


class Conflict(QueueError):
    """A concurrent change won; retry."""

    reason = "CONFLICT"
    retry_delay_seconds = 0.05


class ShuttingDown(QueueError):
    """This replica is draining; retry on another."""

    reason = "SHUTTING_DOWN"
    retry_delay_seconds = 0.1


class ReplicaBusy(QueueError):
    """This replica cannot take the call in time; retry, ideally on another."""

    reason = "REPLICA_BUSY"
    retry_delay_seconds = 0.1


class Unauthenticated(QueueError):
    """No valid credentials."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(QueueError):
    """The caller's role may not call this method."""

    reason = "PERMISSION_DENIED"


class UserAssertionInvalid(QueueError):
    """A `web` call that acts for a user carries no valid per-user assertion (missing, malformed,
    wrongly signed, expired, or for another audience or issuer)."""

    reason = "USER_ASSERTION_INVALID"


class UserMismatch(QueueError):
    """The per-user assertion vouches for another user than the request's user_id."""

    reason = "USER_MISMATCH"


class Internal(QueueError):
    """A state the queue should never reach; a bug, reported as INTERNAL."""

    reason = "INTERNAL"
