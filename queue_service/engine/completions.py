"""Completions: the core reports a run's end (CoreCallbackService.CompleteRun) and the job ends.

A completion knows only its run. It is applied in one statement that finds the run's job under its
user's lock, with the completions that came meanwhile (`CompletionBatcher`: a burst of
completions costs one commit for many); what follows the ending (the promoted job's release, a
grant of the capacity it freed, a settlement) is the lifecycle core's (`QueueEngine.after_ending`).
While the fleet's capacity is limited, the batch's own statement grants the capacity it freed and
starts the granted releases (`ReleaseStarter.start_claimed`): a completion freeing a turn and the
next user's release are one commit. A completion of a run no job owns asks the failover guard to
adopt the run from the core's record first (`FailoverGuard.adopt_for_completion`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from queue_service import audit, errors, telemetry
from queue_service.engine.capacity import FleetCapacity
from queue_service.engine.coalescer import Coalescer, Spawn, counting_batch
from queue_service.engine.owed_releases import OwedReleases
from queue_service.engine.parts import SharedParts
from queue_service.engine.ports import Endings, FailoverGuard, ReleaseStarter
from queue_service.model import (
    Cause,
    JobEnding,
    JobStatus,
    PromotionLimits,
    RunCompletion,
    RunReportToApply,
    Transition,
)
from queue_service.store import Store

# Every user in a batch waits for the whole batch's commit: a few milliseconds at most.
_MAX_COMPLETIONS_PER_STATEMENT = 16
# A batch of completions grants at most this many releases in its own statement (as one grant).
_MAX_GRANTS_WITH_COMPLETIONS = 64


class Completions:
    def __init__(
        self,
        engine: Endings,
        parts: SharedParts,
        *,
        guard: FailoverGuard,
        on_run_judged: Callable[[], None] = lambda: None,
    ) -> None:
        self._engine = engine
        # Told of each run that ended succeeded here (the estimates' mean judging time may have come).
        self._on_run_judged = on_run_judged
        self._tasks = parts.tasks
        self._guard = guard
        # Completions that arrive while one is being applied are applied together (see
        # `CompletionBatcher`): a burst of completions costs one commit for many.
        self._batcher = CompletionBatcher(
            parts.store,
            engine.promotion_limits,
            spawn=parts.tasks.in_background,
            owed_releases=parts.owed_releases,
            capacity=parts.capacity,
            starter=parts.starter,
        )

    async def complete_run(self, run_id: uuid.UUID, *, succeeded: bool, refund: bool, message: str) -> JobEnding:
        """Ends the run's job as the core reports, in one statement that finds the job under its
        user's lock; the job's view as this call left it."""
        transition = Transition.completed(succeeded=succeeded, refund=refund, message=message)
        report = RunReportToApply(run_id, transition, audit.actor_for(transition.cause))
        # The completion and what it owes once committed (the promoted job's hand-over) go on
        # when the core gives up on this call: the core's retry finds the job ended.
        try:
            return await self._tasks.outliving_the_caller(self._complete(report), name=f"complete-run-{run_id}")
        except errors.RunNotFound:
            pass
        # No job owns the run (a failover lost it, say): adopt it from the core's record, then
        # apply; while that cannot be decided, the core retries (RUN_NOT_YET_ADMITTED).
        try:
            adopted = await self._guard.adopt_for_completion(run_id)
        except (errors.CoreUnavailable, errors.DatabaseUnavailable, errors.LockTimeout, errors.OutcomeUnknown) as exc:
            raise errors.RunNotYetAdmitted(
                f"no job owns run {run_id} yet and adopting it could not be decided now ({exc.reason}); retry the completion",
                metadata={"runId": str(run_id)},
            ) from exc
        if not adopted:
            raise errors.RunNotFound(f"no job owns run {run_id}", metadata={"runId": str(run_id)})
        return await self._tasks.outliving_the_caller(self._complete(report), name=f"complete-run-{run_id}")

    async def _complete(self, report: RunReportToApply) -> JobEnding:
        run_id, transition = report.run_id, report.transition
        with self._engine.ending_span(transition) as span:
            span.set_attribute("queue.run_id", str(run_id))
            # Applied by `CompletionBatcher.run_batch` with others that came meanwhile, or by
            # `CompletionBatcher.run_alone`.
            found = await self._batcher.submit(report)
            if found.ending is not None:
                span.set_attribute("queue.job_id", str(found.ending.ref.job_id))
                span.set_attribute("queue.refunded", found.ending.refunded)
        if found.ending is not None:
            if transition.to is JobStatus.SUCCEEDED:
                self._on_run_judged()
            return self._engine.after_ending(found.ending, transition, capacity_granted=found.capacity_granted)
        job = found.job
        if job is None:
            if found.reserved:
                raise errors.RunNotYetAdmitted(
                    f"the admit of run {run_id} has not committed yet; retry the completion shortly",
                    metadata={"runId": str(run_id)},
                )
            raise errors.RunNotFound(f"no job owns run {run_id}", metadata={"runId": str(run_id)})
        if job.status is JobStatus.QUEUED:
            raise errors.RunNotReleased(
                f"the job of run {run_id} is still queued; a held run cannot complete", metadata={"runId": str(run_id)}
            )
        if found.view is not None and found.view.waiting_for_capacity:
            # PENDING, its run never released since it began to wait: the core holds it (I10).
            raise errors.RunNotReleased(
                f"the job of run {run_id} waits for the fleet's capacity and its run was never released; a held run cannot complete",
                metadata={"runId": str(run_id)},
            )
        if job.run_unsettled:
            # The job ended while its run's fate was unknown; the core's callback settles it.
            await self._engine.settle_run(job.job_id, job.user_id, cause=Cause.COMPLETION)
        return JobEnding(job, found.view)


class CompletionBatcher(Coalescer[RunReportToApply, RunCompletion]):
    """Completions that arrive while one is being applied are applied together, in one statement
    (`run_batch`: `Store.end_runs`) that holds each of their users' locks (a burst of completions:
    one commit for many). That statement waits for a user's lock only briefly; a completion whose
    user's lock is busy is then applied alone (`run_alone`: `Store.end_run`), within its caller's
    deadline, and holds up no other.

    While the fleet's capacity is limited, the statement also grants the capacity it freed when the
    capacity lock is free at once (`Store.end_runs_then_grant`): the next in line is released on
    the completion's own commit, with no grant statement after it. When the lock is busy (another
    grant runs), nothing is granted there and the completions ask for a grant as before."""

    applies_alone = True

    def __init__(
        self,
        store: Store,
        limits: PromotionLimits,
        *,
        spawn: Spawn,
        owed_releases: OwedReleases,
        capacity: FleetCapacity,
        starter: ReleaseStarter,
    ) -> None:
        super().__init__(max_batch=_MAX_COMPLETIONS_PER_STATEMENT, spawn=spawn, name="end-runs")
        self._store = store
        self._promotion_limits = limits
        self._owed_releases = owed_releases
        self._capacity = capacity
        self._starter = starter

    async def run_batch(self, reports: list[RunReportToApply]) -> dict[RunReportToApply, RunCompletion]:
        """The coalesced statement, a lone completion's too: it waits for no user's lock long."""
        try:
            with counting_batch("end_runs", len(reports)):
                if self._capacity.limited:
                    completions = await self._end_then_grant(reports)
                else:
                    completions = await self._store.end_runs(reports, self._promotion_limits)
        except errors.OutcomeUnknown:
            # The batch may have committed: each caller's retry alone then finds its job ended,
            # and the releases its commit claimed are handed over here (a grant it made is
            # released when its lease runs out, as a grant statement's lost answer is).
            for report in reports:
                self._owed_releases.follow_up(run_id=report.run_id)
            raise
        return dict(zip(reports, completions, strict=True))

    async def _end_then_grant(self, reports: list[RunReportToApply]) -> list[RunCompletion]:
        with telemetry.tracer.start_as_current_span("capacity.grant") as span:
            span.set_attribute("queue.capacity.with_completions", len(reports))
            completions, grant = await self._store.end_runs_then_grant(
                reports,
                self._promotion_limits,
                probe_interval_seconds=self._capacity.probe_interval_seconds,
                max_grants=_MAX_GRANTS_WITH_COMPLETIONS,
            )
            span.set_attribute("queue.capacity.lock_free", grant is not None)
            if grant is None:
                return completions
            span.set_attribute("queue.capacity.granted", len(grant.claims))
            span.set_attribute("queue.capacity.limited", grant.limited)
        self._capacity.granted(grant)
        for claim, _waited in grant.claims:
            self._starter.start_claimed(claim)
        if len(grant.claims) == _MAX_GRANTS_WITH_COMPLETIONS:
            self._capacity.freed()  # more may be free: the dispatcher grants the rest
        return [dataclasses.replace(completion, capacity_granted=True) for completion in completions]

    async def run_alone(self, report: RunReportToApply) -> RunCompletion:
        """A completion on its own, waiting for its user's lock as long as its call allows."""
        try:
            with counting_batch("end_runs", 1):
                return await self._store.end_run(report, self._promotion_limits)
        except errors.OutcomeUnknown:
            self._owed_releases.follow_up(run_id=report.run_id)
            raise
