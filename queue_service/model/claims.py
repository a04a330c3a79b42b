"""The durable retries (`ClaimKind`): work a replica claims for one attempt (`Claim`) and tries
until it is done, one claim type per kind, and what scheduling a release again answers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from typing import ClassVar


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
