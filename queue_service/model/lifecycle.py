"""What the locked sections that move jobs on take and answer: the promotion's limits and the
jobs it promoted, an ending, the core's report of a run to apply and what applying it found, a
run settled.
"""

from __future__ import annotations

import dataclasses
import uuid

from queue_service.model.claims import ClaimedRelease
from queue_service.model.jobs import JobRef, JobView
from queue_service.model.transitions import Transition


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
