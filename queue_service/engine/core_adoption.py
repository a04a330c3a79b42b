"""Adoption: a live run at the core whose job the database lost comes back as a job, or is lost.

An asynchronous failover can lose an acknowledged admit while the core holds or judges its run
(design I14). Whoever finds such a run (the reconciliation, the release gate, a completion of an
unknown run, the clean-up of a reserved run: `core_reconciliation`) has it adopted here. It adopts
whenever the core's record suffices (the queue's job id, idempotency key, request digest and price
travel with CreateRun and come back in `Run.creation`): the click was acknowledged, the user was
told her job exists, and the core did or does the work, so the job comes back with its charge,
under its user's lock, idempotently across replicas (the run id and the idempotency key are
unique). A judging run comes back RUNNING holding a slot, the user's PENDING jobs going back to
her queue to make room for it (migration 0024: from then on the database alone keeps them from the
core until it settles, whatever the history's record says); a held one QUEUED or PENDING by the
normal rules. It cancels, and records the loss in `core_runs_lost` for the operator, only when
adoption would be wrong or impossible: the record lacks the queue's fields, the same click was
admitted again meanwhile (another run now carries it), a delta's base job was lost too, or the
user's balance cannot pay the charge again (I3). A failed admit's run, confirmed settled, is never
adopted (I5).

A completion of an unknown run (`adopt_for_completion`) adopts the run first (the core's record, by
GetRun), so the completion applies; while that cannot be decided (the core or the database does
not answer) the completion is answered RUN_NOT_YET_ADMITTED, which the core retries.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable

from queue_service import errors, telemetry
from queue_service.config import Config, settings_of
from queue_service.core_client import CoreClient
from queue_service.model import Adoption, CoreRun, JobStatus, LostRun, PromotionLimits, RunFate
from queue_service.store import Store

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunAdoptionSettings:
    """The settings an adoption reads (QUEUE_* of the same names): an adopted job is placed by
    the promotion's rules."""

    max_active_per_user: int
    release_window_seconds: float
    release_lease_seconds: float
    reconcile_after_seconds: float

    @classmethod
    def from_config(cls, config: Config) -> RunAdoptionSettings:
        return settings_of(cls, config)


class RunAdoption:
    """Adopts or cancels the live runs at the core that no job owns; safe on every replica at once."""

    def __init__(self, store: Store, core: CoreClient, settings: RunAdoptionSettings, *, wake_dispatcher: Callable[[], None]) -> None:
        self._store = store
        self._core = core
        self._settings = settings
        self._limits = PromotionLimits(settings.max_active_per_user, settings.release_window_seconds, settings.release_lease_seconds)
        # An adopted job that is PENDING is the dispatcher's to release.
        self._wake_dispatcher = wake_dispatcher

    async def settle_orphan(self, listed: CoreRun) -> str:
        """Adopts or cancels one run the queue did not know when it looked: 'adopted', 'lost',
        or 'known' (a job owns it after all, or an admit is in flight with it)."""
        # Asked again after the database was read: a run listed before its admit's clean-up
        # canceled it (and dropped the reservation) is canceled now, never adopted.
        run = await self._core.get_run_record(listed.run_id)
        if run is None or run.fate.settled:
            return "known"
        return await self._adopt_or_cancel(run)

    async def _abandoned(self, run_id: uuid.UUID) -> bool:
        """A failed admit's run, confirmed settled at the core: no lost job, never adopted (I5)."""
        async with self._store.statements() as db:
            return await db.run_abandoned(run_id=run_id)

    async def _adopt_or_cancel(self, run: CoreRun, *, cancel: bool = True) -> str:
        if await self._abandoned(run.run_id):
            return "abandoned"
        if not run.adoptable:
            return await self._lose(run, "record_incomplete", cancel=cancel)
        adoption = await self._store.adopt_run(run, self._limits, reconcile_after_seconds=self._settings.reconcile_after_seconds)
        if adoption.kind == "adopted":
            view = adoption.view
            assert view is not None
            state = "judging" if run.fate is RunFate.JUDGING else "held"
            telemetry.metrics.core_runs_adopted.add(1, {"state": state})
            log.warning(
                "adopted a run whose job the database had lost",
                extra={"job_id": view.job_id, "user_id": view.user_id, "run_id": run.run_id, "status": view.status, "amount": run.price},
            )
            self._log_taken_back(adoption)
            if view.status is JobStatus.PENDING:
                self._wake_dispatcher()
            return "adopted"
        if adoption.kind == "reserved":
            return "reserved"
        if adoption.kind == "known":
            return "known"
        return await self._lose(run, adoption.kind, cancel=cancel)

    @staticmethod
    def _log_taken_back(adoption: Adoption) -> None:
        """The user's PENDING jobs an adopted judging run sent back to her queue: the database
        keeps them from the core until that run settles (I9), then promotes them first."""
        for job in adoption.taken_back:
            log.warning(
                "a job went back to its queue: a run adopted after a database failover judges in its place",
                extra={"job_id": job.job_id, "user_id": job.user_id, "run_id": job.run_id, "status": job.status},
            )

    async def _lose(self, run: CoreRun, reason: str, *, cancel: bool) -> str:
        """Records the run as lost for the operator, then cancels it (confirmed by the core, or
        retried by the next reconciliation while it stays live)."""
        lost = LostRun(run.run_id, run.user_id, run.job_id, run.idempotency_key, run.price, run.fate.value, reason)
        async with self._store.statements() as db:
            first = await db.record_lost_run(lost)
        if first:
            telemetry.metrics.core_runs_lost.add(1, {"reason": reason})
            log.warning(
                "a run whose job the database lost could not be adopted; canceling it",
                extra={"run_id": run.run_id, "user_id": run.user_id, "job_id": run.job_id, "reason": reason, "amount": run.price},
            )
        if cancel:
            await self._core.cancel_run(run.run_id)
        return "lost"

    async def adopt_if_lost(self, run_id: uuid.UUID) -> bool:
        """A reserved run is about to be canceled (its reservation claimed by the sweeper once its
        grace is over, or by its admit's own clean-up): True when it must not be, because its job
        was lost in a failover. That is so when the core judges it as a first-pass run (it judges
        only once its job committed: the standby had only the reservation), or when the
        reservation was written on an earlier timeline than the current primary's (its admit ran
        on a primary a failover replaced: it committed there and was acknowledged, or answered an
        error the client retries with the same key, finding the adopted job). The run is adopted
        (the reservation consumed; True also when a job owns it already, adopted meanwhile by
        another path); where it cannot be, it is recorded lost and False lets the cancel go on.
        Raises CoreUnavailable when the core does not answer (the cancel is retried)."""
        run = await self._core.get_run_record(run_id)
        if run is None or run.fate.settled:
            return False
        if not (run.first_pass and run.fate is RunFate.JUDGING):
            # A held run: adopted only when an earlier timeline wrote its reservation. Asked
            # without the user's lock, so a failed admit's clean-up (the common case, this
            # timeline's) never waits for a busy user queue before it cancels.
            async with self._store.statements() as db:
                if not await db.reservation_of_an_earlier_timeline(run_id=run_id):
                    return False
        # "known": adopted meanwhile (the release gate, another replica's reconciliation): a job
        # owns the run now, and a claim taken before must not cancel it. "reserved": an admit's
        # reservation of this timeline, canceled as before.
        return await self._adopt_or_cancel(run, cancel=False) in ("adopted", "known")

    async def adopt_for_completion(self, run_id: uuid.UUID) -> bool:
        """A CompleteRun came for a run no job owns: adopts it from the core's record (as the
        judging run it was) so the completion can apply. True when a job owns the run now; False
        when it never will (the core does not know it, or it could not be adopted: recorded as
        lost). Raises RunNotYetAdmitted while an admit is still in flight with it, and the
        core's or the database's unavailability while it cannot be decided."""
        with telemetry.tracer.start_as_current_span("core.adopt_for_completion") as span:
            span.set_attribute("queue.run_id", str(run_id))
            run = await self._core.get_run_record(run_id)
            # A run the core holds or canceled never judged to an end: its completion records no
            # work. A failed admit's run (a delta judges at once, and may finish before the admit's
            # cancel reaches it) was answered as an error: adopting it would charge a job behind
            # that answer (I5).
            if run is None or run.fate in (RunFate.HELD, RunFate.CANCELED) or await self._abandoned(run_id):
                return False
            if not run.adoptable:
                await self._lose(run, "record_incomplete", cancel=False)
                return False
            telemetry.metrics.core_reconciliations.add(1, {"trigger": "completion", "result": "ok"})
            # It was judging when the database lost its job: adopted RUNNING, then completed.
            judged = dataclasses.replace(run, fate=RunFate.JUDGING)
            adoption = await self._store.adopt_run(judged, self._limits, reconcile_after_seconds=self._settings.reconcile_after_seconds)
            span.set_attribute("queue.adoption", adoption.kind)
            if adoption.kind == "reserved":
                raise errors.RunNotYetAdmitted(
                    f"the admit of run {run_id} has not committed yet; retry the completion shortly", metadata={"runId": str(run_id)}
                )
            if adoption.kind in ("adopted", "known"):
                if adoption.kind == "adopted":
                    self._log_taken_back(adoption)
                    telemetry.metrics.core_runs_adopted.add(1, {"state": "finished"})
                    log.warning("adopted a finished run whose job the database had lost", extra={"run_id": run_id, "user_id": run.user_id})
                return True
            await self._lose(run, adoption.kind, cancel=False)
            return False
