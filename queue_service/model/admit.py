"""What an admit carries, checks and writes: the validated request, the state it decides on, the
limits of the locked admit, the new job's row, its inputs in full, and what the admit came to.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import uuid

from queue_service.model.jobs import JobStatus, JobView

# The idempotency keys an operator's retry (OperatorService.RetryJob, RetryJobs) admits with begin
# with this, then the ended job's id (`retry_idempotency_key`). Admit refuses the prefix to every
# other caller, so a key with it always names the job it retries (`retried_job_id`).
RETRY_KEY_PREFIX = "retry:"
# As the trigger of functions/analysis_jobs_retry_lineage.sql reads it: the prefix, then a job id.
_RETRY_KEY = re.compile(r"retry:([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


def retry_idempotency_key(job_id: uuid.UUID, retry_key: str = "") -> str:
    """The key of a retry of `job_id`: a plain retry's (no retry key) is the job's alone, so every
    plain retry of it is one admit; a further retry's also hashes its retry key, at most 75
    characters (within the 128 an idempotency key may have) whatever the retry key's length."""
    if not retry_key:
        return f"{RETRY_KEY_PREFIX}{job_id}"
    digest = hashlib.sha256(f"{job_id}\x00{retry_key}".encode()).hexdigest()[:32]
    return f"{RETRY_KEY_PREFIX}{job_id}:{digest}"


def retried_job_id(idempotency_key: str) -> uuid.UUID | None:
    """The job a retry's key (`retry_idempotency_key`) admits again; None for any other key. An
    adoption after a failover reads a retry's lineage here from the key the core's record kept."""
    match = _RETRY_KEY.match(idempotency_key)
    return uuid.UUID(match[1]) if match else None


@dataclasses.dataclass(frozen=True)
class AdmitRequest:
    """A validated admit, as the engine takes it."""

    user_id: str
    idempotency_key: str
    document_uri: str
    sources: tuple[tuple[str, str], ...]
    delta_of_job_id: uuid.UUID | None
    request_digest: bytes
    document_title: str = ""
    # Admitted by an operator's RetryJob or RetryJobs: the user's free-work limit never refuses it
    # (what counts against the limit is her own choice; docs/security.md).
    operator_retry: bool = False
    # The ended job a retry admits again (its lineage, stored with the new job); None for every
    # other admit.
    retry_of_job_id: uuid.UUID | None = None


@dataclasses.dataclass(frozen=True)
class AdmitState:
    """What an admit checks before it asks the core: the key, the limits, the balance, the base."""

    existing_job_id: uuid.UUID | None
    existing_digest: bytes | None
    queued_count: int
    # The user's re-checks waiting for a turn or judging (her delta limit counts both).
    running_deltas: int
    balance: int
    base_user_id: str | None
    base_status: JobStatus | None
    base_run_id: uuid.UUID | None
    # The fleet's capacity is limited: a delta's run is created held, to wait for a turn (I12).
    capacity_limited: bool = False
    # The user's jobs admitted within the last hour that cost nothing in the end (at most the
    # limit asked for), and the seconds until the oldest of those leaves the hour.
    free_admits_last_hour: int = 0
    free_admit_frees_in_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class AdmitLimits:
    """What the locked admit checks and sets: a user's slots unless overridden, the queue and
    delta limits, and the times a PENDING job's first release and a RUNNING job's reconciliation
    are due (the promotion's `PromotionLimits`, plus the admit's own)."""

    default_max_active: int
    max_queued: int
    max_running_deltas: int
    release_window_seconds: float
    release_lease_seconds: float
    reconcile_after_seconds: float


@dataclasses.dataclass(frozen=True)
class NewJob:
    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    idempotency_key: str
    request_digest: bytes
    delta_of_job_id: uuid.UUID | None
    price: int
    # What the job judges, stored with it (shown bounded; admitted again by a retry).
    document_uri: str = ""
    document_title: str = ""
    sources: tuple[tuple[str, str], ...] = ()
    # A delta whose run was created held (the capacity was limited): admitted PENDING, released
    # by a grant; otherwise a delta's run judges at once and the job is RUNNING.
    delta_held: bool = False
    # The ended job this one retries (`AdmitRequest.retry_of_job_id`), written by the admit itself.
    retry_of_job_id: uuid.UUID | None = None


@dataclasses.dataclass(frozen=True)
class JobInputs:
    """What a job was admitted with, in full: what OperatorService.RetryJob admits again.
    `sources` is None for a job admitted before the service stored them, and for one whose
    sources were pruned past their retention (`sources_pruned`)."""

    job_id: uuid.UUID
    user_id: str
    status: JobStatus
    delta_of_job_id: uuid.UUID | None
    document_uri: str
    document_title: str
    sources: tuple[tuple[str, str], ...] | None
    sources_pruned: bool = False
    # The newest job admitted as a retry of this one; None when it was never retried.
    newest_retry_job_id: uuid.UUID | None = None


@dataclasses.dataclass(frozen=True)
class AdmittedJob:
    """What the admit's statement wrote: the job's view, and whether the database history it was
    written on is reconciled with the core (`ClaimedRelease.history_reconciled`, for the release a
    PENDING job's admit claimed)."""

    view: JobView
    history_reconciled: bool | None = None


@dataclasses.dataclass(frozen=True)
class AdmitResult:
    job_id: uuid.UUID
    duplicate: bool
    # The job's view, read in the admit transaction itself (None for a duplicate: read it anew).
    view: JobView | None = None
