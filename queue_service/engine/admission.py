"""Admission: an admit from its pre-check to its answer, and the reserved run it may leave.

An admit reserves its run id and reads the user's admit state in one statement (the pre-check:
a repeated key, the base of a delta, the user's limits, the credits), creates the held run at the
core, then places, debits and answers in one statement under the user's lock (the locked admit,
`Store.admit_job`), handing over the release of a job it made PENDING. A run whose admit failed,
gave up or whose outcome is unknown is abandoned: canceled until the core confirms (I5), unless
the admit did commit after all; the reservation makes that durable (the sweeper finishes it,
`Recovery.cancel_reserved_run`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import uuid

from queue_service import deadline, errors, telemetry
from queue_service.config import Config, settings_of
from queue_service.engine.parts import SharedParts
from queue_service.engine.ports import ReservedRuns
from queue_service.model import (
    AdmitLimits,
    AdmitRequest,
    AdmitResult,
    AdmitState,
    ClaimedRelease,
    JobStatus,
    NewJob,
    RunFate,
)

log = logging.getLogger(__name__)

# How often an admit that found its key reserved by a concurrent admit reads again whether that
# admit's outcome is in: soon at first (a CreateRun and the locked admit take tens of
# milliseconds), then less often, within half of the caller's deadline.
_KEY_POLL_FIRST_SECONDS = 0.02
_KEY_POLL_MAX_SECONDS = 0.25


def request_digest(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionSettings:
    """The settings the admission reads (QUEUE_* of the same names)."""

    admit_price: int
    delta_price: int
    max_active_per_user: int
    max_queued_per_user: int
    max_active_deltas_per_user: int
    max_free_admits_per_user_per_hour: int
    release_window_seconds: float
    release_lease_seconds: float
    reconcile_after_seconds: float
    # What bounds an admit's waits (the reserved run's grace).
    core_deadline_seconds: float
    pool_timeout_seconds: float
    lock_timeout_ms: int

    @classmethod
    def from_config(cls, config: Config) -> AdmissionSettings:
        return settings_of(cls, config)


class Admission:
    def __init__(self, recovery: ReservedRuns, parts: SharedParts, settings: AdmissionSettings) -> None:
        self._recovery = recovery
        self._store = parts.store
        self._core = parts.core
        self._settings = settings
        # Starts the first release of a job the locked admit made PENDING (claimed in it).
        self._starter = parts.starter
        self._capacity = parts.capacity
        self._tasks = parts.tasks
        self._owed_releases = parts.owed_releases
        self._admit_limits = AdmitLimits(
            default_max_active=settings.max_active_per_user,
            max_queued=settings.max_queued_per_user,
            max_running_deltas=settings.max_active_deltas_per_user,
            release_window_seconds=settings.release_window_seconds,
            release_lease_seconds=settings.release_lease_seconds,
            reconcile_after_seconds=settings.reconcile_after_seconds,
        )

    @property
    def reservation_grace_seconds(self) -> float:
        """How long a reserved run belongs to its admit before the sweeper may cancel it: longer
        than any admit can take (its waits are each bounded)."""
        settings = self._settings
        return 2 * settings.core_deadline_seconds + 2 * settings.pool_timeout_seconds + settings.lock_timeout_ms / 1000 + 1

    async def admit(self, item: AdmitRequest) -> AdmitResult:
        try:
            return await self._admit(item)
        except errors.CoreUnavailable:
            # Counted for the core's health on the Overview: admits the core's silence turned away.
            self._core.tally.recent.admit_unavailable()
            raise

    async def _admit(self, item: AdmitRequest) -> AdmitResult:
        is_delta = item.delta_of_job_id is not None
        price = self._settings.delta_price if is_delta else self._settings.admit_price
        run_id, job_id = uuid.uuid4(), uuid.uuid4()
        state, duplicate = await self._reserve_run(item, run_id, price, is_delta)
        if duplicate is not None:
            return duplicate

        try:
            await self._create_held_run(item, run_id, job_id, price, is_delta, state)
            delta_held = is_delta and state.capacity_limited
            result = await self._admit_under_lock(item, job_id, run_id, price, is_delta, delta_held)
        except asyncio.CancelledError:
            # The caller gave up: clean up without it. A locked admit already sent goes on by
            # itself (it hands its release over if it commits); the reservation decides which wins.
            self._tasks.in_background(self._abandon_reserved_run(run_id), name=f"abandon-run-{run_id}")
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

    async def _reserve_run(
        self, item: AdmitRequest, run_id: uuid.UUID, price: int, is_delta: bool
    ) -> tuple[AdmitState, AdmitResult | None]:
        """Reserves the run and reads the admit's state in one statement, then checks the state:
        raises the admit's errors (the reservation dropped in the background), or returns the
        earlier job of a repeated key. While another admit of the key is under way (it holds the
        key's live reservation and alone calls the core), waits for its outcome (`_await_key`)."""
        waited = False
        poll = _KEY_POLL_FIRST_SECONDS
        wait_until = asyncio.get_running_loop().time() + deadline.bound(self.reservation_grace_seconds, share=0.5)
        while True:
            async with self._store.statements() as db:
                # The reservation travels with the state read: no extra round trip.
                reserved, state = await db.reserve_run_and_read_admit_state(
                    run_id=run_id,
                    user_id=item.user_id,
                    idempotency_key=item.idempotency_key,
                    delta_of_job_id=item.delta_of_job_id,
                    grace_seconds=self.reservation_grace_seconds,
                    max_free_admits=self._settings.max_free_admits_per_user_per_hour,
                )
                if reserved and waited:
                    # The key came free while this admit waited: read again, in a snapshot taken
                    # after the reservation, whether it came free because its admit committed.
                    state = await db.admit_state(
                        user_id=item.user_id,
                        idempotency_key=item.idempotency_key,
                        delta_of_job_id=item.delta_of_job_id,
                        max_free_admits=self._settings.max_free_admits_per_user_per_hour,
                    )
            if reserved or state.existing_job_id is not None:
                break
            # Another admit of this key holds its live reservation: it alone creates the run at the
            # core; its outcome (the job, or the key given up) is read again shortly.
            if not waited:
                waited = True
                telemetry.metrics.admit_key_waits.add(1)
            left = wait_until - asyncio.get_running_loop().time()
            if left <= 0:
                raise errors.Conflict("a concurrent admit with this idempotency key is still under way; retry with the same key")
            await asyncio.sleep(min(poll, left))
            poll = min(poll * 2, _KEY_POLL_MAX_SECONDS)
        try:
            duplicate = self._check_admit_state(state, item, price, is_delta)
        except errors.QueueError:
            if reserved:
                self._tasks.in_background(self._drop_reservation(run_id), name=f"drop-reservation-{run_id}")
            raise
        if duplicate is not None and reserved:
            # Its job committed as the key came free: this reservation is a spare, never created.
            self._tasks.in_background(self._drop_reservation(run_id), name=f"drop-reservation-{run_id}")
        return state, duplicate

    async def _create_held_run(
        self, item: AdmitRequest, run_id: uuid.UUID, job_id: uuid.UUID, price: int, is_delta: bool, state: AdmitState
    ) -> None:
        """Creates the reserved run at the core, held until its release (a delta's too while the
        fleet's capacity is limited)."""
        created = await self._core.create_run(
            run_id=run_id,
            user_id=item.user_id,
            document_uri=item.document_uri,
            sources=item.sources,
            # A delta judges at once, unless the fleet's capacity is limited: then it waits
            # for its turn like any run (I12), released by a grant.
            hold=not is_delta or state.capacity_limited,
            delta_of_run_id=state.base_run_id if is_delta else None,
            # The core stores these and lists them back: the second copy of the admit (I14).
            job_id=job_id,
            idempotency_key=item.idempotency_key,
            request_digest=item.request_digest,
            price=price,
        )
        if created.fate is RunFate.CANCELED:
            # The run was canceled before this admit got to it (its reservation given up).
            raise errors.Conflict("the admit took too long and its run was given up; retry with the same idempotency key")

    def _check_admit_state(self, state: AdmitState, item: AdmitRequest, price: int, is_delta: bool) -> AdmitResult | None:
        """Raises the admit errors the state shows; returns the earlier job for a repeated key."""
        if state.existing_job_id is not None:
            if state.existing_digest != item.request_digest:
                raise errors.IdempotencyKeyReused(
                    "this idempotency key was already used with another request; use a new key per click",
                    metadata={"jobId": str(state.existing_job_id)},
                )
            return AdmitResult(state.existing_job_id, duplicate=True)
        if not item.operator_retry:
            self._check_free_work(state)
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
            limit = self._settings.max_active_deltas_per_user
            if state.running_deltas >= limit:
                raise errors.UserDeltaLimit(
                    f"the user already has {state.running_deltas} delta re-checks waiting or running (the maximum); wait for one to finish",
                    metadata={"maxActiveDeltas": str(limit), "activeDeltas": str(state.running_deltas)},
                )
        elif state.queued_count >= self._settings.max_queued_per_user:
            raise errors.UserQueueFull(
                f"the user already has {state.queued_count} queued analyses (the maximum); wait for one to start",
                metadata={"maxQueued": str(self._settings.max_queued_per_user), "queued": str(state.queued_count)},
            )
        if state.balance < price:
            raise errors.InsufficientCredits(
                f"insufficient credits: balance {state.balance}, required {price}",
                metadata={"balance": str(state.balance), "required": str(price)},
            )
        return None

    def _check_free_work(self, state: AdmitState) -> None:
        """Refuses the user's admits while her free work of the last hour is at its limit: a free
        re-check, and a job charged now and refunded after she canceled it, each store what they
        judge at no cost to her (docs/security.md, "What one user can store"); refunds she did not
        ask for are not counted (`admit_state`), and an operator's retry is never refused. Decided
        at the pre-check only: admits racing past it still pass the locked admit's own limits
        (credit, running deltas), which bound the overshoot."""
        limit = self._settings.max_free_admits_per_user_per_hour
        if state.free_admits_last_hour < limit:
            return
        frees_in = max(1.0, state.free_admit_frees_in_seconds or 0.0)
        raise errors.UserFreeWorkLimit(
            f"the user had {limit} jobs within the last hour that cost nothing by her choice (free re-checks, jobs refunded after her cancel; the maximum); "
            f"retry in {frees_in:.0f} s",
            metadata={"maxFreeAdmitsPerHour": str(limit), "retryAfterSeconds": str(round(frees_in))},
            quota_violations=[
                (
                    "user",
                    f"at most {limit} jobs per user per hour that cost nothing in the end (QUEUE_MAX_FREE_ADMITS_PER_USER_PER_HOUR)",
                )
            ],
            retry_delay_seconds=frees_in,
        )

    async def _admit_under_lock(
        self, item: AdmitRequest, job_id: uuid.UUID, run_id: uuid.UUID, price: int, is_delta: bool, delta_held: bool
    ) -> AdmitResult:
        # One statement under the user lock (the placement, the debit and the job's view), with
        # the hand-over of the release it claims: neither is stopped by a caller that gives up.
        return await self._tasks.outliving_the_caller(
            self._admit_job(item, job_id, run_id, price, is_delta, delta_held), name=f"admit-{job_id}"
        )

    async def _admit_job(
        self, item: AdmitRequest, job_id: uuid.UUID, run_id: uuid.UUID, price: int, is_delta: bool, delta_held: bool
    ) -> AdmitResult:
        admitted = await self._store.admit_job(
            NewJob(
                job_id=job_id,
                user_id=item.user_id,
                run_id=run_id,
                idempotency_key=item.idempotency_key,
                request_digest=item.request_digest,
                delta_of_job_id=item.delta_of_job_id,
                price=price,
                document_uri=item.document_uri,
                document_title=item.document_title,
                sources=item.sources,
                delta_held=delta_held,
                retry_of_job_id=item.retry_of_job_id,
            ),
            self._admit_limits,
        )
        if admitted is None:
            # Something changed since the pre-check (nothing was written): find out what.
            async with self._store.statements() as db:
                state = await db.admit_state(
                    user_id=item.user_id,
                    idempotency_key=item.idempotency_key,
                    delta_of_job_id=item.delta_of_job_id,
                    max_free_admits=self._settings.max_free_admits_per_user_per_hour,
                )
            duplicate = self._check_admit_state(state, item, price, is_delta)
            if duplicate is None:
                raise errors.Conflict("the admit took too long and its run was given up; retry with the same idempotency key")
            return duplicate
        view = admitted.view
        log.info("job admitted", extra={"job_id": job_id, "user_id": item.user_id, "run_id": run_id, "status": view.status})
        if view.status is JobStatus.PENDING:
            if view.waiting_for_capacity:
                self._capacity.note_waiting()
            else:
                self._starter.start_claimed(
                    ClaimedRelease(job_id, item.user_id, run_id, attempt=1, history_reconciled=admitted.history_reconciled, delta=is_delta)
                )
        return AdmitResult(job_id, duplicate=False, view=view)

    async def _drop_reservation(self, run_id: uuid.UUID) -> None:
        """The admit was refused before the core heard of the run: nothing to cancel."""
        async with self._store.statements() as db:
            await db.drop_run_reservation(run_id=run_id)

    async def _abandon_reserved_run(self, run_id: uuid.UUID, *, admitted_job_id: uuid.UUID | None = None) -> None:
        """Cancels the run of a failed admit, unless the admit committed after all. The claim
        waits for an admit still committing (it holds the reservation's row): when the admit whose
        outcome was unknown (its job `admitted_job_id`) did commit, the release its PENDING job
        claimed is handed over at once, as the admit would have; a job that waits for capacity
        claimed none (a grant releases it)."""
        async with self._store.statements() as db:
            claim = await db.claim_run_reservation(run_id=run_id, lease_seconds=self._settings.release_lease_seconds)
            job = None if claim is not None or admitted_job_id is None else await db.job_by_id(job_id=admitted_job_id)
        if claim is not None:
            await self._recovery.cancel_reserved_run(claim)
        elif job is not None and job.status is JobStatus.PENDING:
            log.info(
                "an admit whose outcome was unknown did commit; releasing its job", extra={"job_id": job.job_id, "user_id": job.user_id}
            )
            if job.waiting_for_capacity:
                # Its admit claimed no release: only a grant releases it, in its turn (I12).
                self._capacity.note_waiting()
            else:
                # Exactly the first release the committed admit claimed, as its answer would have
                # handed it over (the owed releases' one rule, read under the user's lock).
                await self._owed_releases.hand_over_owed(user_id=job.user_id)

    async def _abandon_run_before_answering(self, run_id: uuid.UUID, *, admitted_job_id: uuid.UUID | None = None) -> None:
        """Cancels a spare or failed admit's run, waiting for it as long as the caller's deadline
        allows: usually the run is gone when the caller hears the answer (I5), and if the core is
        slow the cancel goes on in the background (and the sweeper's, durably). When the admit's
        outcome is unknown, `admitted_job_id` is its job: if it did commit, its release is handed
        over instead."""
        task = self._tasks.in_background(self._abandon_reserved_run(run_id, admitted_job_id=admitted_job_id), name=f"abandon-run-{run_id}")
        wait = deadline.bound(self._settings.core_deadline_seconds)
        if wait > 0:
            await asyncio.wait({task}, timeout=wait)
