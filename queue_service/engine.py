"""The queue engine: admit, promote, end (complete, cancel, give up), release.

Every change that can free or take a user's slot runs under `with_user_queue_lock`; every state
change is fenced (`repository.finish_job` names the statuses it expects), so duplicates from
retries, racing replicas or old code versions are harmless no-ops.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool
from tenacity import RetryCallState, wait_random_exponential

from queue_service import errors, repository as repo, telemetry
from queue_service.config import Config
from queue_service.core_client import CoreClient, ReleaseResult
from queue_service.db import connection
from queue_service.locks import with_user_queue_lock
from queue_service.repository import ClaimedRelease, NewJob

log = logging.getLogger(__name__)

ACTIVE = ["pending", "running"]
_GAP_TRACKING_LIMIT = 10_000
CANCELABLE = ["queued", "pending", "running"]


@dataclasses.dataclass(frozen=True)
class AdmitInput:
    user_id: str
    idempotency_key: str
    document_uri: str
    sources: tuple[tuple[str, str], ...]
    delta_of_job_id: uuid.UUID | None
    request_digest: bytes


@dataclasses.dataclass(frozen=True)
class EndedJob:
    ref: repo.JobRef
    # The job's API view, read in the ending transaction itself when asked for.
    view: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class AdmitResult:
    job_id: uuid.UUID
    status: str
    duplicate: bool
    # The new job's API view, read in the admit transaction itself (None for a duplicate).
    view: dict[str, Any] | None = None


def request_digest(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()


class QueueEngine:
    def __init__(self, pool: AsyncConnectionPool, core: CoreClient, config: Config) -> None:
        self.pool = pool
        self.core = core
        self.config = config
        # Called after a commit that made jobs PENDING, so this replica releases them at once.
        self.on_pending: Callable[[], None] = lambda: None
        # When the slot a promoted job took was freed (monotonic), for the promotion-gap
        # histogram; bounded, since another replica may release the job and never tell us.
        self._slot_freed_at: collections.OrderedDict[uuid.UUID, float] = collections.OrderedDict()
        self._backoff = wait_random_exponential(multiplier=1.0, max=config.release_backoff_max_seconds)

    # -- admit -------------------------------------------------------------------------------

    async def admit(self, item: AdmitInput) -> AdmitResult:
        is_delta = item.delta_of_job_id is not None
        price = self.config.delta_price if is_delta else self.config.admit_price

        async with connection(self.pool) as conn:
            state = await repo.admit_state(
                conn, user_id=item.user_id, idempotency_key=item.idempotency_key, delta_of_job_id=item.delta_of_job_id
            )
        duplicate = self._check_admit_state(state, item, price, is_delta)
        if duplicate is not None:
            return duplicate

        run_id = uuid.uuid4()
        await self.core.create_run(
            run_id=run_id,
            user_id=item.user_id,
            document_uri=item.document_uri,
            sources=item.sources,
            hold=not is_delta,
            delta_of_run_id=state.base_run_id if is_delta else None,
        )
        try:
            return await self._admit_under_lock(item, run_id, price, is_delta)
        except BaseException:
            # The held run must not outlive a failed admit (I5); the core also expires it.
            await self._cancel_run_quietly(run_id)
            raise

    def _check_admit_state(self, state: repo.AdmitState, item: AdmitInput, price: int, is_delta: bool) -> AdmitResult | None:
        """Raises the admit errors the state shows; returns the earlier job for a repeated key."""
        if state.existing_job_id is not None:
            if state.existing_digest != item.request_digest:
                raise errors.IdempotencyKeyReused(
                    "this idempotency key was already used with another request; use a new key per click",
                    metadata={"jobId": str(state.existing_job_id)},
                )
            return AdmitResult(state.existing_job_id, "", duplicate=True)
        if is_delta:
            if state.base_status is None or state.base_user_id != item.user_id:
                raise errors.DeltaBaseNotFound(
                    f"delta base job {item.delta_of_job_id} does not exist for this user",
                    metadata={"deltaOfJobId": str(item.delta_of_job_id)},
                )
            if state.base_status != "succeeded":
                raise errors.DeltaBaseNotFinished(
                    f"delta base job {item.delta_of_job_id} is {state.base_status}; only a succeeded job can be re-checked",
                    metadata={"deltaOfJobId": str(item.delta_of_job_id), "baseStatus": state.base_status.upper()},
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
        self, item: AdmitInput, run_id: uuid.UUID, price: int, is_delta: bool
    ) -> AdmitResult:
        job_id = uuid.uuid4()
        async with with_user_queue_lock(self.pool, item.user_id) as conn:
            status = await repo.insert_admitted_job(
                conn,
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
                release_window_seconds=self.config.release_window_seconds,
                reconcile_after_seconds=self.config.reconcile_after_seconds,
            )
            if status is None:
                # Something changed since the pre-check: find out what, still under the lock.
                state = await repo.admit_state(
                    conn, user_id=item.user_id, idempotency_key=item.idempotency_key, delta_of_job_id=item.delta_of_job_id
                )
                duplicate = self._check_admit_state(state, item, price, is_delta)
                if duplicate is None:
                    raise errors.Conflict("the admit could not be placed; retry with the same idempotency key")
                # A concurrent admit with the same key won; ours is the spare held run.
                await self._cancel_run_quietly(run_id)
                return duplicate
            view = await repo.send_job_views_by_ids(conn, job_ids=[job_id])
        log.info("job admitted", extra={"job_id": job_id, "user_id": item.user_id, "run_id": run_id, "status": status})
        if status == "pending":
            self.on_pending()
        rows = await view.fetchall()
        return AdmitResult(job_id, status, duplicate=False, view=rows[0] if rows else None)

    async def _cancel_run_quietly(self, run_id: uuid.UUID) -> None:
        try:
            await asyncio.shield(self.core.cancel_run(run_id))
        except Exception:
            log.warning("could not cancel held run; the core expires it", extra={"run_id": run_id})

    # -- promotion ---------------------------------------------------------------------------

    async def _promote_locked(self, conn, user_id: str, trigger: str) -> list[repo.Promoted]:  # type: ignore[no-untyped-def]
        """Fills every free slot of the user from the queue, oldest first (inside the lock)."""
        promoted = []
        with telemetry.tracer.start_as_current_span("promote") as span:
            while True:
                job = await repo.promote_next_queued_job(
                    conn,
                    user_id=user_id,
                    default_max_active=self.config.max_active_per_user,
                    release_window_seconds=self.config.release_window_seconds,
                )
                if job is not None:
                    promoted.append(job)
                if job is None or not job.more_slots_free:
                    break
            span.set_attribute("queue.trigger", trigger)
            span.set_attribute("queue.promoted", len(promoted))
        if promoted:
            telemetry.metrics.promotions.add(len(promoted), {"trigger": trigger})
        return promoted

    async def promote(self, user_id: str, *, trigger: str) -> list[repo.Promoted]:
        async with with_user_queue_lock(self.pool, user_id) as conn:
            promoted = await self._promote_locked(conn, user_id, trigger)
        self._after_promotion(user_id, promoted, trigger)
        return promoted

    def _after_promotion(self, user_id: str, promoted: list[repo.Promoted], trigger: str) -> None:
        for job in promoted:
            log.info(
                "job promoted",
                extra={"job_id": job.job_id, "user_id": user_id, "run_id": job.run_id, "status": "pending", "reason": trigger},
            )
        if promoted:
            self.on_pending()

    def _note_slot_freed(self, promoted: list[repo.Promoted]) -> None:
        now = time.monotonic()
        for job in promoted:
            self._slot_freed_at[job.job_id] = now
        while len(self._slot_freed_at) > _GAP_TRACKING_LIMIT:
            self._slot_freed_at.popitem(last=False)

    # -- ending a job ------------------------------------------------------------------------

    async def end_job(
        self,
        *,
        job_id: uuid.UUID,
        user_id: str,
        status: str,
        from_statuses: list[str],
        last_error: str,
        refund: bool,
        trigger: str,
        expected_attempts: int | None = None,
        read_view: bool = False,
    ) -> EndedJob | None:
        """Ends the job, refunds when asked, and promotes the user's next job, in one transaction.

        With `read_view` the job's view is read in that transaction too (it travels with the
        COMMIT), so the caller can answer without another query."""
        view = None
        with telemetry.tracer.start_as_current_span("complete") as span:
            span.set_attribute("queue.job_id", str(job_id))
            span.set_attribute("queue.status", status)
            async with with_user_queue_lock(self.pool, user_id) as conn:
                ended = await repo.finish_job(
                    conn,
                    job_id=job_id,
                    status=status,
                    from_statuses=from_statuses,
                    last_error=last_error,
                    expected_attempts=expected_attempts,
                )
                if ended is None:
                    return None
                refunded = await repo.refund_job_charge(conn, job_id=job_id) if refund else 0
                promoted = await self._promote_locked(conn, user_id, trigger)
                if read_view:
                    view = await repo.send_job_views_by_ids(conn, job_ids=[job_id])
            span.set_attribute("queue.refunded", refunded)
        self._note_slot_freed(promoted)
        telemetry.metrics.completions.add(1, {"status": status})
        if refunded:
            telemetry.metrics.refunds.add(refunded, {"cause": trigger})
        log.info(
            "job ended",
            extra={"job_id": job_id, "user_id": user_id, "run_id": ended.run_id, "status": status, "reason": trigger},
        )
        self._after_promotion(user_id, promoted, trigger)
        rows = await view.fetchall() if view is not None else []
        return EndedJob(ended, rows[0] if rows else None)

    async def complete_run(
        self, run_id: uuid.UUID, *, succeeded: bool, refund: bool, message: str
    ) -> tuple[uuid.UUID, dict[str, Any] | None]:
        """Ends the run's job; returns its id and, when this call ended it, its view."""
        async with connection(self.pool) as conn:
            job = await repo.job_by_run_id(conn, run_id=run_id)
        if job is None:
            raise errors.RunNotFound(f"no job owns run {run_id}", metadata={"runId": str(run_id)})
        if job.status == "queued":
            raise errors.RunNotReleased(
                f"the job of run {run_id} is still queued; a held run cannot complete", metadata={"runId": str(run_id)}
            )
        if job.status in ACTIVE:
            ended = await self.end_job(
                job_id=job.job_id,
                user_id=job.user_id,
                status="succeeded" if succeeded else "failed",
                from_statuses=ACTIVE,
                last_error="" if succeeded else (message or "the core reported a failure"),
                refund=refund,
                trigger="completion",
                read_view=True,
            )
            if ended is not None:
                return job.job_id, ended.view
        return job.job_id, None

    async def cancel(self, job_id: uuid.UUID, user_id: str) -> uuid.UUID:
        async with connection(self.pool) as conn:
            row = await repo.job_by_id(conn, job_id=job_id)
        if row is None or row["user_id"] != user_id:
            raise errors.JobNotFound(f"job {job_id} does not exist for this user", metadata={"jobId": str(job_id)})
        if row["status"] == "canceled":
            return job_id
        if row["status"] in ("succeeded", "failed"):
            raise errors.JobAlreadyFinished(
                f"job {job_id} already {row['status']}; only queued, pending or running jobs can be canceled",
                metadata={"jobId": str(job_id), "status": row["status"].upper()},
            )
        if row["status"] == "queued":
            # The held run is harmless (the core expires it); a core outage must not block this.
            await self._cancel_run_quietly(row["run_id"])
        else:
            await self.core.cancel_run(row["run_id"])
        ended = await self.end_job(
            job_id=job_id,
            user_id=user_id,
            status="canceled",
            from_statuses=CANCELABLE,
            last_error="canceled by the user",
            refund=True,
            trigger="cancel",
        )
        if ended is None:
            # It ended meanwhile (completed, or canceled by a concurrent call): report what it is.
            async with connection(self.pool) as conn:
                row = await repo.job_by_id(conn, job_id=job_id)
            if row is not None and row["status"] in ("succeeded", "failed"):
                raise errors.JobAlreadyFinished(f"job {job_id} already {row['status']}", metadata={"jobId": str(job_id)})
        return job_id

    async def give_up_release(self, job_id: uuid.UUID, user_id: str, reason: str, *, expected_attempts: int) -> bool:
        """Fails a pending job whose release cannot succeed (fenced by its attempt counter)."""
        ended = await self.end_job(
            job_id=job_id,
            user_id=user_id,
            status="failed",
            from_statuses=["pending"],
            last_error=reason,
            refund=True,
            trigger="release_give_up",
            expected_attempts=expected_attempts,
        )
        if ended is not None:
            telemetry.metrics.release_give_ups.add(1)
        return ended is not None

    # -- release -----------------------------------------------------------------------------

    def backoff_seconds(self, attempt: int) -> float:
        """Capped exponential backoff with full jitter (tenacity's wait strategy)."""
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = max(1, attempt)
        return float(self._backoff(state))

    async def release(self, claim: ClaimedRelease) -> str:
        """Attempts one claimed release and records the result; returns what happened."""
        with telemetry.tracer.start_as_current_span("release") as span:
            span.set_attribute("queue.job_id", str(claim.job_id))
            span.set_attribute("queue.release.attempt", claim.attempt)
            outcome = await self.core.release_run(claim.run_id)
            telemetry.metrics.release_attempts.add(1, {"result": outcome.result.value})
            if outcome.result is ReleaseResult.RELEASED:
                async with connection(self.pool) as conn:
                    marked = await repo.mark_released(
                        conn, job_id=claim.job_id, attempt=claim.attempt, reconcile_after_seconds=self.config.reconcile_after_seconds
                    )
                freed_at = self._slot_freed_at.pop(claim.job_id, None)
                if freed_at is not None:
                    telemetry.metrics.promotion_gap.record(time.monotonic() - freed_at)
                if marked:
                    log.info("job released", extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "status": "running", "attempt": claim.attempt})
                span.set_attribute("queue.release.result", "released")
                return "released"
            if outcome.result is ReleaseResult.PERMANENT_FAILURE:
                await self.give_up_release(
                    claim.job_id, claim.user_id, f"release refused by the core: {outcome.error}", expected_attempts=claim.attempt
                )
                span.set_attribute("queue.release.result", "refused")
                return "refused"
            backoff = self.backoff_seconds(claim.attempt)
            span.set_attribute("queue.release.backoff_s", backoff)
            async with connection(self.pool) as conn:
                retry = await repo.schedule_release_retry(
                    conn, job_id=claim.job_id, attempt=claim.attempt, backoff_seconds=backoff, last_error=outcome.error
                )
            if retry is not None and retry.window_over:
                window = self.config.release_window_seconds
                await self.give_up_release(
                    claim.job_id,
                    claim.user_id,
                    f"release gave up after {claim.attempt} attempts over {window:g}s: {outcome.error}",
                    expected_attempts=claim.attempt,
                )
                span.set_attribute("queue.release.result", "gave_up")
                return "gave_up"
            log.warning(
                "release failed; retrying",
                extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "attempt": claim.attempt, "reason": outcome.error},
            )
            span.set_attribute("queue.release.result", "retry")
            return "retry"
