"""Recovery: what the sweeper asks of the core for work a lost answer or a crash left behind.

A RUNNING job whose completion never came is reconciled (the core is asked how its run ended); an
ended job whose run is not yet confirmed settled has its run canceled until the core confirms
(then the lifecycle core settles it: the slot frees, the next job is promoted); a run reserved by
an admit that failed or died is canceled until the core confirms, then forgotten. Each step is one
attempt; the sweeper's next pass retries what did not finish, with backoff. Promotion and giving
up expired releases, which the sweeper asks for too, are handed on to the rooms that own them.
"""

from __future__ import annotations

import logging
import uuid

from queue_service import errors, telemetry
from queue_service.engine.parts import SharedParts
from queue_service.engine.ports import ExpiredReleases, FailoverGuard, Lifecycle
from queue_service.model import (
    Cause,
    ClaimedReservation,
    ClaimedSettlement,
    JobStatus,
    JobView,
    Promoted,
    RunFate,
    RunReport,
    Transition,
)

log = logging.getLogger(__name__)


class Recovery:
    def __init__(self, engine: Lifecycle, releases: ExpiredReleases, parts: SharedParts, *, guard: FailoverGuard) -> None:
        self._engine = engine
        # A reserved run whose job a failover lost is adopted, not canceled (`cancel_reserved_run`).
        self._guard = guard
        self._releases = releases
        self._store = parts.store
        self._core = parts.core

    @property
    def cancel_recheck_seconds(self) -> float:
        """How long an unanswered cancel waits before it is asked again (the lifecycle core's)."""
        return self._engine.cancel_recheck_seconds

    async def promote(self, user_id: str, *, cause: Cause) -> tuple[Promoted, ...]:
        """A user with a free slot and queued work (a lost promotion): the core promotes."""
        return await self._engine.promote(user_id, cause=cause)

    async def give_up_release(self, job_id: uuid.UUID, user_id: str, reason: str, *, attempts: int) -> bool:
        """A release whose window passed: the releases give it up (fail and refund the job)."""
        return await self._releases.give_up_release(job_id, user_id, reason, attempts=attempts)

    async def cancel_waiting_job(self, job_id: uuid.UUID, user_id: str) -> bool:
        """A job waiting for capacity whose user's cancel was recorded: the lifecycle core's cancel
        ends it (without the core, while it still waits); True once it is canceled."""
        await self._engine.cancel(job_id, user_id)
        return True

    async def reconcile(self, job_id: uuid.UUID, user_id: str, run_id: uuid.UUID, *, cancel_requested: bool = False) -> bool:
        """Asks the core about a RUNNING job whose completion never arrived, or cancels the run of
        one whose user's cancel went unanswered; returns whether the job ended."""
        if cancel_requested:
            report = await self._core.cancel_run(run_id)
            if not report.fate.settled:
                return False
            log.info(
                "cancel retried for a job whose cancel went unanswered",
                extra={"job_id": job_id, "run_id": run_id, "status": report.fate.value},
            )
            return await self._engine.end_job(job_id, user_id, Transition.canceled(report)) is not None
        report = await self._core.get_run(run_id)
        if report.fate is RunFate.HELD:
            # A release we saw confirmed did not take (the core lost it): release it again.
            report = await self._core.release_run(run_id)
        if not report.fate.settled:
            return False
        log.info(
            "reconciling a run whose completion never arrived", extra={"job_id": job_id, "run_id": run_id, "status": report.fate.value}
        )
        return await self._engine.end_job(job_id, user_id, Transition.reconciled(report)) is not None

    async def check_with_core(self, job: JobView) -> tuple[RunReport | None, bool]:
        """An operator's "check with the core now" (OperatorService.CheckJobWithCore): asks the
        core about one active job's run at once and acts on the answer as the lost-run check and
        the reconciliation would later: a run the core does not know fails the job, refunded; a
        RUNNING job whose run ended is ended as reported; a RUNNING job whose run the core still
        holds is released again. Returns the core's answer (None for an ended job, not asked
        about) and whether the job changed. CoreUnavailable when the core did not answer."""
        if not job.status.is_live:
            return None, False
        with telemetry.tracer.start_as_current_span("job.check_with_core") as span:
            span.set_attribute("queue.job_id", str(job.job_id))
            span.set_attribute("queue.job.status", str(job.status))
            report = await self._core.get_run(job.run_id)
            span.set_attribute("queue.run.fate", report.fate.value)
            changed = False
            if report.fate is RunFate.UNKNOWN_TO_CORE:
                transition = Transition.forgotten_by_core(job.status, attempts=job.release_attempts)
                changed = await self._engine.end_job(job.job_id, job.user_id, transition) is not None
                if changed:
                    telemetry.metrics.core_runs_forgotten.add(1, {"status": str(job.status)})
            elif job.status is JobStatus.RUNNING and report.fate is RunFate.HELD:
                # A release we saw confirmed did not take (the core lost it): release it again.
                released = await self._core.release_run(job.run_id)
                changed = True
                if released.fate.settled:
                    changed = await self._engine.end_job(job.job_id, job.user_id, Transition.reconciled(released)) is not None
            elif job.status is JobStatus.RUNNING and report.fate.settled:
                changed = await self._engine.end_job(job.job_id, job.user_id, Transition.reconciled(report)) is not None
            span.set_attribute("queue.job.changed", changed)
        log.info(
            "an operator checked a job's run with the core (%s)",
            "the job changed" if changed else "nothing to change",
            extra={"job_id": job.job_id, "user_id": job.user_id, "run_id": job.run_id, "status": report.fate.value},
        )
        return report, changed

    async def attempt_run_settlement(self, claim: ClaimedSettlement) -> bool:
        """Asks the core to cancel a claimed unsettled run; settles the job when it confirms."""
        with telemetry.tracer.start_as_current_span("run.settle") as span:
            span.set_attribute("queue.job_id", str(claim.job_id))
            span.set_attribute("queue.run.settle.attempt", claim.attempt)
            if await self._engine.cancel_until_confirmed(claim.run_id, kind="job") is None:
                async with self._store.statements() as db:
                    await db.schedule_retry(claim, backoff_seconds=self._engine.backoff_seconds(claim.attempt))
                return False
            await self._engine.settle_run(claim.job_id, claim.user_id, cause=Cause.RUN_SETTLED)
            return True

    async def cancel_reserved_run(self, claim: ClaimedReservation) -> bool:
        """Cancels a reserved run whose admit is gone; forgets it once the core confirms. A run the
        core judges as a first-pass run, or whose reservation an earlier timeline wrote, is adopted
        instead: its job was lost in a failover (`CoreReconciler.adopt_if_lost`)."""
        with telemetry.tracer.start_as_current_span("run.cancel_orphan") as span:
            span.set_attribute("queue.run_id", str(claim.run_id))
            try:
                adopted: bool | None = await self._guard.adopt_if_lost(claim.run_id)
            except errors.CoreUnavailable:
                adopted = None
            span.set_attribute("queue.reservation.adopted", bool(adopted))
            if adopted:
                async with self._store.statements() as db:
                    await db.drop_run_reservation(run_id=claim.run_id)  # consumed by the adoption already, as a rule
                telemetry.metrics.run_settlements.add(1, {"kind": "orphan", "result": "adopted"})
                return True
            report = await self._engine.cancel_until_confirmed(claim.run_id, kind="orphan") if adopted is not None else None
            if report is None:
                async with self._store.statements() as db:
                    await db.schedule_retry(claim, backoff_seconds=self._engine.backoff_seconds(claim.attempt))
                return False
            async with self._store.statements() as db:
                await db.settle_run_reservation(run_id=claim.run_id)
            telemetry.metrics.run_settlements.add(1, {"kind": "orphan", "result": "settled"})
            log.info("orphaned run canceled", extra={"run_id": claim.run_id, "status": report.fate.value})
            return True
