"""The store's locked sections: each one statement holding the user's queue lock
(`locks.locked_section`: the admit, the endings, an adoption, a promotion, a settled run, a refund)
or the fleet-wide capacity lock (`locks.capacity_section`: the grant, a pause of releases), and the
first releases owed, read holding the user's lock. `Store` takes them from `LockedSections`."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

from psycopg.types.json import Jsonb

from queue_service import audit, errors
from queue_service.model import (
    AdmitLimits,
    AdmittedJob,
    Adoption,
    CapacityGrant,
    Cause,
    ClaimedRelease,
    CoreRun,
    JobEnding,
    LedgerKind,
    NewJob,
    Promoted,
    PromotionLimits,
    RunCompletion,
    RunFate,
    RunReportToApply,
    RunSettlement,
    SettingChange,
    Transition,
)
from queue_service.store import rows as from_row
from queue_service.store.feed import CommitHints
from queue_service.store.json_values import sources_to_json
from queue_service.store.locks import (
    capacity_section,
    locked_section,
    locked_section_of_run,
    locked_sections_of_runs,
    locked_sections_of_runs_then_grant,
    take_user_queue_lock,
)
from queue_service.store.pool import QueuePool, connection
from queue_service.store.queries import statement
from queue_service.store.statements.base import Row, status_values

_NEW_JOB_FIELDS = tuple(field.name for field in dataclasses.fields(NewJob))
# A delta names its base by this foreign key: the pruner may delete the base as the delta commits.
_DELTA_BASE_REFERENCE = "analysis_jobs_delta_of_job_id_fkey"


def _limit_params(limits: PromotionLimits) -> Row:
    return {
        "default_max_active": limits.default_max_active,
        "release_window_seconds": float(limits.release_window_seconds),
        "release_lease_seconds": float(limits.release_lease_seconds),
    }


def _ending_params(transition: Transition, actor: str, limits: PromotionLimits) -> Row:
    """The parameters every ending section takes from its transition."""
    return {
        "status": str(transition.to),
        "last_error": transition.last_error,
        "refund": transition.refund,
        "actor": actor,
        "reason": str(transition.cause),
        **_limit_params(limits),
    }


def _ending(rows: list[Row], transition: Transition, actor: str) -> JobEnding:
    """The JobEnding of a section's rows: its 'ended' row first, then 'promoted' rows."""
    row = rows[0]
    assert row["row_kind"] == "ended", row["row_kind"]
    view = from_row.job_view(row)
    ref = from_row.view_ref(view, row)
    refunded = int(row["refunded_amount"])
    if refunded:
        audit.log_movement(
            kind=LedgerKind.REFUND, user_id=ref.user_id, amount=refunded, job_id=ref.job_id, actor=actor, reason=transition.refund_cause
        )
    return JobEnding(ref, view, refunded, from_row.promoted(rows))


def _end_runs_params(reports: Sequence[RunReportToApply], limits: PromotionLimits) -> Row:
    return {
        "run_ids": [report.run_id for report in reports],
        "statuses": [str(report.transition.to) for report in reports],
        "last_errors": [report.transition.last_error for report in reports],
        "refunds": [report.transition.refund for report in reports],
        "actors": [report.actor for report in reports],
        "reasons": [str(report.transition.cause) for report in reports],
        **_limit_params(limits),
    }


def _run_completions(rows: list[Row], reports: Sequence[RunReportToApply]) -> list[RunCompletion]:
    """The completions of `end_runs`' rows, in the reports' order."""
    rows_of: dict[int, list[Row]] = {index: [] for index in range(1, len(reports) + 1)}
    for row in rows:
        rows_of[row["batch_index"]].append(row)
    return [_run_completion(rows_of[index], report.transition, report.actor) for index, report in enumerate(reports, start=1)]


def _run_completion(rows: list[Row], transition: Transition, actor: str) -> RunCompletion:
    """A run's completion from its section's rows (`queue_end_run_viewed`)."""
    kind = rows[0]["row_kind"]
    if kind in ("reserved", "unknown"):
        return RunCompletion(None, reserved=kind == "reserved")
    if kind == "ended":
        ending = _ending(rows, transition, actor)
        return RunCompletion(ending.ref, view=ending.view, ending=ending)
    view = from_row.job_view(rows[0])
    return RunCompletion(from_row.view_ref(view, rows[0]), view=view)


class LockedSections:
    """The sections of `Store`, on its pool; a section that changed jobs tells the feed's hints."""

    pool: QueuePool
    hints: CommitHints

    async def first_releases_owed(
        self, *, user_id: str | None = None, run_id: uuid.UUID | None = None
    ) -> tuple[list[ClaimedRelease], list[ClaimedRelease]]:
        """The first releases claimed for the user (or the user whose job owns `run_id`) and not
        tried since (`first_releases_owed`), read holding the user's queue lock: a locked change
        of that user still committing (a late acknowledgement, a statement given up) has ended
        by then, and what it promoted is seen. Those to hand over, and those of a paused user,
        sent back to waiting for a grant by the same statement."""
        async with connection(self.pool) as conn, conn.transaction():
            if user_id is None:
                owner = await (await conn.execute(statement("run_owner"), {"run_id": run_id})).fetchone()
                if owner is None:
                    return [], []
                user_id = str(owner["user_id"])
            await take_user_queue_lock(conn, user_id)
            rows = await (await conn.execute(statement("first_releases_owed"), {"user_id": user_id})).fetchall()
            held = [row["job_id"] for row in rows if row["held"]]
            if held:
                await conn.execute(statement("send_back_to_wait"), {"job_ids": held})
        if any(row["held"] for row in rows):
            self.hints.committed()
        owed = [from_row.claimed_release(row) for row in rows if not row["held"]]
        return owed, [from_row.claimed_release(row) for row in rows if row["held"]]

    async def _locked(self, user_id: str, name: str, params: Row) -> list[Row]:
        rows = await locked_section(self.pool, user_id, statement(name), params)
        if rows:
            self.hints.committed()
        return rows

    async def admit_job(self, job: NewJob, limits: AdmitLimits) -> AdmittedJob | None:
        """Admits the job under its user's lock; its view and whether the statement's database
        history is reconciled (`AdmittedJob`), or None when the key is taken, the balance is
        short, the queue or delta limit is full, the run's reservation is gone, or the delta's
        base was deleted since the pre-check. The charge records the current actor (`audit`)."""
        actor = audit.actor_for(Cause.ADMIT)
        params = {
            # Field by field, not dataclasses.asdict: that deep-copies the sources, replaced below.
            **{name: getattr(job, name) for name in _NEW_JOB_FIELDS},
            # NULL for an admit that carries none (tools, tests): "not stored", not "no sources".
            "sources": Jsonb(sources_to_json(job.sources)) if job.sources else None,
            "actor": actor,
            "reason": str(Cause.ADMIT),
            "default_max_active": limits.default_max_active,
            "max_queued": limits.max_queued,
            "max_running_deltas": limits.max_running_deltas,
            "release_window_seconds": float(limits.release_window_seconds),
            "release_lease_seconds": float(limits.release_lease_seconds),
            "reconcile_after_seconds": float(limits.reconcile_after_seconds),
        }
        try:
            rows = await self._locked(job.user_id, "admit_job", params)
        except errors.Conflict as conflict:
            if job.delta_of_job_id is None or conflict.metadata.get("constraint") != _DELTA_BASE_REFERENCE:
                raise
            # The pruner deleted the base after the admit's pre-check (past its retention): nothing
            # was written, and the admit's state read again says DELTA_BASE_NOT_FOUND.
            return None
        if not rows:
            return None
        if job.price > 0:
            audit.log_movement(
                kind=LedgerKind.CHARGE, user_id=job.user_id, amount=-job.price, job_id=job.job_id, actor=actor, reason=Cause.ADMIT
            )
        return AdmittedJob(from_row.job_view(rows[0]), history_reconciled=rows[0].get("history_reconciled"))

    async def end_job(self, job_id: uuid.UUID, user_id: str, transition: Transition, limits: PromotionLimits) -> JobEnding | None:
        """Applies a named transition under the user's lock if the job is still in one of its
        statuses (and, when it names one, still at its release attempt), refunds when it says so,
        and promotes the user's next jobs when the run is settled. None when the job was not in a
        status the transition starts from (fenced)."""
        actor = audit.actor_for(transition.cause)
        params = {
            **_ending_params(transition, actor, limits),
            "job_id": job_id,
            "from_statuses": status_values(transition.from_statuses),
            "expected_attempts": transition.expected_attempts,
            "run_unsettled": transition.run_unsettled,
        }
        rows = await self._locked(user_id, "end_job", params)
        return _ending(rows, transition, actor) if rows else None

    async def end_run(self, report: RunReportToApply, limits: PromotionLimits) -> RunCompletion:
        """Applies the core's report of a run under the lock of the user whose job owns it, in one
        statement that also finds the job: ends the job (refund when asked, promotions) if it was
        PENDING or RUNNING. Else reports the job as it is, or that no job owns the run yet."""
        params = _ending_params(report.transition, report.actor, limits)
        rows = await locked_section_of_run(self.pool, report.run_id, statement("end_run"), params)
        self.hints.committed()
        return _run_completion(rows, report.transition, report.actor)

    async def end_runs(self, reports: Sequence[RunReportToApply], limits: PromotionLimits) -> list[RunCompletion]:
        """`end_run` for several runs in one statement holding all their users' locks, each
        report with the actor of the call it came from; the completions in the reports' order.
        Raises LOCK_TIMEOUT when a user's lock is not granted soon (`locks._BATCH_LOCK_TIMEOUT`)."""
        params = _end_runs_params(reports, limits)
        rows = await locked_sections_of_runs(self.pool, params["run_ids"], statement("end_runs"), params)
        self.hints.committed()
        return _run_completions(rows, reports)

    async def end_runs_then_grant(
        self,
        reports: Sequence[RunReportToApply],
        limits: PromotionLimits,
        *,
        probe_interval_seconds: float,
        max_grants: int,
    ) -> tuple[list[RunCompletion], CapacityGrant | None]:
        """`end_runs`, then in the same statement and commit `grant_capacity` if the fleet-wide
        capacity lock is free at once (`locks.locked_sections_of_runs_then_grant`): the capacity
        the completions freed goes to the next in line without a statement of its own. The grant
        is None when the lock was busy: nothing was granted, the caller asks for a grant as usual."""
        params = {
            **_end_runs_params(reports, limits),
            "lease_seconds": float(limits.release_lease_seconds),
            "probe_interval_seconds": float(probe_interval_seconds),
            "max_grants": max_grants,
        }
        rows, grant_rows = await locked_sections_of_runs_then_grant(
            self.pool, params["run_ids"], statement("end_runs"), statement("grant_capacity"), params
        )
        self.hints.committed()
        grant = None if grant_rows is None else from_row.capacity_grant(from_row.capacity_grant_json(grant_rows))
        return _run_completions(rows, reports), grant

    async def adopt_run(self, run: CoreRun, limits: PromotionLimits, *, reconcile_after_seconds: float) -> Adoption:
        """Adopts a run the core holds or judges into a job, under its user's lock, with its
        charge (the current actor, `audit`) and, for a retry's run, the job it retries (read from
        its key, `CoreRun.retry_of_job_id`); idempotent by run id and idempotency key."""
        assert run.job_id is not None
        actor = audit.actor_for(Cause.ADOPT)
        params = {
            "job_id": run.job_id,
            "user_id": run.user_id,
            "run_id": run.run_id,
            "idempotency_key": run.idempotency_key,
            "request_digest": run.request_digest,
            "delta_of_run_id": run.delta_of_run_id,
            "price": run.price,
            "judging": run.fate is RunFate.JUDGING,
            # A retry's lineage, written by the adoption itself (functions/queue_adopt_run_v2.sql).
            "retry_of_job_id": run.retry_of_job_id,
            "actor": actor,
            "reason": str(Cause.ADOPT),
            "reconcile_after_seconds": float(reconcile_after_seconds),
            **_limit_params(limits),
        }
        rows = await self._locked(run.user_id, "adopt_run", params)
        row = rows[0]
        kind = row["row_kind"]
        view = from_row.job_view(row) if row["job_id"] is not None else None
        if kind == "adopted" and run.price > 0:
            audit.log_movement(
                kind=LedgerKind.CHARGE, user_id=run.user_id, amount=-run.price, job_id=run.job_id, actor=actor, reason=Cause.ADOPT
            )
        taken_back = tuple(from_row.job_view(taken) for taken in rows[1:] if taken["row_kind"] == "taken_back")
        return Adoption(kind, view, taken_back)

    async def promote(self, user_id: str, limits: PromotionLimits) -> tuple[Promoted, ...]:
        """Fills every free slot of the user from the queue, oldest first, each promoted job's
        first release claimed for this replica."""
        return from_row.promoted(await self._locked(user_id, "promote", {"promote_user_id": user_id, **_limit_params(limits)}))

    async def settle_job_run(self, job_id: uuid.UUID, user_id: str, limits: PromotionLimits) -> RunSettlement:
        """Marks an ended job's run settled, freeing its slot, and fills the user's free slots."""
        rows = await self._locked(user_id, "settle_job_run", {"job_id": job_id, "settle_user_id": user_id, **_limit_params(limits)})
        return RunSettlement(settled=any(row["row_kind"] == "settled" for row in rows), promoted=from_row.promoted(rows))

    async def refund_failed_job(self, job_id: uuid.UUID, user_id: str, *, reason: Cause) -> int:
        """Refunds the job if it ended FAILED; the refunded amount (0: it did not fail, had no
        charge, or was already refunded). The refund records the current actor (`audit`)."""
        actor = audit.actor_for(reason)
        rows = await self._locked(user_id, "refund_failed_job", {"job_id": job_id, "actor": actor, "reason": str(reason)})
        refunded = int(rows[0]["refunded_amount"]) if rows else 0
        if refunded:
            audit.log_movement(kind=LedgerKind.REFUND, user_id=user_id, amount=refunded, job_id=job_id, actor=actor, reason=reason)
        return refunded

    async def set_releases_paused(self, *, user_id: str, paused: bool, note: str, release_window_seconds: float) -> SettingChange | None:
        """Pauses or resumes the releases of the fleet ('') or of one user under the fleet-wide
        capacity lock, recorded with the current actor (`audit`); None when nothing changed. A
        resume makes the retries the pause held due at once, with a fresh release window."""
        actor = audit.actor_for("releases_paused")
        params = {
            "user_id": user_id,
            "paused": paused,
            "actor": actor,
            "note": note,
            "release_window_seconds": float(release_window_seconds),
        }
        rows = await capacity_section(self.pool, statement("set_releases_paused"), params)
        return from_row.setting_change(rows[0]) if rows else None

    async def grant_capacity(
        self, *, lease_seconds: float, release_window_seconds: float, probe_interval_seconds: float, max_grants: int
    ) -> CapacityGrant:
        """Hands the free capacity of the core to waiting jobs in fair order, under the fleet-wide
        capacity lock (`locks.capacity_section`), each release claimed for this replica."""
        params = {
            "lease_seconds": float(lease_seconds),
            "release_window_seconds": float(release_window_seconds),
            "probe_interval_seconds": float(probe_interval_seconds),
            "max_grants": max_grants,
        }
        return from_row.capacity_grant(await capacity_section(self.pool, statement("grant_capacity"), params))
