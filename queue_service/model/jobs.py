"""A job as the queue knows it: its statuses, why it moved, what a release attempt came to, what
the core says about its run, its identity (`JobRef`) and its view (`JobView`), with the estimate
of its start.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid


class JobStatus(enum.StrEnum):
    """A job's status; the values are the database's (the `analysis_jobs.status` check)."""

    QUEUED = "queued"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def is_active(self) -> bool:
        """Holds one of the user's slots (released or about to be)."""
        return self in ACTIVE

    @property
    def is_live(self) -> bool:
        """Not ended yet: queued, pending or running."""
        return self in LIVE

    @property
    def is_finished(self) -> bool:
        """Ended by the core's judgement (not by a cancel)."""
        return self in FINISHED


ACTIVE = frozenset({JobStatus.PENDING, JobStatus.RUNNING})


LIVE = frozenset({JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING})


FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED})


class Cause(enum.StrEnum):
    """Why the queue moved: the label of promotions, endings and refunds in spans, metrics and logs."""

    ADMIT = "admit"
    COMPLETION = "completion"
    CANCEL = "cancel"
    RELEASE = "release"
    RELEASE_GIVE_UP = "release_give_up"
    RECONCILE = "reconcile"
    RUN_SETTLED = "run_settled"
    ADOPT = "adopt"  # a run the core holds or judges, adopted back into a job its database lost
    SWEEPER = "sweeper"
    TOOLING = "tooling"
    GRANT = "grant"  # an operator's credit grant (only ever a ledger entry's reason)


class ReleaseResult(enum.StrEnum):
    """What one release attempt came to."""

    RELEASED = "released"  # the core is judging the run: the job is RUNNING
    CANCELED = "canceled"  # its user asked to cancel it: the run was canceled instead (or had ended)
    REFUSED = "refused"  # the core canceled or does not know the run: the job failed, refunded
    FINISHED = "finished"  # the run had already finished (an earlier release's answer was lost)
    GAVE_UP = "gave_up"  # the release window passed without a confirmed release
    RETRY = "retry"  # no answer (maybe applied) or the run is still held: try again later
    WAITING = "waiting"  # the core said "not now" (RESOURCE_EXHAUSTED): back in line for capacity
    PAUSED = "paused"  # its releases were paused after it was claimed: back to waiting, not sent


class RunFate(enum.Enum):
    """What the core's answer says about a run."""

    HELD = "held"
    JUDGING = "judging"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    UNKNOWN_TO_CORE = "unknown_to_core"

    @property
    def settled(self) -> bool:
        """True when the run is not judging and never will (it cannot take a user's slot)."""
        return self not in (RunFate.HELD, RunFate.JUDGING)


@dataclasses.dataclass(frozen=True)
class RunReport:
    """The core's confirmed view of a run (from an answer, never from a lost call)."""

    fate: RunFate
    message: str = ""


@dataclasses.dataclass(frozen=True)
class JobRef:
    """A job's identity and status (what the engine decides on)."""

    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    status: JobStatus
    delta_of_job_id: uuid.UUID | None
    # The job has ended but the core has not yet confirmed its run settled.
    run_unsettled: bool = False
    # The user asked to cancel it while it was active (recorded before the core was asked).
    cancel_requested: bool = False
    # Who asked to cancel it (the first asker, as the ledger names actors); empty when nobody did.
    canceled_by: str = ""
    # Release attempts so far (a capacity grant counts one): fences a change decided on this read.
    release_attempts: int = 0
    # PENDING and waiting for the fleet's capacity: its run has not been released since it began
    # to wait (only a grant releases it), so the core holds it.
    waiting_for_capacity: bool = False


@dataclasses.dataclass(frozen=True)
class JobView:
    """A job as callers see it: the row, its place in the user's queue, and its refund."""

    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    status: JobStatus
    delta_of_job_id: uuid.UUID | None
    release_attempts: int
    last_error: str
    create_time: dt.datetime
    promote_time: dt.datetime | None
    start_time: dt.datetime | None
    end_time: dt.datetime | None
    price: int
    refunded: bool
    queue_seq: int
    queue_position: int
    waiting_for_job_id: uuid.UUID | None
    # The earliest start of the user's active first-pass jobs (queued jobs only).
    active_since: dt.datetime | None
    max_active_override: int | None
    # Filled in by the engine for queued jobs when a recent mean judging time is known.
    estimated_start_time: dt.datetime | None = None
    # PENDING, holding the user's slot, but waiting for the fleet's capacity at the core.
    waiting_for_capacity: bool = False
    capacity_wait_since: dt.datetime | None = None
    # 1-based place in the fleet-wide order for the core (filled in by the reads); 0: not waiting.
    capacity_position: int = 0
    # What the job judges (migration 0017): the document, how many sources, the first few of them
    # (doi, citation cut short). Empty for a job admitted before the service stored them.
    document_uri: str = ""
    document_title: str = ""
    source_count: int = 0
    sources_preview: tuple[tuple[str, str], ...] = ()
    # Retry lineage (migration 0027): the ended job this one admits again, and the jobs admitted
    # as retries of this one, oldest first.
    retry_of_job_id: uuid.UUID | None = None
    retried_as_job_ids: tuple[uuid.UUID, ...] = ()
    # Who asked to cancel it, as the ledger names actors; empty when nobody did.
    canceled_by: str = ""
    # Filled in by the reads: a RUNNING job judging far longer than usual (its run unconfirmed), and
    # a QUEUED job waiting behind one (no start promised).
    run_overdue: bool = False
    behind_overdue_run: bool = False


def estimate_start(
    view: JobView,
    *,
    mean_judging_seconds: float | None,
    default_max_active: int,
    now: dt.datetime,
    capacity_limit: int | None = None,
    capacity_waiting: int = 0,
) -> dt.datetime | None:
    """When a job is expected to start. None without a recent mean judging time.

    Queued: the active job's expected end, plus one mean judging time per full round of the
    user's slots ahead of it, plus, while jobs wait for the fleet's capacity, that wait for each
    round (the `capacity_waiting` jobs ahead, `capacity_limit` of them leaving per mean judging
    time). Waiting for capacity: its place in line over the limit, in mean judging times."""
    if mean_judging_seconds is None:
        return None
    mean = dt.timedelta(seconds=mean_judging_seconds)
    fleet_wait = mean * (capacity_waiting / capacity_limit) if capacity_limit and capacity_waiting else dt.timedelta(0)
    if view.status is JobStatus.PENDING and view.waiting_for_capacity:
        if not capacity_limit:
            return None
        return now + mean * (max(1, view.capacity_position) - 1) / capacity_limit
    if view.status is not JobStatus.QUEUED:
        return None
    first_free = max(now, view.active_since + mean) if view.active_since is not None else now
    slots = view.max_active_override or default_max_active
    rounds_ahead = (max(1, view.queue_position) - 1) // max(1, slots)
    return first_free + fleet_wait + rounds_ahead * (mean + fleet_wait)
