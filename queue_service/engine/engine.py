"""The lifecycle core of the queue engine: ending a job (complete, cancel, give up), promotion,
the settlement of an ended job's run, and the fleet's settings. The other paths are rooms of
their own around it: `admission` (admit), `releases` (release a PENDING job), `recovery` (what
the sweeper asks); each calls into this core to end a job or promote.

Every change that can free or take a user's slot is one statement under the user's queue lock
(`store.locks.locked_section`); every state change is a named, fenced `Transition` (the store applies it only from the statuses it names), so duplicates from
retries, racing replicas or old code versions are harmless no-ops. No call to the core is ever
made while the user lock is held.

Every call to the core has three outcomes: answered, refused, or unknown (maybe applied). A run
whose outcome is unknown is never assumed stopped: the job that owned it keeps its slot until the
core confirms the run settled (docs/design.md, "Settled runs"); a run reserved for an admit that
failed is canceled until the core confirms it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from opentelemetry.trace import Span

from queue_service import audit, errors, telemetry
from queue_service.config import Config, settings_of
from queue_service.engine.backoff import full_jitter_backoff
from queue_service.engine.parts import SharedParts
from queue_service.engine.tasks import each_at_most
from queue_service.model import (
    Cause,
    JobEnding,
    JobRef,
    JobStatus,
    Promoted,
    PromotionLimits,
    RunReport,
    SettingChange,
    Transition,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_GAP_TRACKING_LIMIT = 10_000
# Bulk cancels run this many single cancels at once (each may call the core).
_CANCEL_CONCURRENCY = 8


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueEngineSettings:
    """The settings the lifecycle core reads (QUEUE_* of the same names)."""

    max_active_per_user: int
    release_window_seconds: float
    release_lease_seconds: float
    release_backoff_max_seconds: float

    @classmethod
    def from_config(cls, config: Config) -> QueueEngineSettings:
        return settings_of(cls, config)


class QueueEngine:
    def __init__(self, parts: SharedParts, settings: QueueEngineSettings) -> None:
        self._store = parts.store
        self._core = parts.core
        self._settings = settings
        # What this replica knows of the fleet's capacity at the core, and how to ask for a grant.
        self._capacity = parts.capacity
        # Starts the first release of each job this replica made PENDING (claimed in the same
        # statement): the dispatcher starts it at once, with no claim of its own.
        self._starter = parts.starter
        self.promotion_limits = PromotionLimits(
            settings.max_active_per_user, settings.release_window_seconds, settings.release_lease_seconds
        )
        # When the slot a promoted job took was freed (monotonic), for the promotion-gap
        # histogram; bounded, since another replica may release the job and never tell us.
        self._slot_freed_at: collections.OrderedDict[uuid.UUID, float] = collections.OrderedDict()
        # Clean-ups and changes that outlive their caller, shared with the rooms around this core.
        self._tasks = parts.tasks
        # Locked changes whose outcome is unknown: the releases they may have claimed are handed
        # over at once, not after the lease (`owed_releases`).
        self._owed_releases = parts.owed_releases
        # A resume makes the retries its pause held due: this replica's dispatcher claims them now.
        self._wake_dispatcher = parts.wake_dispatcher

    @property
    def cancel_recheck_seconds(self) -> float:
        """How long a RUNNING job's unanswered cancel waits before the sweeper asks the core
        again: as long as a claimed release may take, so a CancelJob still waiting for its answer
        is not asked for twice."""
        return self._settings.release_lease_seconds

    async def _following_up_if_lost(self, change: Coroutine[Any, Any, T], *, user_id: str) -> T:
        """Runs a locked change of the user's queue; if its outcome is unknown, the releases it
        may have claimed are handed over in the background (`owed_releases`)."""
        try:
            return await change
        except errors.OutcomeUnknown:
            self._owed_releases.follow_up(user_id=user_id)
            raise

    # -- promotion ---------------------------------------------------------------------------

    async def promote(self, user_id: str, *, cause: Cause) -> tuple[Promoted, ...]:
        """Fills every free slot of the user from the queue, oldest first."""
        return await self._tasks.outliving_the_caller(
            self._following_up_if_lost(self._promote(user_id, cause), user_id=user_id), name=f"promote-{user_id}"
        )

    async def _promote(self, user_id: str, cause: Cause) -> tuple[Promoted, ...]:
        promoted = await self._store.promote(user_id, self.promotion_limits)
        self._after_promotion(user_id, promoted, cause)
        return promoted

    def _after_promotion(self, user_id: str, promoted: tuple[Promoted, ...], cause: Cause, *, capacity_granted: bool = False) -> None:
        """Records the promotions a committed transaction made and wakes the dispatcher (a job
        that waits for capacity asks for a grant, unless the transaction granted after it)."""
        with telemetry.tracer.start_as_current_span("promote") as span:
            span.set_attribute("queue.cause", str(cause))
            span.set_attribute("queue.promoted", len(promoted))
        if promoted:
            telemetry.metrics.promotions.add(len(promoted), {"cause": str(cause)})
        for job in promoted:
            log.info(
                "job promoted",
                extra={"job_id": job.job_id, "user_id": user_id, "run_id": job.run_id, "status": JobStatus.PENDING, "cause": cause},
            )
        waiting = False
        for job in promoted:
            if job.waiting:
                waiting = True
            else:
                self._starter.start_claimed(job.first_release)
        if waiting and not capacity_granted:
            self._capacity.note_waiting()

    def _note_slot_freed(self, promoted: tuple[Promoted, ...]) -> None:
        now = time.monotonic()
        for job in promoted:
            self._slot_freed_at[job.job_id] = now
        while len(self._slot_freed_at) > _GAP_TRACKING_LIMIT:
            self._slot_freed_at.popitem(last=False)

    def promotion_gap_ended(self, job_id: uuid.UUID) -> None:
        """The promoted job's release was confirmed: records how long its slot stood empty (when
        this replica freed it)."""
        freed_at = self._slot_freed_at.pop(job_id, None)
        if freed_at is not None:
            telemetry.metrics.promotion_gap.record(time.monotonic() - freed_at)

    # -- ending a job ------------------------------------------------------------------------

    async def end_job(self, job_id: uuid.UUID, user_id: str, transition: Transition) -> JobEnding | None:
        """Applies the transition, refunds when it says so, and (when the run is settled) promotes
        the user's next job, in one statement that also returns the job's view; None when the job
        was not in a status the transition starts from (fenced). An unsettled run keeps the slot:
        `settle_run` frees it."""
        return await self._tasks.outliving_the_caller(
            self._following_up_if_lost(self._end_job(job_id, user_id, transition), user_id=user_id), name=f"end-job-{job_id}"
        )

    async def _end_job(self, job_id: uuid.UUID, user_id: str, transition: Transition) -> JobEnding | None:
        with self.ending_span(transition) as span:
            span.set_attribute("queue.job_id", str(job_id))
            # One statement under the user lock: the ending, its refund, the promotions and the view.
            outcome = await self._store.end_job(job_id, user_id, transition, self.promotion_limits)
            if outcome is None:
                return None
            span.set_attribute("queue.refunded", outcome.refunded)
        return self.after_ending(outcome, transition)

    @contextlib.contextmanager
    def ending_span(self, transition: Transition) -> Iterator[Span]:
        with telemetry.tracer.start_as_current_span("complete") as span:
            span.set_attribute("queue.status", str(transition.to))
            span.set_attribute("queue.cause", str(transition.cause))
            span.set_attribute("queue.run_unsettled", transition.run_unsettled)
            yield span

    def after_ending(self, outcome: JobEnding, transition: Transition, *, capacity_granted: bool = False) -> JobEnding:
        """Records a committed ending and starts what follows it: the run's settlement when it is
        unsettled, else the releases of the jobs promoted into the freed slot, and a grant of the
        capacity it freed (unless its own statement granted: `capacity_granted`)."""
        cause = transition.cause
        ended, refunded, promoted = outcome.ref, outcome.refunded, outcome.promoted
        self._note_slot_freed(promoted)
        telemetry.metrics.completions.add(1, {"status": str(transition.to)})
        if refunded:
            telemetry.metrics.refunds.add(refunded, {"cause": str(transition.refund_cause)})
        log.info(
            "job ended",
            extra={"job_id": ended.job_id, "user_id": ended.user_id, "run_id": ended.run_id, "status": transition.to, "cause": cause},
        )
        if transition.run_unsettled:
            # The slot stays taken, so nothing was promoted: the settlement promotes later.
            self._tasks.in_background(self._settle_now(ended), name=f"settle-run-{ended.run_id}")
        else:
            self._after_promotion(ended.user_id, promoted, cause, capacity_granted=capacity_granted)
            # The run is settled: its capacity at the core is free for the next in line.
            if not capacity_granted:
                self._capacity.freed()
        return outcome

    async def cancel(self, job_id: uuid.UUID, user_id: str) -> None:
        """Cancels a job; the core's answer decides how an active job ends (see docs/design.md).

        A QUEUED job, or a PENDING one waiting for the fleet's capacity (never released), ends at
        once (its held run is canceled afterwards, durably). For any other PENDING or RUNNING job
        the user's intent is recorded first, then the core is asked: CANCELED (or an
        unknown run) ends the job CANCELED and refunded; a run that had already finished ends the
        job as it finished and the caller hears JOB_ALREADY_FINISHED; no answer changes nothing
        and the caller may retry. Whatever ends the job after the intent was recorded (this
        answer, the core's CompleteRun, reconciliation, a retry of this call) refunds it unless
        its run succeeded: a job the user canceled is never charged."""
        for _ in range(3):
            async with self._store.statements() as db:
                job = await db.job_by_id(job_id=job_id)
            if job is None or job.user_id != user_id:
                raise errors.JobNotFound(f"job {job_id} does not exist for this user", metadata={"jobId": str(job_id)})
            if job.status is JobStatus.CANCELED:
                return
            if job.status.is_finished:
                if job.status is JobStatus.FAILED and job.cancel_requested:
                    # Ended FAILED after the user asked to cancel (by a replica that did not
                    # apply the intent, say): the intent still decides the credit.
                    await self._refund_if_failed(job_id, user_id)
                raise _already_finished(job_id, job.status)
            # Who asked: the recorded intent's asker (the sweeper ends a waiting job for them), or
            # this call's caller.
            by = job.canceled_by or audit.actor_for(Cause.CANCEL)
            if job.status is JobStatus.QUEUED:
                if await self.end_job(job_id, user_id, Transition.canceled_while_queued(by=by)):
                    return
                continue  # promoted meanwhile: cancel it as an active job
            if job.waiting_for_capacity:
                # Never released while it waits: nothing at the core to ask, and no turn to wait for.
                if await self.end_job(
                    job_id, user_id, Transition.canceled_while_waiting_for_capacity(attempts=job.release_attempts, by=by)
                ):
                    return
                continue  # granted meanwhile: cancel it as an active job
            if not await self._record_cancel_request(job):
                continue  # ended meanwhile: the next pass reports how
            report = await self._core.cancel_run(job.run_id)
            if not report.fate.settled:
                raise errors.CoreUnavailable(
                    f"the core did not cancel run {job.run_id} (it is {report.fate.value}); retry",
                    metadata={"coreCode": "OK", "runState": report.fate.value.upper()},
                )
            await self.end_job(job_id, user_id, Transition.canceled(report, by=by))
            # Ended by us or meanwhile (a completion, or a release that met the canceled run):
            # the next pass reports what it is now, and applies the intent to a FAILED job.
        raise errors.Conflict(f"job {job_id} kept changing during the cancel; retry", metadata={"jobId": str(job_id)})

    async def cancel_each(self, jobs: Sequence[tuple[uuid.UUID, str]]) -> list[tuple[uuid.UUID, errors.QueueError]]:
        """Cancels each (job, user) as `cancel` does, a few at once (each may call the core); the
        jobs that were not canceled, with why. JOB_ALREADY_FINISHED is one: its run finished before
        the cancel reached it (a SUCCEEDED job keeps its charge), so it is not counted as canceled."""
        outcomes = await each_at_most(_CANCEL_CONCURRENCY, jobs, lambda job: self.cancel(*job))
        return [(job_id, outcome) for (job_id, _), outcome in zip(jobs, outcomes, strict=True) if isinstance(outcome, errors.QueueError)]

    async def _record_cancel_request(self, job: JobRef) -> bool:
        """Records the user's intent to cancel an active job before the core hears of it, so that
        the answer, if lost, cannot decide the credit alone; False when the job is no longer
        active."""
        with telemetry.tracer.start_as_current_span("cancel.record_intent") as span:
            span.set_attribute("queue.job_id", str(job.job_id))
            async with self._store.statements() as db:
                recorded = await db.record_cancel_request(job_id=job.job_id, cancel_recheck_seconds=self.cancel_recheck_seconds)
            span.set_attribute("queue.cancel.recorded", recorded)
        if recorded and not job.cancel_requested:
            log.info("cancel requested", extra={"job_id": job.job_id, "user_id": job.user_id, "run_id": job.run_id, "status": job.status})
        return recorded

    async def _refund_if_failed(self, job_id: uuid.UUID, user_id: str) -> None:
        refunded = await self._store.refund_failed_job(job_id, user_id, reason=Cause.CANCEL)
        if refunded:
            telemetry.metrics.refunds.add(refunded, {"cause": str(Cause.CANCEL)})
            log.info("refunded a job the core failed while the user canceled it", extra={"job_id": job_id, "user_id": user_id})

    # -- settling runs -----------------------------------------------------------------------

    async def settle_run(self, job_id: uuid.UUID, user_id: str, *, cause: Cause) -> None:
        """The core confirmed the ended job's run settled: free its slot and promote."""
        await self._tasks.outliving_the_caller(
            self._following_up_if_lost(self._settle_run(job_id, user_id, cause), user_id=user_id), name=f"settle-run-{job_id}"
        )

    async def _settle_run(self, job_id: uuid.UUID, user_id: str, cause: Cause) -> None:
        settlement = await self._store.settle_job_run(job_id, user_id, self.promotion_limits)
        promoted = settlement.promoted
        if settlement.settled:
            self._note_slot_freed(promoted)
            telemetry.metrics.run_settlements.add(1, {"kind": "job", "result": "settled"})
            log.info("run settled", extra={"job_id": job_id, "user_id": user_id, "cause": cause})
            self._capacity.freed()
        # Promotions made anyway (a slot freed by someone else) are released too.
        self._after_promotion(user_id, promoted, cause)

    async def _settle_now(self, job: JobRef) -> None:
        """One immediate attempt after a job ended unsettled; the sweeper retries with backoff."""
        if await self.cancel_until_confirmed(job.run_id, kind="job") is not None:
            await self.settle_run(job.job_id, job.user_id, cause=Cause.RUN_SETTLED)

    async def cancel_until_confirmed(self, run_id: uuid.UUID, *, kind: str) -> RunReport | None:
        """One CancelRun attempt: the core's report when it confirms the run settled, else None
        (no answer, or a run still held or judging), and the caller schedules the next attempt."""
        try:
            report = await self._core.cancel_run(run_id)
        except errors.CoreUnavailable as exc:
            log.warning("run not yet confirmed settled; retrying later", extra={"run_id": run_id, "reason": exc.message})
            report = None
        if report is None or not report.fate.settled:
            telemetry.metrics.run_settlements.add(1, {"kind": kind, "result": "retry"})
            return None
        return report

    # -- retries -----------------------------------------------------------------------------

    def backoff_seconds(self, attempt: int) -> float:
        """How long a claim's next durable attempt waits: capped exponential, full jitter."""
        return full_jitter_backoff(attempt, cap=self._settings.release_backoff_max_seconds)

    # -- fleet settings ----------------------------------------------------------------------

    async def set_core_capacity(self, capacity: int) -> SettingChange:
        """Sets the fleet's capacity at the core (0: unlimited), recorded with the caller."""
        with telemetry.tracer.start_as_current_span("capacity.set") as span:
            span.set_attribute("queue.capacity", capacity)
            async with self._store.statements() as db:
                change = await db.set_core_capacity(capacity=capacity)
        log.info(
            "setting changed",
            extra={"kind": change.setting, "amount": change.new_value, "actor": change.actor, "reason": f"was {change.old_value}"},
        )
        # Every replica applies it at its next grant; this one grants now (capacity may be free).
        self._capacity.learned(True)
        self._capacity.freed()
        return change

    async def set_user_queue_limit(self, user_id: str, max_active: int) -> SettingChange:
        """Sets a user's slots (0: the default), recorded with the caller; a raised limit fills
        the user's new slots at once."""
        with telemetry.tracer.start_as_current_span("user_limit.set") as span:
            span.set_attribute("queue.user_id", user_id)
            async with self._store.statements() as db:
                change = await db.set_user_queue_limit(user_id=user_id, max_active=max_active)
        log.info(
            "setting changed",
            extra={
                "kind": change.setting,
                "user_id": user_id,
                "amount": change.new_value,
                "actor": change.actor,
                "reason": f"was {change.old_value}",
            },
        )
        await self.promote(user_id, cause=Cause.TOOLING)
        return change

    async def set_releases_paused(self, user_id: str, *, paused: bool, note: str) -> SettingChange | None:
        """Pauses or resumes the releases of the fleet ('') or of one user, recorded with the
        caller; None when nothing changed. Every replica obeys it at its next claim or grant (it is
        in the database); on a resume this replica grants at once and claims the retries the pause
        held (their jobs kept their capacity), so the held runs start now."""
        with telemetry.tracer.start_as_current_span("releases.pause") as span:
            span.set_attribute("queue.user_id", user_id)
            span.set_attribute("queue.releases_paused", paused)
            change = await self._store.set_releases_paused(
                user_id=user_id, paused=paused, note=note, release_window_seconds=self._settings.release_window_seconds
            )
        if change is not None:
            log.info(
                "setting changed",
                extra={"kind": change.setting, "user_id": user_id, "amount": change.new_value, "actor": change.actor, "reason": note},
            )
        # Paused or not, jobs wait for grants now: this replica asks (a resume is granted at once).
        self._capacity.learned(True)
        self._capacity.freed()
        if change is not None and not paused:
            self._wake_dispatcher()
        return change

    async def record_operator_action(self, action: str, *, user_id: str, job_id: uuid.UUID | None, outcome: str) -> None:
        """Records an operator's Promote, Release or CheckJobWithCore for the audit timeline, with
        the caller as its actor. The action itself has committed: a record the database refused is
        logged (the log line carries the same), never turned into the call's error."""
        try:
            async with self._store.statements() as db:
                await db.record_operator_action(action=action, user_id=user_id, job_id=job_id, outcome=outcome)
        except errors.QueueError as exc:
            telemetry.metrics.audit_records_lost.add(1, {"action": action})
            log.warning(
                "an operator's action was done but not recorded in the audit timeline (%s)",
                exc.reason,
                extra={"kind": action, "user_id": user_id, "job_id": job_id, "reason": outcome},
            )
            return
        log.info("operator action", extra={"kind": action, "user_id": user_id, "job_id": job_id, "reason": outcome})

    async def setting_changes(self, *, before_change_id: int | None, limit: int) -> list[SettingChange]:
        async with self._store.statements() as db:
            return await db.setting_changes(before_change_id=before_change_id, limit=limit)


def _already_finished(job_id: uuid.UUID, status: JobStatus) -> errors.QueueError:
    return errors.JobAlreadyFinished(
        f"job {job_id} already {status}; only queued, pending or running jobs can be canceled",
        metadata={"jobId": str(job_id), "status": status.upper()},
    )
