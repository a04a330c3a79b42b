"""The queue's model: job statuses, what the core says about a run, named transitions, and the
typed values that travel between the store, the engine and the edge.

Nothing here does I/O or knows gRPC or SQL: the store builds these from rows (`store/rows.py`), the
edge turns them into protos. See docs/design.md for the lifecycle and docs/architecture.md for who uses what.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from typing import ClassVar


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
class CoreRun:
    """A run as the core's record has it (ListRuns, GetRun): its state and what it was created
    with, the queue's own fields included (empty from a core or a queue that did not store them)."""

    run_id: uuid.UUID
    fate: RunFate
    user_id: str
    document_uri: str
    delta_of_run_id: uuid.UUID | None
    job_id: uuid.UUID | None
    idempotency_key: str
    request_digest: bytes
    price: int

    @property
    def first_pass(self) -> bool:
        return self.delta_of_run_id is None

    @property
    def adoptable(self) -> bool:
        """Whether the record holds what a job needs: its id, user, key and digest."""
        return self.job_id is not None and bool(self.user_id) and bool(self.idempotency_key) and bool(self.request_digest)


@dataclasses.dataclass(frozen=True)
class Adoption:
    """What adopting a core's run came to: `kind` is 'adopted', 'known', 'key_taken' (with a
    job's view), or 'reserved', 'delta_base_lost', 'balance_short' (without). `taken_back`: the
    user's PENDING jobs an adopted judging run sent back to her queue (migration 0024)."""

    kind: str
    view: JobView | None
    taken_back: tuple[JobView, ...] = ()


@dataclasses.dataclass(frozen=True)
class LostRun:
    """A run reconciliation could not adopt, recorded for the operator."""

    run_id: uuid.UUID
    user_id: str
    job_id: uuid.UUID | None
    idempotency_key: str
    price: int
    core_state: str
    reason: str
    recorded_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class DatabaseIdentity:
    """Which database history the service writes to: a change of either part means a failover
    (or a restore) may have lost commits."""

    system_identifier: str | None
    timeline_id: int | None
    # The queue has reconciled this history with the core's runs (so it forgot none the core
    # judges): a fact about the history at the look, not part of which history it is.
    reconciled: bool = dataclasses.field(default=False, compare=False)


# The `last_error` of a job whose run the core no longer knows (`Transition.forgotten_by_core`).
FORGOTTEN_BY_CORE_MESSAGE = (
    "the core no longer knows this job's run (it restarted without its runs, or let the held run expire):"
    " nothing will judge it, so the job failed and its credits were refunded; admit it again"
)


@dataclasses.dataclass(frozen=True)
class UnlistedRun:
    """An active job whose run the core's listing of its live runs did not show (a run the core
    may have lost: `GetRun` decides), with what fences ending it."""

    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    status: JobStatus
    release_attempts: int


def cancel_message(actor: str) -> str:
    """A canceled job's `last_error`, naming who asked (an actor as the ledger names it, empty
    when not known here): a user's cancel through the web app is the user's, an operator's names
    the operator, so an operator's cancel never reads as the user's."""
    role, _, name = actor.partition(":")
    if not actor:
        return "canceled"
    if role == "web":
        return "canceled by the user"
    if role == "operator":
        return f"canceled by operator {name}"
    if role == "system":
        return "canceled by the service"
    return f"canceled by {actor}"


@dataclasses.dataclass(frozen=True)
class Transition:
    """A named way for a job to end: from which statuses, to which, and what it does to the
    credit and the slot. Built only by the constructors below, so every ending has a name."""

    cause: Cause
    from_statuses: frozenset[JobStatus]
    to: JobStatus
    last_error: str = ""
    refund: bool = False
    # The core has not confirmed that the run stopped: the job keeps its slot until it does.
    run_unsettled: bool = False
    # Fences a release's outcome to the attempt that claimed it.
    expected_attempts: int | None = None

    @property
    def refund_cause(self) -> Cause:
        """Why a refund this ending made was made: its own (`refund`), or else the user's recorded
        cancel (the store refunds a FAILED ending of a job whose user asked to cancel it)."""
        return self.cause if self.refund else Cause.CANCEL

    @classmethod
    def completed(cls, *, succeeded: bool, refund: bool, message: str) -> Transition:
        """The core's CompleteRun callback for a PENDING or RUNNING job."""
        if succeeded:
            return cls(Cause.COMPLETION, ACTIVE, JobStatus.SUCCEEDED, refund=refund)
        return cls(Cause.COMPLETION, ACTIVE, JobStatus.FAILED, message or "the core reported a failure", refund=refund)

    @classmethod
    def canceled_while_queued(cls, *, by: str = "") -> Transition:
        """A cancel of a QUEUED job (asked for by the actor `by`): refunded at once; its held run is
        canceled afterwards."""
        return cls(Cause.CANCEL, frozenset({JobStatus.QUEUED}), JobStatus.CANCELED, cancel_message(by), refund=True, run_unsettled=True)

    @classmethod
    def canceled_while_waiting_for_capacity(cls, *, attempts: int, by: str = "") -> Transition:
        """A cancel of a PENDING job waiting for the fleet's capacity: its run was never released
        (only a grant releases it, and a grant counts an attempt: `attempts` fences one that came
        meanwhile), so the job ends at once, refunded, without the core; its held run is canceled
        afterwards, durably, and its slot stays taken until the core confirms that."""
        return cls(
            Cause.CANCEL,
            frozenset({JobStatus.PENDING}),
            JobStatus.CANCELED,
            cancel_message(by),
            refund=True,
            run_unsettled=True,
            expected_attempts=attempts,
        )

    @classmethod
    def canceled(cls, report: RunReport, *, by: str = "") -> Transition:
        """A cancel of an active job (asked for by the actor `by`, when known), ended as the core's
        answer to CancelRun says."""
        if report.fate in (RunFate.SUCCEEDED, RunFate.FAILED):
            return cls._as_reported(Cause.CANCEL, ACTIVE, report)
        return cls(Cause.CANCEL, ACTIVE, JobStatus.CANCELED, cancel_message(by), refund=True)

    @classmethod
    def canceled_instead_of_released(cls, report: RunReport, *, attempt: int) -> Transition:
        """A PENDING job whose user asked to cancel it while the core's answer was lost: its next
        release attempt cancels the run instead, and the answer ends the job as `canceled` does."""
        return dataclasses.replace(cls.canceled(report), from_statuses=frozenset({JobStatus.PENDING}), expected_attempts=attempt)

    @classmethod
    def given_up(cls, reason: str, *, attempts: int) -> Transition:
        """A PENDING job whose release did not succeed in its window: failed and refunded. Its run
        may judge after all (a release applied, its answer lost), so the slot stays taken."""
        return cls(
            Cause.RELEASE_GIVE_UP,
            frozenset({JobStatus.PENDING}),
            JobStatus.FAILED,
            reason,
            refund=True,
            run_unsettled=True,
            expected_attempts=attempts,
        )

    @classmethod
    def release_answered(cls, report: RunReport, *, attempt: int) -> Transition:
        """A release met a run that had ended already (or that the core does not know)."""
        transition = cls._as_reported(Cause.RELEASE, frozenset({JobStatus.PENDING}), report)
        if report.fate in (RunFate.CANCELED, RunFate.UNKNOWN_TO_CORE):
            transition = dataclasses.replace(transition, last_error=f"release refused by the core: {report.message}")
        return dataclasses.replace(transition, expected_attempts=attempt)

    @classmethod
    def reconciled(cls, report: RunReport) -> Transition:
        """A RUNNING job whose completion never arrived, ended as the core reports its run."""
        return cls._as_reported(Cause.RECONCILE, frozenset({JobStatus.RUNNING}), report)

    @classmethod
    def forgotten_by_core(cls, status: JobStatus, *, attempts: int) -> Transition:
        """An active job whose run the core no longer knows (it restarted without its runs, or let
        a held run expire): nothing will judge it, so it fails, refunded as a reconciliation is
        (the user did not cause it). `attempts` fences a release claimed meanwhile. Its run is
        canceled afterwards (a CreateRun still on its way then finds it canceled), so its seat
        frees once the core confirms that."""
        return cls(
            Cause.RECONCILE,
            frozenset({status}),
            JobStatus.FAILED,
            FORGOTTEN_BY_CORE_MESSAGE,
            refund=True,
            run_unsettled=True,
            expected_attempts=attempts,
        )

    @classmethod
    def _as_reported(cls, cause: Cause, from_statuses: frozenset[JobStatus], report: RunReport) -> Transition:
        if report.fate is RunFate.SUCCEEDED:
            return cls(cause, from_statuses, JobStatus.SUCCEEDED)
        if report.fate is RunFate.FAILED:
            return cls(cause, from_statuses, JobStatus.FAILED, report.message or "the core reported a failure", refund=True)
        if report.fate is RunFate.CANCELED:
            return cls(cause, from_statuses, JobStatus.CANCELED, report.message or "the run was canceled at the core", refund=True)
        if report.fate is RunFate.UNKNOWN_TO_CORE:
            # The core may learn of the run late (a CreateRun still in flight): not yet settled.
            return cls(
                cause,
                from_statuses,
                JobStatus.FAILED,
                report.message or "the core does not know this run",
                refund=True,
                run_unsettled=True,
            )
        raise ValueError(f"a {report.fate.value} run has not ended")


# -- what the store reads and writes -----------------------------------------------------------


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
class PromotionLimits:
    """What a promotion needs to know: a user's slots unless overridden, how long a promoted job
    may take to be released, and the lease on the first release it claims."""

    default_max_active: int
    release_window_seconds: float
    release_lease_seconds: float


@dataclasses.dataclass(frozen=True)
class Promoted:
    """A queued job moved into a free slot: PENDING, its first release claimed for this replica."""

    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    # The fleet's capacity is limited: the job waits for a grant, its release not yet claimed.
    waiting: bool = False
    # As `ClaimedRelease.history_reconciled`, from the promoting statement.
    history_reconciled: bool | None = None

    @property
    def first_release(self) -> ClaimedRelease:
        return ClaimedRelease(self.job_id, self.user_id, self.run_id, attempt=1, history_reconciled=self.history_reconciled)


class ClaimKind(enum.StrEnum):
    """The durable retries: work a replica claims for one attempt and tries until it is done."""

    RELEASE = "release"  # a PENDING job's ReleaseRun
    RUN_SETTLEMENT = "run_settlement"  # an ended job's run, canceled until the core confirms it settled
    RESERVATION_CANCEL = "reservation_cancel"  # an orphaned reservation's run, canceled until confirmed
    RECONCILIATION = "reconciliation"  # a RUNNING job whose completion is overdue, asked about at the core


class Claim:
    """One attempt at a durable retry, claimed by this replica: one shape for every kind. The
    statement that claims it leases it (or pushes its next look ahead), so one replica at a time
    tries it; `attempt` fences what the attempt writes, and a failed attempt is scheduled again
    with backoff (`Statements.schedule_retry`) or left to its lease. `key` names the row: the job,
    or the run for a reservation cancel."""

    kind: ClassVar[ClaimKind]
    attempt: int

    @property
    def key(self) -> uuid.UUID:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class ClaimedRelease(Claim):
    """A PENDING job's release, claimed by this replica for one attempt (leased)."""

    kind: ClassVar[ClaimKind] = ClaimKind.RELEASE

    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    attempt: int
    # Its user asked to cancel it and the core's answer never came: the attempt cancels the run.
    cancel_requested: bool = False
    # Granted above the limit the core taught us (one probe per interval, fleet-wide).
    probe: bool = False
    # Whether the database history the claim was made on had been reconciled with the core's
    # runs (the claim's statement says; None: not known). Only on an unreconciled history can the
    # database have forgotten a run the core judges, so only then does the release ask the core.
    history_reconciled: bool | None = None
    # A delta re-check's release (under a limited capacity): I9's check at the core is for
    # first-pass runs only.
    delta: bool = False
    # The dispatcher held it back for a free place among the releases in flight: a pause of
    # releases may have committed since it was claimed, so the attempt checks before it is sent.
    waited_for_a_slot: bool = False

    @property
    def key(self) -> uuid.UUID:
        return self.job_id


@dataclasses.dataclass(frozen=True)
class CapacityGrant:
    """What one grant of the core's capacity did: the releases it claimed for this replica (each
    with how long its job waited) and whether the fleet's capacity is limited now."""

    claims: tuple[tuple[ClaimedRelease, float], ...]
    limited: bool
    in_use: int = 0
    # The limit the grant used (None: unlimited).
    limit: int | None = None


# The most users paused on their own (SetReleasesPaused with a user id) whom the capacity's state
# names, for the estimates to leave out; beyond it every estimate is left out while they are paused.
PAUSED_USERS_NAMED_AT_MOST = 1000


@dataclasses.dataclass(frozen=True)
class CapacityState:
    """The core's capacity now, fleet-wide: the setting (0: unlimited), the limit the core taught
    us by refusing (None: none), what is in use and who waits for it."""

    capacity: int
    core_limit: int | None
    in_use: int
    waiting_jobs: int
    waiting_users: int
    oldest_wait_since: dt.datetime | None
    core_refusals: int
    updated_by: str
    updated_at: dt.datetime | None
    # The fleet-wide pause of releases in force (None: releases go on), and how many users'
    # releases are paused on their own (migration 0028).
    fleet_pause: ReleasePause | None = None
    paused_users: int = 0
    # Which users those are, when the read could name them all (PAUSED_USERS_NAMED_AT_MOST);
    # None when more are paused than a read names.
    paused_user_ids: frozenset[str] | None = frozenset()

    def releases_paused_for(self, user_id: str) -> bool:
        """Whether the user's held runs wait for a resume now: the fleet's pause, her own, or (more
        users paused on their own than a read names) possibly hers."""
        if self.fleet_pause is not None:
            return True
        if self.paused_users == 0:
            return False
        return self.paused_user_ids is None or user_id in self.paused_user_ids

    @property
    def effective_limit(self) -> int | None:
        """The most runs granted at once now (None: unlimited)."""
        limits = [limit for limit in (self.capacity or None, self.core_limit) if limit is not None]
        return min(limits) if limits else None


@dataclasses.dataclass(frozen=True)
class ReleasePause:
    """A pause of releases in force (the fleet's or one user's): since when, by whom and why."""

    since: dt.datetime
    paused_by: str
    note: str


@dataclasses.dataclass(frozen=True)
class SettingChange:
    """One change of a fleet setting (`core_capacity`, `user_max_active`, `releases_paused`) and
    who made it, with the operator's note (pauses)."""

    change_id: int
    setting: str
    user_id: str | None
    old_value: int | None
    new_value: int | None
    actor: str
    create_time: dt.datetime
    note: str = ""


@dataclasses.dataclass(frozen=True)
class PauseInForce:
    """One pause of releases in force, whose: the fleet's (`user_id` '') or one user's."""

    user_id: str
    pause: ReleasePause


@dataclasses.dataclass(frozen=True)
class AuditEvent:
    """One thing someone did, as the audit timeline shows it (OperatorService.ListAuditEvents):
    `kind` is `capacity`, `user_limit`, `pause`, `resume`, `grant`, `cancel`, `retry`,
    `promote`, `release` or `check_with_core`. `event_key` orders events of one instant and is
    the keyset position with `occurred_at`."""

    occurred_at: dt.datetime
    event_key: str
    kind: str
    actor: str
    user_id: str
    job_id: uuid.UUID | None = None
    retry_of_job_id: uuid.UUID | None = None
    old_value: int = 0
    new_value: int = 0
    amount: int = 0
    note: str = ""
    outcome: str = ""


@dataclasses.dataclass(frozen=True)
class AuditQuery:
    """Which audit events: by actor and by user ('' for either: all), below a keyset position."""

    actor: str = ""
    user_id: str = ""
    before_time: dt.datetime | None = None
    before_key: str = ""


@dataclasses.dataclass(frozen=True)
class UserSettings:
    """One user's settings in force: her first-pass limit (her own, or the service's default)
    and the pauses holding her runs back."""

    user_id: str
    max_active: int
    max_active_is_default: bool
    own_pause: ReleasePause | None
    fleet_paused: bool


@dataclasses.dataclass(frozen=True)
class ClaimedSettlement(Claim):
    """An ended job whose run must be confirmed settled, claimed for one attempt (leased)."""

    kind: ClassVar[ClaimKind] = ClaimKind.RUN_SETTLEMENT
    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    attempt: int

    @property
    def key(self) -> uuid.UUID:
        return self.job_id


@dataclasses.dataclass(frozen=True)
class ClaimedReservation(Claim):
    """A reserved run whose admit is gone (an orphaned reservation), claimed for one CancelRun
    attempt (leased)."""

    kind: ClassVar[ClaimKind] = ClaimKind.RESERVATION_CANCEL
    run_id: uuid.UUID
    attempt: int

    @property
    def key(self) -> uuid.UUID:
        return self.run_id


@dataclasses.dataclass(frozen=True)
class ScheduledRetry:
    next_release_at: dt.datetime
    window_over: bool


@dataclasses.dataclass(frozen=True)
class ExpiredRelease:
    """A PENDING job past its release window."""

    job_id: uuid.UUID
    user_id: str
    attempts: int


@dataclasses.dataclass(frozen=True)
class ClaimedReconciliation(Claim):
    """A RUNNING job whose completion is overdue, claimed for one question to the core."""

    kind: ClassVar[ClaimKind] = ClaimKind.RECONCILIATION
    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    # Its user asked to cancel it and no answer ended it: the question is a CancelRun.
    cancel_requested: bool = False
    # Not counted: the claim pushes the job's next look ahead by the recheck interval instead of
    # backing off, and nothing the attempt writes needs its fence.
    attempt: int = 0

    @property
    def key(self) -> uuid.UUID:
        return self.job_id


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


@dataclasses.dataclass(frozen=True)
class JobEnding:
    """A job after a change that ended it (or found it ended): the job as it ended and its view
    (read in the ending transaction itself; None when not asked for), the credit given back, and
    the jobs promoted into the freed slot."""

    ref: JobRef
    view: JobView | None
    refunded: int = 0
    promoted: tuple[Promoted, ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class RunReportToApply:
    """The core's report of a run, to apply as `transition` for the call's `actor`. Each one is
    its own (compared by identity): a report the core repeats is applied again, not merged."""

    run_id: uuid.UUID
    transition: Transition
    actor: str


@dataclasses.dataclass(frozen=True)
class RunCompletion:
    """What a completion found under the lock of its run's user: the job that owns the run (None:
    no job yet; `reserved` when an admit has reserved the run and not committed), its view and,
    when the job was active, the ending it made."""

    job: JobRef | None
    reserved: bool = False
    view: JobView | None = None
    ending: JobEnding | None = None
    # The statement that applied it also granted the fleet's free capacity, under the capacity
    # lock, after every change it made (its promotions' waiting jobs included): no grant is owed.
    capacity_granted: bool = False


@dataclasses.dataclass(frozen=True)
class RunSettlement:
    """What settling an ended job's run did under the user's lock: whether the run was unsettled
    until now (False: already settled), and the jobs promoted into the freed slots."""

    settled: bool
    promoted: tuple[Promoted, ...]


@dataclasses.dataclass(frozen=True)
class JobSearch:
    """A job search across users; `upper_*` is the keyset position to continue below."""

    user_id: str
    statuses: tuple[JobStatus, ...]
    created_after: dt.datetime | None
    upper_time: dt.datetime | None
    upper_job_id: uuid.UUID | None
    has_error: bool
    inputs: JobInputsSearch = dataclasses.field(default_factory=lambda: JobInputsSearch())


@dataclasses.dataclass(frozen=True)
class JobInputsSearch:
    """A search in what jobs judge; an empty field matches every job. Values are trimmed, and
    `source_doi` lowercased, as the keys of migration 0029 are stored."""

    document_uri_prefix: str = ""
    title_words: str = ""
    source_doi: str = ""

    def __bool__(self) -> bool:
        return bool(self.document_uri_prefix or self.title_words or self.source_doi)


@dataclasses.dataclass(frozen=True)
class LiveJobFilter:
    """Which queued, pending or running jobs a bulk cancel matches (OperatorService.CancelJobs)."""

    statuses: tuple[JobStatus, ...]
    user_id: str
    created_after: dt.datetime | None
    created_before: dt.datetime | None
    has_error: bool
    inputs: JobInputsSearch = dataclasses.field(default_factory=lambda: JobInputsSearch())


@dataclasses.dataclass(frozen=True)
class Overview:
    """The operator's figures: the queue now and the endings of the last window."""

    queued: int
    pending: int
    running: int
    succeeded_in_window: int
    failed_in_window: int
    canceled_in_window: int
    users_waiting: int
    releases_retrying: int
    runs_reconciling: int
    oldest_queued_create_time: dt.datetime | None
    read_time: dt.datetime
    admits_per_minute: tuple[int, ...]
    window_minutes: int
    # The core's capacity, fleet-wide (None before the first read of it).
    capacity: CapacityState | None = None
    # The core's health, fleet-wide, from the replicas' fresh heartbeats (None before read).
    core_health: CoreHealth | None = None


class CoreState(enum.StrEnum):
    """The core's health as an operator reads it (`CoreHealth.state`)."""

    # No fresh report of any replica says anything about the core yet.
    UNKNOWN = "unknown"
    # The core answers every replica, and no call failed within the last minute.
    HEALTHY = "healthy"
    # The core answers, but some calls failed within the last minute, or some replicas do not reach it.
    DEGRADED = "degraded"
    # No replica's calls got an answer since its previous heartbeat, and the last got none.
    UNREACHABLE = "unreachable"
    # The core refuses new runs (the provider's budget used up): since its previous heartbeat, no
    # replica's CreateRun was taken, and some were refused.
    REFUSING = "refusing"


# Upper bounds, in milliseconds, of the latency buckets the core's answers are counted in (the
# last bucket, above the last bound, is open); fleet-wide percentiles add replicas' buckets.
CORE_LATENCY_BOUNDS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
# The recent window of the core's health: this many minutes, one bucket each.
CORE_WINDOW_MINUTES = 5
# A failure this recent still shows as DEGRADED after the core answers again.
CORE_DEGRADED_AFTER_FAILURE = dt.timedelta(seconds=60)
# The core's methods the queue calls, in the order the Overview lists them (the probe is a GetRun).
CORE_METHODS = ("CreateRun", "ReleaseRun", "CancelRun", "GetRun", "ListRuns")


@dataclasses.dataclass(frozen=True)
class CoreMethodCalls:
    """One core method's calls in one minute (or a window): answered, refused, outcome unknown."""

    method: str
    answered: int = 0
    refused: int = 0
    unknown: int = 0


@dataclasses.dataclass(frozen=True)
class CoreMethodFailure:
    """A core method's latest failure: no answer (the gRPC code) or a refusal (the reason)."""

    method: str
    at: dt.datetime
    reason: str


@dataclasses.dataclass(frozen=True)
class CoreMinute:
    """One minute of a replica's calls to the core (probes included): answered, refused (an
    answer too: the core works), outcome unknown, admits answered CORE_UNAVAILABLE, and the
    latency of answered and refused calls in `CORE_LATENCY_BOUNDS_MS` buckets (one more, open)."""

    minute: dt.datetime
    answered: int = 0
    refused: int = 0
    unknown: int = 0
    admits_unavailable: int = 0
    latency_counts: tuple[int, ...] = ()
    latency_max_ms: float = 0.0
    # The same calls by core method (only the methods called in the minute).
    methods: tuple[CoreMethodCalls, ...] = ()


@dataclasses.dataclass(frozen=True)
class CoreHealthReport:
    """A replica's view of the core, written in its heartbeat: the state it read at the beat,
    its last answer and last failure, and the recent minutes."""

    state: CoreState
    last_success_at: dt.datetime | None
    last_failure_at: dt.datetime | None
    last_failure_reason: str
    minutes: tuple[CoreMinute, ...]
    # Each method's latest failure (refusals of a request included), when it had one.
    method_failures: tuple[CoreMethodFailure, ...] = ()


@dataclasses.dataclass(frozen=True)
class CoreMethodHealth:
    """One core method's calls within the window, summed over the reports, and its latest
    failure within the window (None, "" without one)."""

    method: str
    answered: int
    refused: int
    unknown: int
    last_failure_at: dt.datetime | None
    last_failure_reason: str


@dataclasses.dataclass(frozen=True)
class CoreHealth:
    """The core's health fleet-wide (Overview.core_health), from the fresh heartbeats only."""

    state: CoreState
    replicas_reporting: int
    replicas_reaching: int
    last_success_at: dt.datetime | None
    last_failure_at: dt.datetime | None
    last_failure_reason: str
    answered: int
    refused: int
    unknown: int
    admits_unavailable: int
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    window_minutes: int = CORE_WINDOW_MINUTES
    # The methods called within the window, in `CORE_METHODS` order (an unknown name last).
    methods: tuple[CoreMethodHealth, ...] = ()


def _latency_quantile(counts: list[int], max_ms: float, quantile: float) -> float | None:
    """The upper bound of the bucket holding the quantile (the largest latency seen when lower,
    or in the open bucket)."""
    total = sum(counts)
    if total == 0:
        return None
    rank = quantile * total
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank and count:
            bound = CORE_LATENCY_BOUNDS_MS[index] if index < len(CORE_LATENCY_BOUNDS_MS) else max_ms
            return float(min(bound, max_ms))
    return max_ms


def combined_core_health(reports: list[CoreHealthReport], now: dt.datetime) -> CoreHealth:
    """The core's health from replicas' reports (the fleet's fresh ones, or one replica's):
    UNREACHABLE (or REFUSING) when no replica reaches it, DEGRADED when some do not or it failed
    recently, UNKNOWN without a report; the counts and latencies of the last
    `CORE_WINDOW_MINUTES` before `now`."""
    first_minute = now.replace(second=0, microsecond=0) - dt.timedelta(minutes=CORE_WINDOW_MINUTES - 1)
    minutes = [m for r in reports for m in r.minutes if m.minute >= first_minute]
    counts = [0] * (len(CORE_LATENCY_BOUNDS_MS) + 1)
    for minute in minutes:
        for index, count in enumerate(minute.latency_counts[: len(counts)]):
            counts[index] += count
    max_ms = max((m.latency_max_ms for m in minutes), default=0.0)
    states = [r.state for r in reports if r.state is not CoreState.UNKNOWN]
    reaching = sum(1 for state in states if state is not CoreState.UNREACHABLE)
    if not states:
        state = CoreState.UNKNOWN
    elif reaching == 0:
        state = CoreState.UNREACHABLE
    elif all(state in (CoreState.REFUSING, CoreState.UNREACHABLE) for state in states):
        state = CoreState.REFUSING
    elif any(state is not CoreState.HEALTHY for state in states):
        state = CoreState.DEGRADED
    else:
        state = CoreState.HEALTHY
    failures = [r for r in reports if r.last_failure_at is not None]
    latest_failure = max(failures, key=lambda r: r.last_failure_at or now, default=None)
    return CoreHealth(
        state=state,
        replicas_reporting=len(reports),
        replicas_reaching=reaching,
        last_success_at=max((r.last_success_at for r in reports if r.last_success_at is not None), default=None),
        last_failure_at=latest_failure.last_failure_at if latest_failure else None,
        last_failure_reason=latest_failure.last_failure_reason if latest_failure else "",
        answered=sum(m.answered for m in minutes),
        refused=sum(m.refused for m in minutes),
        unknown=sum(m.unknown for m in minutes),
        admits_unavailable=sum(m.admits_unavailable for m in minutes),
        latency_p50_ms=_latency_quantile(counts, max_ms, 0.5),
        latency_p99_ms=_latency_quantile(counts, max_ms, 0.99),
        methods=_methods_health(reports, minutes, first_minute),
    )


def _methods_health(reports: list[CoreHealthReport], minutes: list[CoreMinute], first_minute: dt.datetime) -> tuple[CoreMethodHealth, ...]:
    """Each method's calls within the window summed over the reports, with its latest failure
    of the window (so the Overview names the calls that fail, not only that some do)."""
    sums: dict[str, list[int]] = {}
    for minute in minutes:
        for calls in minute.methods:
            total = sums.setdefault(calls.method, [0, 0, 0])
            total[0] += calls.answered
            total[1] += calls.refused
            total[2] += calls.unknown
    latest: dict[str, CoreMethodFailure] = {}
    for report in reports:
        for failure in report.method_failures:
            if failure.at >= first_minute and (failure.method not in latest or failure.at > latest[failure.method].at):
                latest[failure.method] = failure
    order = {method: index for index, method in enumerate(CORE_METHODS)}
    return tuple(
        CoreMethodHealth(
            method=method,
            answered=answered,
            refused=refused,
            unknown=unknown,
            last_failure_at=latest[method].at if method in latest else None,
            last_failure_reason=latest[method].reason if method in latest else "",
        )
        for method, (answered, refused, unknown) in sorted(sums.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))
    )


@dataclasses.dataclass(frozen=True)
class UserWork:
    """One user's jobs in flight, for the operator's list of users with work."""

    user_id: str
    queued: int
    pending: int
    running: int
    oldest_queued_create_time: dt.datetime | None
    oldest_create_time: dt.datetime


@dataclasses.dataclass(frozen=True)
class QueueMinute:
    """The queue in one minute: depth at its end, admits and endings during it."""

    minute: dt.datetime
    queued: int
    active: int
    admitted: int
    ended: int


@dataclasses.dataclass(frozen=True)
class ReplicaReport:
    """What a replica reports about itself in its heartbeat row (OperatorService.ListReplicas)."""

    replica_id: str
    host: str
    start_time: dt.datetime
    draining: bool
    calls_in_flight: int
    watch_streams: int
    overview_streams: int
    # The core's calls since the replica started: answered, refused, outcome unknown.
    core_answered: int
    core_refused: int
    core_unknown: int
    core_last_unknown_at: dt.datetime | None
    # The core's recent health as this replica reads it (None from a replica of an older version).
    core_health: CoreHealthReport | None = None
    # When the row was last written (set by the database; None in a report not yet written).
    heartbeat_time: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class GrantOutcome:
    """A credit grant: the balance after it, and whether this call granted (False: the key had
    granted before)."""

    balance: int
    granted_now: bool
    earlier_amount: int | None = None


class LedgerKind(enum.StrEnum):
    """How a ledger entry moves credits; the values are the database's (`credit_ledger.kind`)."""

    GRANT = "grant"
    CHARGE = "charge"
    REFUND = "refund"


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One credit movement as the audit trail shows it: who (`actor`) moved what, when and why."""

    entry_id: int
    create_time: dt.datetime
    user_id: str
    kind: LedgerKind
    # Signed: a charge is negative, a grant or refund positive.
    amount: int
    job_id: uuid.UUID | None
    # Grants only: the grant's idempotency key.
    idempotency_key: str | None
    actor: str
    reason: str
    # Grants only: why, in the operator's words (migration 0017); empty when none was given.
    note: str = ""


@dataclasses.dataclass(frozen=True)
class LedgerQuery:
    """Which ledger entries an operator reads: by user, job and/or actor (empty: every one), below
    the keyset position `before_entry_id` (None: from the newest)."""

    user_id: str
    job_id: uuid.UUID | None
    before_entry_id: int | None
    actor: str = ""


@dataclasses.dataclass(frozen=True)
class ReplicationStance:
    """What a commit of this replica waits for, as the database reports it.

    `mode` is one of: `synchronous` (a synchronous standby is connected and commits wait for it:
    an acknowledged commit survives the primary's loss), `synchronous_without_standby` (standbys
    are named but none is connected as synchronous: every commit waits, writes stall, health
    reads NOT_SERVING), `asynchronous` (standbys stream but commits do not wait: a failover can
    lose what was acknowledged in its last moments), `single_node` (no standby: a commit lasts as
    long as this node's disk), `standby` (the node is read-only: a failover is under way or the
    DSN reaches the wrong node), `unknown` (this role may not read the standbys' sync state).
    """

    mode: str
    synchronous_commit: str
    synchronous_standby_names: str
    standbys: int
    synchronous_standbys: int

    @property
    def synchronous(self) -> bool:
        return self.mode == "synchronous"

    def describe(self) -> str:
        return (
            f"replication {self.mode} (synchronous_commit={self.synchronous_commit}, "
            f"synchronous_standby_names={self.synchronous_standby_names!r}, standbys streaming={self.standbys}, "
            f"synchronous={self.synchronous_standbys})"
        )
