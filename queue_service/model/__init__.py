"""The queue's model: job statuses, what the core says about a run, named transitions, and the
typed values that travel between the store, the engine and the edge.

Nothing here does I/O or knows gRPC or SQL: the store builds these from rows (`store/rows.py`), the
edge turns them into protos. See docs/design.md for the lifecycle and docs/architecture.md for who uses what.

One module per concern, every public name re-exported here (import from `queue_service.model`):
`jobs` (statuses, causes, a run's fate, `JobRef`, `JobView`), `transitions` (the named endings),
`admit`, `lifecycle` (promotions, endings, completions), `claims` (the durable retries, one claim
type per `ClaimKind`), `capacity` (the fleet's capacity, pauses, settings), `failover` (the core's
runs as the second copy, the database's identity), `core_health`, `operator` (search, overview,
audit, replicas) and `credits`.
"""

from queue_service.model.admit import AdmitLimits, AdmitRequest, AdmitResult, AdmitState, AdmittedJob, JobInputs, NewJob
from queue_service.model.capacity import (
    PAUSED_USERS_NAMED_AT_MOST,
    CapacityGrant,
    CapacityState,
    PauseInForce,
    ReleasePause,
    SettingChange,
    UserSettings,
)
from queue_service.model.claims import (
    Claim,
    ClaimedReconciliation,
    ClaimedRelease,
    ClaimedReservation,
    ClaimedSettlement,
    ClaimKind,
    ExpiredRelease,
    ScheduledRetry,
)
from queue_service.model.core_health import (
    CORE_DEGRADED_AFTER_FAILURE,
    CORE_LATENCY_BOUNDS_MS,
    CORE_METHODS,
    CORE_WINDOW_MINUTES,
    CoreHealth,
    CoreHealthReport,
    CoreMethodCalls,
    CoreMethodFailure,
    CoreMethodHealth,
    CoreMinute,
    CoreState,
    combined_core_health,
)
from queue_service.model.credits import GrantOutcome, LedgerEntry, LedgerKind, LedgerQuery
from queue_service.model.failover import Adoption, CoreRun, DatabaseIdentity, LostRun, ReplicationStance, UnlistedRun
from queue_service.model.jobs import (
    ACTIVE,
    FINISHED,
    LIVE,
    Cause,
    JobRef,
    JobStatus,
    JobView,
    ReleaseResult,
    RunFate,
    RunReport,
    estimate_start,
)
from queue_service.model.lifecycle import JobEnding, Promoted, PromotionLimits, RunCompletion, RunReportToApply, RunSettlement
from queue_service.model.operator import (
    AuditEvent,
    AuditQuery,
    JobInputsSearch,
    JobSearch,
    LiveJobFilter,
    Overview,
    QueueMinute,
    ReplicaReport,
    UserWork,
)
from queue_service.model.transitions import FORGOTTEN_BY_CORE_MESSAGE, Transition, cancel_message

__all__ = [
    "ACTIVE",
    "AdmitLimits",
    "AdmitRequest",
    "AdmitResult",
    "AdmitState",
    "AdmittedJob",
    "Adoption",
    "AuditEvent",
    "AuditQuery",
    "CORE_DEGRADED_AFTER_FAILURE",
    "CORE_LATENCY_BOUNDS_MS",
    "CORE_METHODS",
    "CORE_WINDOW_MINUTES",
    "CapacityGrant",
    "CapacityState",
    "Cause",
    "Claim",
    "ClaimKind",
    "ClaimedReconciliation",
    "ClaimedRelease",
    "ClaimedReservation",
    "ClaimedSettlement",
    "CoreHealth",
    "CoreHealthReport",
    "CoreMethodCalls",
    "CoreMethodFailure",
    "CoreMethodHealth",
    "CoreMinute",
    "CoreRun",
    "CoreState",
    "DatabaseIdentity",
    "ExpiredRelease",
    "FINISHED",
    "FORGOTTEN_BY_CORE_MESSAGE",
    "GrantOutcome",
    "JobEnding",
    "JobInputs",
    "JobInputsSearch",
    "JobRef",
    "JobSearch",
    "JobStatus",
    "JobView",
    "LIVE",
    "LedgerEntry",
    "LedgerKind",
    "LedgerQuery",
    "LiveJobFilter",
    "LostRun",
    "NewJob",
    "Overview",
    "PAUSED_USERS_NAMED_AT_MOST",
    "PauseInForce",
    "Promoted",
    "PromotionLimits",
    "QueueMinute",
    "ReleasePause",
    "ReleaseResult",
    "ReplicaReport",
    "ReplicationStance",
    "RunCompletion",
    "RunFate",
    "RunReport",
    "RunReportToApply",
    "RunSettlement",
    "ScheduledRetry",
    "SettingChange",
    "Transition",
    "UnlistedRun",
    "UserSettings",
    "UserWork",
    "cancel_message",
    "combined_core_health",
    "estimate_start",
]
