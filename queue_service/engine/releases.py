"""Releases: starting a PENDING job's run at the core, and what the core's answer means.

One claimed release (the dispatcher's, a hand-over from an admit or a promotion, or `release_now`
for tooling) is one ReleaseRun attempt: accepted (the job is marked RUNNING, marks coalesced by
`ReleaseMarker`), a run that had ended already (the job ends as the core says), no answer (retried
with backoff until the release window closes, then given up and refunded), or the core at its
capacity (the job waits for a grant, `grant_capacity`). A job the user asked to cancel is not
released: its run is canceled instead. Ending a job is the lifecycle core's (`Lifecycle.end_job`: `QueueEngine`).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

from queue_service import errors, telemetry
from queue_service.config import Config, settings_of
from queue_service.engine.coalescer import Coalescer, Spawn, counting_batch
from queue_service.engine.parts import SharedParts
from queue_service.engine.ports import FailoverGuard, Lifecycle
from queue_service.model import (
    CapacityGrant,
    ClaimedRelease,
    JobStatus,
    ReleaseResult,
    RunFate,
    RunReport,
    Transition,
)
from queue_service.store import Store

log = logging.getLogger(__name__)

# As many as the dispatcher releases at once.
_MAX_MARKS_PER_STATEMENT = 64


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReleasesSettings:
    """The settings the releases read (QUEUE_* of the same names)."""

    release_lease_seconds: float
    release_window_seconds: float
    reconcile_after_seconds: float

    @classmethod
    def from_config(cls, config: Config) -> ReleasesSettings:
        return settings_of(cls, config)


class Releases:
    def __init__(self, engine: Lifecycle, parts: SharedParts, settings: ReleasesSettings, *, guard: FailoverGuard) -> None:
        self._engine = engine
        self._store = parts.store
        self._core = parts.core
        self._settings = settings
        self._capacity = parts.capacity
        # I9 at the core: a first-pass release waits while the core judges a run the queue does
        # not count (`FailoverGuard.release_gate`).
        self._guard = guard
        # Releases the core accepted while the previous ones were being marked RUNNING are marked
        # together (see `ReleaseMarker`): a burst of completions costs one statement and one
        # commit for its releases.
        self._release_marks = ReleaseMarker(
            parts.store, reconcile_after_seconds=settings.reconcile_after_seconds, spawn=parts.tasks.in_background
        )

    async def claim_due_releases(self, *, batch_size: int) -> list[ClaimedRelease]:
        """Claims the releases that are due (retries, leases run out, jobs nobody claimed), for
        this replica, each leased for QUEUE_RELEASE_LEASE_SECONDS."""
        async with self._store.statements() as db:
            return await db.claim_due_releases(lease_seconds=self._settings.release_lease_seconds, batch_size=batch_size)

    async def next_release_due_in(self) -> float | None:
        """Seconds until the earliest retry or lease is due; None when nothing is."""
        async with self._store.statements() as db:
            return await db.next_release_due_in()

    async def release_now(self, job_id: uuid.UUID) -> None:
        """Releases a PENDING job at once (tooling): claims it like the dispatcher does. A job
        another replica is releasing right now, or one waiting for the core's capacity (only a
        grant releases it, in its turn), is left as it is."""
        async with self._store.statements() as db:
            claim = await db.claim_release_of_job(job_id=job_id, lease_seconds=self._settings.release_lease_seconds)
            job = None if claim else await db.job_by_id(job_id=job_id)
        if claim is not None:
            await self.release(claim)
        elif job is None:
            raise errors.JobNotFound(f"job {job_id} does not exist", metadata={"jobId": str(job_id)})
        elif job.status is not JobStatus.PENDING:
            raise errors.JobNotPending(
                f"job {job_id} is {job.status}; only a PENDING job can be released",
                metadata={"jobId": str(job_id), "status": job.status.upper()},
            )

    async def release(self, claim: ClaimedRelease) -> ReleaseResult:
        """Attempts one claimed release and records the result; returns what happened."""
        with telemetry.tracer.start_as_current_span("release") as span:
            span.set_attribute("queue.job_id", str(claim.job_id))
            span.set_attribute("queue.release.attempt", claim.attempt)
            span.set_attribute("queue.cancel_requested", claim.cancel_requested)
            span.set_attribute("queue.release.probe", claim.probe)
            if claim.cancel_requested:
                result = await self._cancel_instead_of_releasing(claim)
            elif claim.waited_for_a_slot and await self._held_by_pause(claim):
                result = ReleaseResult.PAUSED
            else:
                try:
                    # I9 at the core is about first-pass runs: a delta's release is not held for it.
                    held_back = None if claim.delta else await self._guard.release_gate(claim)
                    if held_back is not None:
                        result = await self._retry_release_later(claim, held_back, sent=False)
                        telemetry.metrics.release_attempts.add(1, {"result": str(result)})
                        span.set_attribute("queue.release.result", str(result))
                        return result
                    report: RunReport | None = await self._core.release_run(claim.run_id)
                    error = ""
                except errors.CoreUnavailable as exc:
                    report, error = None, exc.message
                except errors.CoreAtCapacity as exc:
                    result = await self._record_core_refusal(claim, exc.message)
                    telemetry.metrics.release_attempts.add(1, {"result": str(result)})
                    span.set_attribute("queue.release.result", str(result))
                    return result
                result = await self._record_release(claim, report, error)
            telemetry.metrics.release_attempts.add(1, {"result": str(result)})
            span.set_attribute("queue.release.result", str(result))
            return result

    async def _held_by_pause(self, claim: ClaimedRelease) -> bool:
        """A claim that waited for a place among the releases in flight (up to a core deadline
        per release ahead of it) is checked against the pauses before it is sent: a pause that
        committed meanwhile holds it. A pause holds releases, never the count: a claim that
        opened the job's turn (nothing sent since it last waited) puts the job back to waiting;
        a later one (an earlier attempt may have been applied) keeps the job's capacity and only
        its retry waits for the resume. One claimed and started at once is sent (a pause
        committing in that moment lets it through, like a run already at the core)."""
        async with self._store.statements() as db:
            held = await db.hold_release_if_paused(job_id=claim.job_id, attempt=claim.attempt)
        if held is not None:
            log.info(
                "releases paused; the job waits" if held else "releases paused; the retry waits, the job keeps its capacity",
                extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "attempt": claim.attempt},
            )
        return held is not None

    async def _record_release(self, claim: ClaimedRelease, report: RunReport | None, error: str) -> ReleaseResult:
        if report is not None and report.fate is RunFate.JUDGING:
            if claim.probe:
                # The core took a release above the limit it had shown us: it has room again.
                async with self._store.statements() as db:
                    await db.capacity_probe_taken()
            # Marked RUNNING by `ReleaseMarker.run_batch`, with others accepted meanwhile.
            marked = await self._release_marks.submit(claim)
            self._engine.promotion_gap_ended(claim.job_id)
            if marked:
                log.info(
                    "job released",
                    extra={
                        "job_id": claim.job_id,
                        "user_id": claim.user_id,
                        "run_id": claim.run_id,
                        "status": JobStatus.RUNNING,
                        "attempt": claim.attempt,
                    },
                )
            return ReleaseResult.RELEASED
        if report is not None and report.fate.settled:
            # The run had ended already (canceled, finished after an earlier release whose answer
            # was lost) or the core does not know it: the core's answer decides how the job ends.
            await self._engine.end_job(claim.job_id, claim.user_id, Transition.release_answered(report, attempt=claim.attempt))
            refused = report.fate in (RunFate.CANCELED, RunFate.UNKNOWN_TO_CORE)
            return ReleaseResult.REFUSED if refused else ReleaseResult.FINISHED
        # No answer (the release may have been applied) or a run still held: retry later.
        return await self._retry_release_later(claim, error or "core ReleaseRun: the run is still held")

    async def _cancel_instead_of_releasing(self, claim: ClaimedRelease) -> ReleaseResult:
        """The user asked to cancel this PENDING job and the core's answer never came (the cancel
        may not have reached it): the job is not released, its run is canceled, retried like a
        release until the core answers or the window closes (then given up, refunded)."""
        try:
            report: RunReport | None = await self._core.cancel_run(claim.run_id)
            error = ""
        except errors.CoreUnavailable as exc:
            report, error = None, exc.message
        if report is not None and report.fate.settled:
            ended = await self._engine.end_job(
                claim.job_id, claim.user_id, Transition.canceled_instead_of_released(report, attempt=claim.attempt)
            )
            if ended is not None:
                log.info(
                    "canceled instead of released",
                    extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "status": ended.ref.status},
                )
            return ReleaseResult.CANCELED
        fate = "no answer" if report is None else f"the run is {report.fate.value}"
        return await self._retry_release_later(claim, error or f"core CancelRun: {fate}")

    async def _retry_release_later(self, claim: ClaimedRelease, error: str, *, sent: bool = True) -> ReleaseResult:
        """`sent` False: this attempt never reached for the core (held back before ReleaseRun)."""
        backoff = self._engine.backoff_seconds(claim.attempt)
        async with self._store.statements() as db:
            retry = await db.schedule_retry(claim, backoff_seconds=backoff, last_error=error, sent=sent)
        if retry is not None and retry.window_over:
            window = self._settings.release_window_seconds
            await self.give_up_release(
                claim.job_id,
                claim.user_id,
                f"release gave up after {claim.attempt} attempts over {window:g}s: {error}",
                attempts=claim.attempt,
            )
            return ReleaseResult.GAVE_UP
        log.warning(
            "release failed; retrying",
            extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "attempt": claim.attempt, "reason": error},
        )
        return ReleaseResult.RETRY

    async def _record_core_refusal(self, claim: ClaimedRelease, message: str) -> ReleaseResult:
        """The core is at its concurrency ceiling ("not now", nothing applied): the job goes back in
        line for capacity with its slot and its place; the fleet backs off as a whole (one probe per
        interval), never a retry of this job's own."""
        telemetry.metrics.core_refusals.add(1, {"probe": str(claim.probe).lower()})
        async with self._store.statements() as db:
            learned = await db.capacity_refused(
                job_id=claim.job_id, attempt=claim.attempt, probe_interval_seconds=self._capacity.probe_interval_seconds
            )
        if learned is not False:
            self._capacity.learned(True)
        log.info(
            "the core is at its capacity; the job waits for capacity",
            extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "attempt": claim.attempt, "reason": message},
        )
        return ReleaseResult.WAITING

    async def grant_capacity(self, *, max_grants: int) -> CapacityGrant:
        """Asks the fleet for the free capacity at the core: the releases granted to this replica
        (in the fair order), to start now."""
        with telemetry.tracer.start_as_current_span("capacity.grant") as span:
            grant = await self._store.grant_capacity(
                lease_seconds=self._settings.release_lease_seconds,
                release_window_seconds=self._settings.release_window_seconds,
                probe_interval_seconds=self._capacity.probe_interval_seconds,
                max_grants=max_grants,
            )
            span.set_attribute("queue.capacity.granted", len(grant.claims))
            span.set_attribute("queue.capacity.limited", grant.limited)
        self._capacity.granted(grant)
        return grant

    async def give_up_release(self, job_id: uuid.UUID, user_id: str, reason: str, *, attempts: int) -> bool:
        """Fails and refunds a pending job whose release did not succeed in its window (fenced by
        its attempt counter); see `Transition.given_up`."""
        ended = await self._engine.end_job(job_id, user_id, Transition.given_up(reason, attempts=attempts))
        if ended is not None:
            telemetry.metrics.release_give_ups.add(1)
        return ended is not None


class ReleaseMarker(Coalescer[ClaimedRelease, bool]):
    """Marks the releases the core accepted RUNNING: those accepted while a mark is being written
    go together in the next one (`run_batch`: `Statements.mark_released`)."""

    def __init__(self, store: Store, *, reconcile_after_seconds: float, spawn: Spawn) -> None:
        super().__init__(max_batch=_MAX_MARKS_PER_STATEMENT, spawn=spawn, name="mark-released")
        self._store = store
        self._reconcile_after_seconds = reconcile_after_seconds

    async def run_batch(self, claims: list[ClaimedRelease]) -> dict[ClaimedRelease, bool]:
        with counting_batch("mark_released", len(claims)):
            async with self._store.statements() as db:
                marked = await db.mark_released(claims, reconcile_after_seconds=self._reconcile_after_seconds)
        return {claim: claim.job_id in marked for claim in claims}
