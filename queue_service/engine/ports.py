"""What the engine's rooms ask of the loops, the failover checks, the lifecycle core and one
another, as protocols: each room is built with what answers them and imports only these.

The lifecycle core, the admission and the releases start releases and ask for grants, which the
dispatcher does; the core, the releases and the recovery ask the core's second copy (design I14)
about runs a failover may have lost, which `CoreReconciler` answers. Each room gets these ports
through its constructor and knows only the protocol: the grant's whole path, from a completion
that frees a turn to the next user's release, is read inside `engine/`.

The rooms ask the lifecycle core (`QueueEngine`) to end, promote, cancel and settle through
`Lifecycle`, and the completions what follows an ending they committed through `Endings`; the admission hands a reserved run it abandoned to the recovery (`ReservedRuns`),
and the recovery hands a release past its window to the releases (`ExpiredReleases`). So the
rooms stand side by side above `engine.py`, and none holds another whole.

The dispatcher needs the releases, and the releases (through the core) start releases: that
circle is closed by `ReleaseHandoff`, built before both. The rooms hand it claims and grant
requests; the dispatcher, when it is built, takes them from it (`ReleaseHandoff.deliver_to`).
"""

from __future__ import annotations

import collections
import contextlib
import uuid
from typing import Protocol

from opentelemetry.trace import Span

from queue_service.model import Cause, ClaimedRelease, ClaimedReservation, JobEnding, Promoted, PromotionLimits, RunReport, Transition


class ReleaseStarter(Protocol):
    """Starts releases this replica claimed, and asks for grants of the fleet's capacity."""

    def start_claimed(self, claim: ClaimedRelease) -> None:
        """A release claimed in the statement that made its job PENDING: start it now."""

    def request_grant(self) -> None:
        """Capacity may have freed, or a job began to wait for it: grant now."""


class ReleaseHandoff:
    """The `ReleaseStarter` the rooms are built with: it passes each claim and grant request to
    the dispatcher at once, in the caller's turn of the event loop (no queue and taker task: a
    promoted job's release starts one turn sooner). What comes before the dispatcher is built
    (nothing does in the service: the rooms start releases only once it serves) waits here."""

    def __init__(self) -> None:
        self._starter: ReleaseStarter | None = None
        self._early_claims: collections.deque[ClaimedRelease] = collections.deque()
        self._early_grant = False

    def deliver_to(self, starter: ReleaseStarter) -> None:
        """The dispatcher's constructor: from now on it starts what is handed over."""
        self._starter = starter
        while self._early_claims:
            starter.start_claimed(self._early_claims.popleft())
        if self._early_grant:
            self._early_grant = False
            starter.request_grant()

    def start_claimed(self, claim: ClaimedRelease) -> None:
        if self._starter is None:
            self._early_claims.append(claim)
        else:
            self._starter.start_claimed(claim)

    def request_grant(self) -> None:
        if self._starter is None:
            self._early_grant = True
        else:
            self._starter.request_grant()


class FailoverGuard(Protocol):
    """What the rooms ask of the core's second copy (`CoreReconciler`) about runs a database
    failover may have lost."""

    async def release_gate(self, claim: ClaimedRelease) -> str | None:
        """Why this first-pass release must wait while the core judges another of the user's runs
        the queue does not count (I9 at the core); None: release."""

    async def adopt_for_completion(self, run_id: uuid.UUID) -> bool:
        """A completion of a run no job owns: adopts it from the core's record first (True: a job
        owns it now; False: it never will)."""

    async def adopt_if_lost(self, run_id: uuid.UUID) -> bool:
        """A reserved run about to be canceled: adopts it instead when its job was lost in a
        failover (True: a job owns it, do not cancel)."""


class NoFailoverGuard:
    """A `FailoverGuard` that knows of no lost run (tools and tests that build the engine alone):
    every release goes ahead, no completion's run is adopted, every reserved run is canceled."""

    async def release_gate(self, claim: ClaimedRelease) -> str | None:
        return None

    async def adopt_for_completion(self, run_id: uuid.UUID) -> bool:
        return False

    async def adopt_if_lost(self, run_id: uuid.UUID) -> bool:
        return False


class Lifecycle(Protocol):
    """What the rooms ask of the lifecycle core (`engine.QueueEngine`)."""

    @property
    def cancel_recheck_seconds(self) -> float:
        """How long a RUNNING job's unanswered cancel waits before it is asked again."""

    async def end_job(self, job_id: uuid.UUID, user_id: str, transition: Transition) -> JobEnding | None:
        """Applies the fenced transition (its refund, the promotions it frees); None: fenced."""

    async def promote(self, user_id: str, *, cause: Cause) -> tuple[Promoted, ...]:
        """Fills every free slot of the user from the queue, oldest first."""

    async def cancel(self, job_id: uuid.UUID, user_id: str) -> None:
        """The user's cancel of a job (the core's answer decides how an active job ends)."""

    async def settle_run(self, job_id: uuid.UUID, user_id: str, *, cause: Cause) -> None:
        """The core confirmed the ended job's run settled: free its slot and promote."""

    async def cancel_until_confirmed(self, run_id: uuid.UUID, *, kind: str) -> RunReport | None:
        """One CancelRun attempt: the report when the core confirms the run settled, else None."""

    def promotion_gap_ended(self, job_id: uuid.UUID) -> None:
        """The promoted job's release was confirmed (the promotion-gap histogram)."""

    def backoff_seconds(self, attempt: int) -> float:
        """How long a claim's next durable attempt waits."""


class Endings(Protocol):
    """What the completions ask of the lifecycle core (`engine.QueueEngine`): the limits their
    batched ending promotes under, its span, and what follows a committed ending."""

    @property
    def promotion_limits(self) -> PromotionLimits:
        """The limits a promotion fills a freed slot under (the user's, the fleet's defaults)."""

    def ending_span(self, transition: Transition) -> contextlib.AbstractContextManager[Span]:
        """The span of one ending, with its transition's attributes."""

    def after_ending(self, outcome: JobEnding, transition: Transition, *, capacity_granted: bool = False) -> JobEnding:
        """Records a committed ending and starts what follows it (settlement, releases, a grant)."""

    async def settle_run(self, job_id: uuid.UUID, user_id: str, *, cause: Cause) -> None:
        """The core confirmed the ended job's run settled: free its slot and promote."""


class ReservedRuns(Protocol):
    """What the admission asks of the recovery (`engine.recovery.Recovery`): a run it reserved
    and abandoned is canceled until the core confirms (or adopted, when a failover lost its job)."""

    async def cancel_reserved_run(self, claim: ClaimedReservation) -> bool:
        """One attempt; True once the run is settled (or adopted), else it is scheduled again."""


class ExpiredReleases(Protocol):
    """What the recovery asks of the releases (`engine.releases.Releases`): a release whose
    window passed is given up."""

    async def give_up_release(self, job_id: uuid.UUID, user_id: str, reason: str, *, attempts: int) -> bool:
        """Fails and refunds the job; True when this call ended it."""
