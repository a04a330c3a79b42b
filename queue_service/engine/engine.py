"""The queue engine: admit, promote, end (complete, cancel, give up), release, settle.

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

import asyncio
import collections
import contextlib
import contextvars
import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from opentelemetry.trace import Span
from tenacity import RetryCallState, wait_random_exponential

from queue_service import audit, deadline, errors, telemetry
from queue_service.config import Config
from queue_service.core_client import CoreClient
from queue_service.engine.capacity import FleetCapacity
from queue_service.engine.coalescer import Coalescer
from queue_service.model import (
    AdmitRequest,
    AdmitResult,
    AdmitState,
    CapacityGrant,
    Cause,
    ClaimedRelease,
    ClaimedReservation,
    ClaimedSettlement,
    EndedJob,
    JobEnding,
    JobRef,
    JobStatus,
    NewJob,
    Promoted,
    PromotionLimits,
    ReleaseResult,
    RunCompletion,
    RunFate,
    RunReport,
    RunReportToApply,
    SettingChange,
    Transition,
)
from queue_service.store import Store

log = logging.getLogger(__name__)

T = TypeVar("T")

_GAP_TRACKING_LIMIT = 10_000
# How long stopping waits for background clean-ups (they are durable: the sweeper finishes any
# that do not get done).
_BACKGROUND_STOP_SECONDS = 2.0
# As many as the dispatcher releases at once.
_MAX_MARKS_PER_STATEMENT = 64
# Every user in a batch waits for the whole batch's commit: a few milliseconds at most.
_MAX_COMPLETIONS_PER_STATEMENT = 16


def request_digest(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()


class QueueEngine:
    def __init__(
        self,
        store: Store,
        core: CoreClient,
        config: Config,
        *,
        hand_over: Callable[[ClaimedRelease], None],
        capacity: FleetCapacity | None = None,
    ) -> None:
        self._store = store
        self._core = core
        self.config = config
        # What this replica knows of the fleet's capacity at the core, and how to ask for a grant.
        self.capacity = capacity or FleetCapacity(wake_grant=lambda: None, probe_interval_seconds=config.core_probe_interval_seconds)
        # Takes the first release of each job this replica made PENDING (claimed in the same
        # transaction): the dispatcher starts it at once, with no claim of its own.
        self._hand_over = hand_over
        self._promotion_limits = PromotionLimits(
            config.max_active_per_user, config.release_window_seconds, config.release_lease_seconds
        )
        # When the slot a promoted job took was freed (monotonic), for the promotion-gap
        # histogram; bounded, since another replica may release the job and never tell us.
        self._slot_freed_at: collections.OrderedDict[uuid.UUID, float] = collections.OrderedDict()
        # I9 at the core (engine/core_reconciliation.py): why a first-pass release must wait while
        # the core judges another of the user's runs the queue does not count (None: release).
        self.release_gate: Callable[[ClaimedRelease], Awaitable[str | None]] | None = None
        # A completion of a run no job owns: adopts it from the core's record first (True: a job
        # owns it now; False: it never will).
        self.adopt_unknown_run: Callable[[uuid.UUID], Awaitable[bool]] | None = None
        self._backoff = wait_random_exponential(multiplier=1.0, max=config.release_backoff_max_seconds)
        self._background: set[asyncio.Task[Any]] = set()
        # Releases the core accepted while the previous ones were being marked RUNNING are marked
        # together: a burst of completions costs one statement and one commit for its releases.
        self._release_marks: Coalescer[ClaimedRelease, bool] = Coalescer(
            self._mark_released, max_batch=_MAX_MARKS_PER_STATEMENT, spawn=self.in_background, name="mark-released"
        )
        # Completions that arrive while one is being applied are applied together, in one statement
        # that holds each of their users' locks (a burst of completions: one commit for many). That
        # statement waits for a user's lock only briefly; a completion whose user's lock is busy is
        # then applied alone, within its caller's deadline, and holds up no other.
        self._completions: Coalescer[RunReportToApply, RunCompletion] = Coalescer(
            self._end_runs,
            run_alone=self._end_run_alone,
            max_batch=_MAX_COMPLETIONS_PER_STATEMENT,
            spawn=self.in_background,
            name="end-runs",
        )

    @property
    def reservation_grace_seconds(self) -> float:
        """How long a reserved run belongs to its admit before the sweeper may cancel it: longer
        than any admit can take (its waits are each bounded)."""
        config = self.config
        return 2 * config.core_deadline_seconds + 2 * config.pool_timeout_seconds + config.lock_timeout_ms / 1000 + 1

    @property
    def cancel_recheck_seconds(self) -> float:
        """How long a RUNNING job's unanswered cancel waits before the sweeper asks the core
        again: as long as a claimed release may take, so a CancelJob still waiting for its answer
        is not asked for twice."""
        return self.config.release_lease_seconds

    def in_background(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[None]:
        """Runs clean-up work detached from the current call (its deadline, its cancellation, its
        caller: what it does is the system's own, `audit`)."""
        task = deadline.spawn_detached(audit.as_system(self._logged(work, name)), name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _outliving_the_caller(self, change: Coroutine[Any, Any, T], name: str) -> T:
        """Runs a change and the follow-up its commit owes (the hand-over of a promoted job's
        release, a settlement) in a task the caller's cancellation does not reach: the caller hears
        the result while it listens, and a caller that gives up (or whose answer is lost) no longer
        takes the follow-up of a committed change with it. The task keeps the call's context: its
        deadline budget (so its waits stay bounded) and its caller (`audit`)."""
        task = asyncio.get_running_loop().create_task(change, name=name, context=contextvars.copy_context())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_forget_outlived)
        return await asyncio.shield(task)

    async def _abandon_run_before_answering(self, run_id: uuid.UUID, *, admitted_job_id: uuid.UUID | None = None) -> None:
        """Cancels a spare or failed admit's run, waiting for it as long as the caller's deadline
        allows: usually the run is gone when the caller hears the answer (I5), and if the core is
        slow the cancel goes on in the background (and the sweeper's, durably). When the admit's
        outcome is unknown, `admitted_job_id` is its job: if it did commit, its release is handed
        over instead."""
        task = self.in_background(
            self._abandon_reserved_run(run_id, admitted_job_id=admitted_job_id), name=f"abandon-run-{run_id}"
        )
        wait = deadline.bound(self.config.core_deadline_seconds)
        if wait > 0:
            await asyncio.wait({task}, timeout=wait)

    @staticmethod
    async def _logged(work: Coroutine[Any, Any, Any], name: str) -> None:
        try:
            await work
        except errors.QueueError as exc:
            log.warning("%s did not finish (%s); the sweeper retries it", name, exc.message)
        except Exception:
            log.exception("%s failed; the sweeper retries it", name)

    async def stop(self) -> None:
        if self._background:
            await asyncio.wait(set(self._background), timeout=_BACKGROUND_STOP_SECONDS)
        for task in list(self._background):
            task.cancel()

    # -- admit -------------------------------------------------------------------------------

    async def admit(self, item: AdmitRequest) -> AdmitResult:
        is_delta = item.delta_of_job_id is not None
        price = self.config.delta_price if is_delta else self.config.admit_price
        run_id, job_id = uuid.uuid4(), uuid.uuid4()

        async with self._store.statements() as db:
            # The reservation travels with the state read: no extra round trip.
            reserved, state = await db.reserve_run_and_read_admit_state(
                run_id=run_id,
                user_id=item.user_id,
                idempotency_key=item.idempotency_key,
                delta_of_job_id=item.delta_of_job_id,
                grace_seconds=self.reservation_grace_seconds,
            )
        try:
            duplicate = self._check_admit_state(state, item, price, is_delta)
            if duplicate is None and not reserved:
                raise errors.Conflict("a concurrent admit with this idempotency key won; retry with the same key")
        except errors.QueueError:
            if reserved:
                self.in_background(self._drop_reservation(run_id), name=f"drop-reservation-{run_id}")
            raise
        if duplicate is not None:
            return duplicate

        try:
            created = await self._core.create_run(
                run_id=run_id,
                user_id=item.user_id,
                document_uri=item.document_uri,
                sources=item.sources,
                hold=not is_delta,
                delta_of_run_id=state.base_run_id if is_delta else None,
                job_id=job_id,
                idempotency_key=item.idempotency_key,
                request_digest=item.request_digest,
                price=price,
            )
            if created.fate is RunFate.CANCELED:
                # The run was canceled before this admit got to it (its reservation given up).
                raise errors.Conflict("the admit took too long and its run was given up; retry with the same idempotency key")
            result = await self._admit_under_lock(item, job_id, run_id, price, is_delta)
        except asyncio.CancelledError:
            # The caller gave up: clean up without it. A locked admit already sent goes on by
            # itself (it hands its release over if it commits); the reservation decides which wins.
            self.in_background(self._abandon_reserved_run(run_id), name=f"abandon-run-{run_id}")
            raise
        except errors.OutcomeUnknown:
            # The locked admit may have committed: the reservation says which (an admit that
            # committed consumed it), and a committed admit's release is handed over then.
            await self._abandon_run_before_answering(run_id, admitted_job_id=job_id)
            raise
        except Exception:
            # The run may exist at the core (even when CreateRun's answer never came): it must not
            # outlive the failed admit (I5). The reservation makes the cancel durable.
            await self._abandon_run_before_answering(run_id)
            raise
        if result.duplicate:
            # A concurrent admit with the same key won; ours is a spare run.
            await self._abandon_run_before_answering(run_id)
        return result

    def _check_admit_state(self, state: AdmitState, item: AdmitRequest, price: int, is_delta: bool) -> AdmitResult | None:
        """Raises the admit errors the state shows; returns the earlier job for a repeated key."""
        if state.existing_job_id is not None:
            if state.existing_digest != item.request_digest:
                raise errors.IdempotencyKeyReused(
                    "this idempotency key was already used with another request; use a new key per click",
                    metadata={"jobId": str(state.existing_job_id)},
                )
            return AdmitResult(state.existing_job_id, duplicate=True)
        if is_delta:
            if state.base_status is None or state.base_user_id != item.user_id:
                raise errors.DeltaBaseNotFound(
                    f"delta base job {item.delta_of_job_id} does not exist for this user",
                    metadata={"deltaOfJobId": str(item.delta_of_job_id)},
                )
            if state.base_status is not JobStatus.SUCCEEDED:
                raise errors.DeltaBaseNotFinished(
                    f"delta base job {item.delta_of_job_id} is {state.base_status}; only a succeeded job can be re-checked",
                    metadata={"deltaOfJobId": str(item.delta_of_job_id), "baseStatus": state.base_status.upper()},
                )
            limit = self.config.max_active_deltas_per_user
            if state.running_deltas >= limit:
                raise errors.UserDeltaLimit(
                    f"the user already has {state.running_deltas} delta re-checks running (the maximum); wait for one to finish",
                    metadata={"maxActiveDeltas": str(limit), "activeDeltas": str(state.running_deltas)},
                )
        elif state.queued_count >= self.config.max_queued_per_user:
            raise errors.UserQueueFull(
                f"the user already has {state.queued_count} queued analyses (the maximum); wait for one to start",
                metadata={"maxQueued": str(self.config.max_queued_per_user), "queued": str(state.queued_count)},
            )
        if state.balance < price:
            raise errors.InsufficientCredits(
                f"insufficient credits: balance {state.balance}, required {price}",
                metadata={"balance": str(state.balance), "required": str(price)},
            )
        return None

    async def _admit_under_lock(
        self, item: AdmitRequest, job_id: uuid.UUID, run_id: uuid.UUID, price: int, is_delta: bool
    ) -> AdmitResult:
        # One statement under the user lock (the placement, the debit and the job's view), with
        # the hand-over of the release it claims: neither is stopped by a caller that gives up.
        return await self._outliving_the_caller(self._admit_job(item, job_id, run_id, price, is_delta), name=f"admit-{job_id}")

    async def _admit_job(self, item: AdmitRequest, job_id: uuid.UUID, run_id: uuid.UUID, price: int, is_delta: bool) -> AdmitResult:
        view = await self._store.admit_job(
            NewJob(
                job_id=job_id,
                user_id=item.user_id,
                run_id=run_id,
                idempotency_key=item.idempotency_key,
                request_digest=item.request_digest,
                delta_of_job_id=item.delta_of_job_id,
                price=price,
            ),
            default_max_active=self.config.max_active_per_user,
            max_queued=self.config.max_queued_per_user,
            max_running_deltas=self.config.max_active_deltas_per_user,
            release_window_seconds=self.config.release_window_seconds,
            release_lease_seconds=self.config.release_lease_seconds,
            reconcile_after_seconds=self.config.reconcile_after_seconds,
        )
        if view is None:
            # Something changed since the pre-check (nothing was written): find out what.
            async with self._store.statements() as db:
                state = await db.admit_state(
                    user_id=item.user_id, idempotency_key=item.idempotency_key, delta_of_job_id=item.delta_of_job_id
                )
            duplicate = self._check_admit_state(state, item, price, is_delta)
            if duplicate is None:
                raise errors.Conflict("the admit took too long and its run was given up; retry with the same idempotency key")
            return duplicate
        log.info("job admitted", extra={"job_id": job_id, "user_id": item.user_id, "run_id": run_id, "status": view.status})
        if view.status is JobStatus.PENDING:
            if view.waiting_for_capacity:
                self.capacity.note_waiting()
            else:
                self._hand_over(ClaimedRelease(job_id, item.user_id, run_id, attempt=1))
        return AdmitResult(job_id, duplicate=False, view=view)

    async def _drop_reservation(self, run_id: uuid.UUID) -> None:
        """The admit was refused before the core heard of the run: nothing to cancel."""
        async with self._store.statements() as db:
            await db.drop_run_reservation(run_id=run_id)

    async def _abandon_reserved_run(self, run_id: uuid.UUID, *, admitted_job_id: uuid.UUID | None = None) -> None:
        """Cancels the run of a failed admit, unless the admit committed after all. The claim
        waits for an admit still committing (it holds the reservation's row): when the admit whose
        outcome was unknown (its job `admitted_job_id`) did commit, the release its PENDING job
        claimed is handed over at once, as the admit would have."""
        async with self._store.statements() as db:
            claim = await db.claim_run_reservation(run_id=run_id, lease_seconds=self.config.release_lease_seconds)
            job = None if claim is not None or admitted_job_id is None else await db.job_by_id(job_id=admitted_job_id)
        if claim is not None:
            await self.cancel_reserved_run(claim)
        elif job is not None and job.status is JobStatus.PENDING:
            log.info("an admit whose outcome was unknown did commit; releasing its job", extra={"job_id": job.job_id, "user_id": job.user_id})
            self._hand_over(ClaimedRelease(job.job_id, job.user_id, job.run_id, attempt=1))

    async def cancel_reserved_run(self, claim: ClaimedReservation) -> bool:
        """Cancels a reserved run whose admit is gone; forgets it once the core confirms."""
        with telemetry.tracer.start_as_current_span("run.cancel_orphan") as span:
            span.set_attribute("queue.run_id", str(claim.run_id))
            report = await self._cancel_until_confirmed(claim.run_id, kind="orphan")
            if report is None:
                async with self._store.statements() as db:
                    await db.schedule_run_reservation_retry(run_id=claim.run_id, attempt=claim.attempt, backoff_seconds=self.backoff_seconds(claim.attempt)
                    )
                return False
            async with self._store.statements() as db:
                await db.drop_run_reservation(run_id=claim.run_id)
            telemetry.metrics.run_settlements.add(1, {"kind": "orphan", "result": "settled"})
            log.info("orphaned run canceled", extra={"run_id": claim.run_id, "status": report.fate.value})
            return True

    async def _cancel_until_confirmed(self, run_id: uuid.UUID, *, kind: str) -> RunReport | None:
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

    # -- promotion ---------------------------------------------------------------------------

    async def promote(self, user_id: str, *, cause: Cause) -> tuple[Promoted, ...]:
        """Fills every free slot of the user from the queue, oldest first."""
        return await self._outliving_the_caller(self._promote(user_id, cause), name=f"promote-{user_id}")

    async def _promote(self, user_id: str, cause: Cause) -> tuple[Promoted, ...]:
        promoted = await self._store.promote(user_id, self._promotion_limits)
        self._after_promotion(user_id, promoted, cause)
        return promoted

    def _after_promotion(self, user_id: str, promoted: tuple[Promoted, ...], cause: Cause) -> None:
        """Records the promotions a committed transaction made and wakes the dispatcher."""
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
                self._hand_over(job.first_release)
        if waiting:
            self.capacity.note_waiting()

    def _note_slot_freed(self, promoted: tuple[Promoted, ...]) -> None:
        now = time.monotonic()
        for job in promoted:
            self._slot_freed_at[job.job_id] = now
        while len(self._slot_freed_at) > _GAP_TRACKING_LIMIT:
            self._slot_freed_at.popitem(last=False)

    # -- ending a job ------------------------------------------------------------------------

    async def end_job(self, job_id: uuid.UUID, user_id: str, transition: Transition) -> EndedJob | None:
        """Applies the transition, refunds when it says so, and (when the run is settled) promotes
        the user's next job, in one statement that also returns the job's view; None when the job
        was not in a status the transition starts from (fenced). An unsettled run keeps the slot:
        `settle_run` frees it."""
        return await self._outliving_the_caller(self._end_job(job_id, user_id, transition), name=f"end-job-{job_id}")

    async def _end_job(self, job_id: uuid.UUID, user_id: str, transition: Transition) -> EndedJob | None:
        with self._ending_span(transition) as span:
            span.set_attribute("queue.job_id", str(job_id))
            # One statement under the user lock: the ending, its refund, the promotions and the view.
            outcome = await self._store.end_job(job_id, user_id, transition, self._promotion_limits)
            if outcome is None:
                return None
            span.set_attribute("queue.refunded", outcome.refunded)
        return self._after_ending(outcome, transition)

    @contextlib.contextmanager
    def _ending_span(self, transition: Transition) -> Iterator[Span]:
        with telemetry.tracer.start_as_current_span("complete") as span:
            span.set_attribute("queue.status", str(transition.to))
            span.set_attribute("queue.cause", str(transition.cause))
            span.set_attribute("queue.run_unsettled", transition.run_unsettled)
            yield span

    def _after_ending(self, outcome: JobEnding, transition: Transition) -> EndedJob:
        """Records a committed ending and starts what follows it: the run's settlement when it is
        unsettled, else the releases of the jobs promoted into the freed slot."""
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
            self.in_background(self._settle_now(ended), name=f"settle-run-{ended.run_id}")
        else:
            self._after_promotion(ended.user_id, promoted, cause)
            # The run is settled: its capacity at the core is free for the next in line.
            self.capacity.freed()
        return EndedJob(ended, outcome.view)

    async def complete_run(self, run_id: uuid.UUID, *, succeeded: bool, refund: bool, message: str) -> EndedJob:
        """Ends the run's job as the core reports, in one statement that finds the job under its
        user's lock; the job's view as this call left it."""
        transition = Transition.completed(succeeded=succeeded, refund=refund, message=message)
        report = RunReportToApply(run_id, transition, audit.actor_for(transition.cause))
        # The completion and what it owes once committed (the promoted job's hand-over) go on
        # when the core gives up on this call: the core's retry finds the job ended.
        try:
            return await self._outliving_the_caller(self._complete(report), name=f"complete-run-{run_id}")
        except errors.RunNotFound:
            if self.adopt_unknown_run is None:
                raise
        # No job owns the run (a failover lost it, say): adopt it from the core's record, then
        # apply; while that cannot be decided, the core retries (RUN_NOT_YET_ADMITTED).
        try:
            adopted = await self.adopt_unknown_run(run_id)
        except (errors.CoreUnavailable, errors.DatabaseUnavailable, errors.LockTimeout, errors.OutcomeUnknown) as exc:
            raise errors.RunNotYetAdmitted(
                f"no job owns run {run_id} yet and adopting it could not be decided now ({exc.reason}); retry the completion",
                metadata={"runId": str(run_id)},
            ) from exc
        if not adopted:
            raise errors.RunNotFound(f"no job owns run {run_id}", metadata={"runId": str(run_id)})
        return await self._outliving_the_caller(self._complete(report), name=f"complete-run-{run_id}")

    async def _complete(self, report: RunReportToApply) -> EndedJob:
        run_id, transition = report.run_id, report.transition
        with self._ending_span(transition) as span:
            span.set_attribute("queue.run_id", str(run_id))
            found = await self._completions.submit(report)
            if found.ending is not None:
                span.set_attribute("queue.job_id", str(found.ending.ref.job_id))
                span.set_attribute("queue.refunded", found.ending.refunded)
        if found.ending is not None:
            return self._after_ending(found.ending, transition)
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
        if job.run_unsettled:
            # The job ended while its run's fate was unknown; the core's callback settles it.
            await self.settle_run(job.job_id, job.user_id, cause=Cause.COMPLETION)
        return EndedJob(job, found.view)

    async def cancel(self, job_id: uuid.UUID, user_id: str) -> None:
        """Cancels a job; the core's answer decides how an active job ends (see docs/design.md).

        A QUEUED job ends at once (its held run is canceled afterwards, durably). For a PENDING or
        RUNNING job the user's intent is recorded first, then the core is asked: CANCELED (or an
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
            if job.status is JobStatus.QUEUED:
                if await self.end_job(job_id, user_id, Transition.canceled_while_queued()):
                    return
                continue  # promoted meanwhile: cancel it as an active job
            if not await self._record_cancel_request(job):
                continue  # ended meanwhile: the next pass reports how
            report = await self._core.cancel_run(job.run_id)
            if not report.fate.settled:
                raise errors.CoreUnavailable(
                    f"the core did not cancel run {job.run_id} (it is {report.fate.value}); retry",
                    metadata={"coreCode": "OK", "runState": report.fate.value.upper()},
                )
            await self.end_job(job_id, user_id, Transition.canceled(report))
            # Ended by us or meanwhile (a completion, or a release that met the canceled run):
            # the next pass reports what it is now, and applies the intent to a FAILED job.
        raise errors.Conflict(f"job {job_id} kept changing during the cancel; retry", metadata={"jobId": str(job_id)})

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

    async def give_up_release(self, job_id: uuid.UUID, user_id: str, reason: str, *, attempts: int) -> bool:
        """Fails and refunds a pending job whose release did not succeed in its window (fenced by
        its attempt counter); see `Transition.given_up`."""
        ended = await self.end_job(job_id, user_id, Transition.given_up(reason, attempts=attempts))
        if ended is not None:
            telemetry.metrics.release_give_ups.add(1)
        return ended is not None

    # -- settling runs -----------------------------------------------------------------------

    async def settle_run(self, job_id: uuid.UUID, user_id: str, *, cause: Cause) -> None:
        """The core confirmed the ended job's run settled: free its slot and promote."""
        await self._outliving_the_caller(self._settle_run(job_id, user_id, cause), name=f"settle-run-{job_id}")

    async def _settle_run(self, job_id: uuid.UUID, user_id: str, cause: Cause) -> None:
        settlement = await self._store.settle_job_run(job_id, user_id, self._promotion_limits)
        promoted = settlement.promoted
        if settlement.settled:
            self._note_slot_freed(promoted)
            telemetry.metrics.run_settlements.add(1, {"kind": "job", "result": "settled"})
            log.info("run settled", extra={"job_id": job_id, "user_id": user_id, "cause": cause})
            self.capacity.freed()
        # Promotions made anyway (a slot freed by someone else) are released too.
        self._after_promotion(user_id, promoted, cause)

    async def _settle_now(self, job: JobRef) -> None:
        """One immediate attempt after a job ended unsettled; the sweeper retries with backoff."""
        if await self._cancel_until_confirmed(job.run_id, kind="job") is not None:
            await self.settle_run(job.job_id, job.user_id, cause=Cause.RUN_SETTLED)

    async def attempt_run_settlement(self, claim: ClaimedSettlement) -> bool:
        """Asks the core to cancel a claimed unsettled run; settles the job when it confirms."""
        with telemetry.tracer.start_as_current_span("run.settle") as span:
            span.set_attribute("queue.job_id", str(claim.job_id))
            span.set_attribute("queue.run.settle.attempt", claim.attempt)
            if await self._cancel_until_confirmed(claim.run_id, kind="job") is None:
                async with self._store.statements() as db:
                    await db.schedule_run_settle_retry(
                        job_id=claim.job_id, attempt=claim.attempt, backoff_seconds=self.backoff_seconds(claim.attempt)
                    )
                return False
            await self.settle_run(claim.job_id, claim.user_id, cause=Cause.RUN_SETTLED)
            return True

    async def reconcile(self, job_id: uuid.UUID, user_id: str, run_id: uuid.UUID, *, cancel_requested: bool = False) -> bool:
        """Asks the core about a RUNNING job whose completion never arrived, or cancels the run of
        one whose user's cancel went unanswered; returns whether the job ended."""
        if cancel_requested:
            report = await self._core.cancel_run(run_id)
            if not report.fate.settled:
                return False
            log.info("cancel retried for a job whose cancel went unanswered", extra={"job_id": job_id, "run_id": run_id, "status": report.fate.value})
            return await self.end_job(job_id, user_id, Transition.canceled(report)) is not None
        report = await self._core.get_run(run_id)
        if report.fate is RunFate.HELD:
            # A release we saw confirmed did not take (the core lost it): release it again.
            report = await self._core.release_run(run_id)
        if not report.fate.settled:
            return False
        log.info("reconciling a run whose completion never arrived", extra={"job_id": job_id, "run_id": run_id, "status": report.fate.value})
        return await self.end_job(job_id, user_id, Transition.reconciled(report)) is not None

    # -- release -----------------------------------------------------------------------------

    def backoff_seconds(self, attempt: int) -> float:
        """Capped exponential backoff with full jitter (tenacity's wait strategy)."""
        # Wait strategies read only attempt_number; no Retrying exists here to pass as retry_object.
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = max(1, attempt)
        return float(self._backoff(state))

    async def release_now(self, job_id: uuid.UUID) -> None:
        """Releases a PENDING job at once (tooling): claims it like the dispatcher does. A job
        another replica is releasing right now, or one waiting for the core's capacity (only a
        grant releases it, in its turn), is left as it is."""
        async with self._store.statements() as db:
            claim = await db.claim_release_of_job(job_id=job_id, lease_seconds=self.config.release_lease_seconds)
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
            else:
                try:
                    held_back = await self.release_gate(claim) if self.release_gate is not None else None
                    if held_back is not None:
                        result = await self._retry_release_later(claim, held_back)
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

    async def _record_release(self, claim: ClaimedRelease, report: RunReport | None, error: str) -> ReleaseResult:
        if report is not None and report.fate is RunFate.JUDGING:
            if claim.probe:
                # The core took a release above the limit it had shown us: it has room again.
                async with self._store.statements() as db:
                    await db.capacity_probe_taken()
            marked = await self._release_marks.submit(claim)
            freed_at = self._slot_freed_at.pop(claim.job_id, None)
            if freed_at is not None:
                telemetry.metrics.promotion_gap.record(time.monotonic() - freed_at)
            if marked:
                log.info("job released", extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "status": JobStatus.RUNNING, "attempt": claim.attempt})
            return ReleaseResult.RELEASED
        if report is not None and report.fate.settled:
            # The run had ended already (canceled, finished after an earlier release whose answer
            # was lost) or the core does not know it: the core's answer decides how the job ends.
            await self.end_job(claim.job_id, claim.user_id, Transition.release_answered(report, attempt=claim.attempt))
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
            ended = await self.end_job(claim.job_id, claim.user_id, Transition.canceled_instead_of_released(report, attempt=claim.attempt))
            if ended is not None:
                log.info("canceled instead of released", extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "status": ended.ref.status})
            return ReleaseResult.CANCELED
        fate = "no answer" if report is None else f"the run is {report.fate.value}"
        return await self._retry_release_later(claim, error or f"core CancelRun: {fate}")

    async def _retry_release_later(self, claim: ClaimedRelease, error: str) -> ReleaseResult:
        backoff = self.backoff_seconds(claim.attempt)
        async with self._store.statements() as db:
            retry = await db.schedule_release_retry(job_id=claim.job_id, attempt=claim.attempt, backoff_seconds=backoff, last_error=error)
        if retry is not None and retry.window_over:
            window = self.config.release_window_seconds
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
                job_id=claim.job_id, attempt=claim.attempt, probe_interval_seconds=self.capacity.probe_interval_seconds
            )
        if learned is not False:
            self.capacity.learned(True)
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
                lease_seconds=self.config.release_lease_seconds,
                release_window_seconds=self.config.release_window_seconds,
                probe_interval_seconds=self.capacity.probe_interval_seconds,
                max_grants=max_grants,
            )
            span.set_attribute("queue.capacity.granted", len(grant.claims))
            span.set_attribute("queue.capacity.limited", grant.limited)
        self.capacity.learned(grant.limited)
        telemetry.metrics.capacity["in_use"] = grant.in_use
        if grant.limit is None:
            telemetry.metrics.capacity.pop("limit", None)
        else:
            telemetry.metrics.capacity["limit"] = grant.limit
        for claim, waited in grant.claims:
            telemetry.metrics.capacity_wait.record(waited)
            log.info(
                "capacity granted",
                extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "attempt": claim.attempt},
            )
        return grant

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
        self.capacity.learned(True)
        self.capacity.freed()
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
            extra={"kind": change.setting, "user_id": user_id, "amount": change.new_value, "actor": change.actor, "reason": f"was {change.old_value}"},
        )
        await self.promote(user_id, cause=Cause.TOOLING)
        return change

    async def setting_changes(self, *, before_change_id: int | None, limit: int) -> list[SettingChange]:
        async with self._store.statements() as db:
            return await db.setting_changes(before_change_id=before_change_id, limit=limit)

    async def _mark_released(self, claims: list[ClaimedRelease]) -> dict[ClaimedRelease, bool]:
        with _counting_batch("mark_released", len(claims)):
            async with self._store.statements() as db:
                marked = await db.mark_released(claims, reconcile_after_seconds=self.config.reconcile_after_seconds)
        return {claim: claim.job_id in marked for claim in claims}

    async def _end_runs(self, reports: list[RunReportToApply]) -> dict[RunReportToApply, RunCompletion]:
        """The coalesced statement, a lone completion's too: it waits for no user's lock long."""
        with _counting_batch("end_runs", len(reports)):
            completions = await self._store.end_runs(reports, self._promotion_limits)
        return dict(zip(reports, completions, strict=True))

    async def _end_run_alone(self, report: RunReportToApply) -> RunCompletion:
        """A completion on its own, waiting for its user's lock as long as its call allows."""
        with _counting_batch("end_runs", 1):
            return await self._store.end_run(report, self._promotion_limits)


def _forget_outlived(task: asyncio.Task[Any]) -> None:
    """Retrieves the outcome of a change whose caller stopped listening (nobody else will); its
    errors reached the caller, or were the caller's to hear and are logged by the store's retry
    paths (the sweeper), so only unexpected ones are logged here."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, errors.QueueError):
        log.debug("%s failed after its caller stopped listening: %r", task.get_name(), exc)


@contextlib.contextmanager
def _counting_batch(statement: str, items: int) -> Iterator[None]:
    """Counts a coalesced statement that applied its items, or one of several that failed."""
    try:
        yield
    except Exception:
        if items > 1:
            telemetry.metrics.statement_batch_failures.add(1, {"statement": statement})
        raise
    telemetry.metrics.statement_batch_size.record(items, {"statement": statement})


def _already_finished(job_id: uuid.UUID, status: JobStatus) -> errors.QueueError:
    return errors.JobAlreadyFinished(
        f"job {job_id} already {status}; only queued, pending or running jobs can be canceled",
        metadata={"jobId": str(job_id), "status": status.upper()},
    )
