"""The sweeper: every replica's backstop for whatever a lost tail call or a crash left behind.

Each pass (every QUEUE_SWEEP_INTERVAL_SECONDS, jittered so replicas spread out) promotes users
with a free slot and queued work, wakes the dispatcher for due releases, fails releases past
their window, reconciles RUNNING jobs whose completion never came by asking the core, confirms
with the core that the runs of ended jobs are settled (which frees their slots), cancels runs
reserved by admits that failed or died, ends jobs waiting for capacity whose user's cancel is
recorded (no release of theirs is due to apply it), deletes the job-change feed's rows past their
retention, and reconciles the core's live runs with the jobs when due (every
QUEUE_CORE_RECONCILE_INTERVAL_SECONDS, and at once after the database's timeline changed:
`core_reconciliation`). It is
safe on every replica at once (promotions take the user lock, claims skip locked rows, every
transition is fenced), touches only rows in flight (partial indexes), works in bounded batches,
and one failure never stops the loop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from queue_service import deadline, errors, telemetry
from queue_service.background import cancel_and_wait
from queue_service.config import Config
from queue_service.engine.pruner import prune_ended_jobs
from queue_service.model import Cause, ClaimedReservation, ClaimedSettlement, OverdueRun, Promoted
from queue_service.store import Store
from queue_service.store.feed import RETENTION_SECONDS

T = TypeVar("T")

log = logging.getLogger(__name__)

_BATCH = 500
_CORE_CALLS_AT_ONCE = 16
# Feed rows deleted per statement, and statements per pass at most (the rest waits for the next).
_FEED_TRIM_BATCH = 10_000
_FEED_TRIM_STATEMENTS = 20
# A failed admit's run settled at the core is remembered this long (no core reports a run a day
# later), then forgotten, at most this many per pass.
_ABANDONED_RUN_RETENTION_SECONDS = 86_400.0
_ABANDONED_RUNS_PER_PASS = 1_000
# How often the database's identity (its timeline) is looked at, for a failover; failed looks in
# a row before one is logged as a warning.
_IDENTITY_CHECK_SECONDS = 2.0
_IDENTITY_FAILURES_BEFORE_WARNING = 3
_IDENTITY_LOOK_SECONDS = 4.0
# A reconciliation the core or the database failed is tried this often within the pass, the
# retries about this many seconds apart (jittered, doubling).
_RECONCILE_ATTEMPTS = 3
_RECONCILE_RETRY_SECONDS = 0.5


@dataclasses.dataclass
class IdentityWatch:
    """What the database identity watch has done (for logs, tests and diagnosis)."""

    looks: int = 0
    changes_seen: int = 0
    work_owed: bool = False
    failures_in_a_row: int = 0
    last_failure: str = ""


@dataclasses.dataclass
class SweepReport:
    promoted: int = 0
    gave_up: int = 0
    reconciled: int = 0
    runs_settled: int = 0
    orphans_canceled: int = 0
    feed_rows_trimmed: int = 0
    abandoned_runs_forgotten: int = 0
    runs_adopted: int = 0
    runs_lost: int = 0
    waiting_canceled: int = 0


class Recovering(Protocol):
    """What the sweeper asks of the engine: `engine.recovery.Recovery` in the service."""

    @property
    def cancel_recheck_seconds(self) -> float: ...

    async def promote(self, user_id: str, *, cause: Cause) -> tuple[Promoted, ...]: ...

    async def give_up_release(self, job_id: uuid.UUID, user_id: str, reason: str, *, attempts: int) -> bool: ...

    async def reconcile(self, job_id: uuid.UUID, user_id: str, run_id: uuid.UUID, *, cancel_requested: bool = False) -> bool: ...

    async def attempt_run_settlement(self, claim: ClaimedSettlement) -> bool: ...

    async def cancel_reserved_run(self, claim: ClaimedReservation) -> bool: ...

    async def cancel_waiting_job(self, job_id: uuid.UUID, user_id: str) -> bool: ...


class Reconciliation(Protocol):
    """What one reconciliation did (`core_reconciliation.ReconcileReport`)."""

    adopted: int
    lost: int
    trigger: str


class Reconciling(Protocol):
    """What the sweeper asks of the reconciliation of the core's live runs with the jobs:
    `engine.core_reconciliation.CoreReconciler` in the service."""

    async def database_replaced(self) -> bool: ...

    @property
    def reconcile_owed(self) -> bool: ...

    async def reconcile(self, *, trigger: str = "periodic") -> Reconciliation: ...

    async def reconcile_if_due(self) -> Reconciliation | None: ...


class Sweeper:
    def __init__(
        self,
        recovery: Recovering,
        store: Store,
        config: Config,
        *,
        wake_dispatcher: Callable[[], None],
        reconciler: Reconciling | None = None,
    ) -> None:
        self._recovery = recovery
        # The core's live runs against the jobs, when due (engine/core_reconciliation.py).
        self.reconciler = reconciler
        self._store = store
        self._config = config
        self._wake_dispatcher = wake_dispatcher
        self._runner: asyncio.Task[None] | None = None
        self._identity_watch: asyncio.Task[None] | None = None
        self.identity_watch = IdentityWatch()
        # (when, horizon) of each pass: the oldest transaction in flight then. Rows of transactions
        # below a horizon seen RETENTION_SECONDS ago ended at least that long ago, and every
        # reader of the feed has read them (a reader that has not read for half of it resyncs).
        self._feed_horizons: collections.deque[tuple[float, int]] = collections.deque()

    def start(self) -> None:
        if self._config.sweep_interval_seconds > 0:
            self._runner = asyncio.create_task(self._run(), name="sweeper")
            if self.reconciler is not None:
                self._identity_watch = asyncio.create_task(self._watch_database_identity(), name="database-identity-watch")

    async def stop(self) -> None:
        await cancel_and_wait(self._identity_watch)
        await cancel_and_wait(self._runner)

    async def after_database_replaced(self) -> None:
        """A failover may have lost commits: the core's live runs are reconciled (lost jobs
        adopted), every RUNNING job is asked about at the core now (a completion the old primary
        acknowledged may be lost), and a whole pass runs at once. Raises when a step could not
        run; the identity watch then tries the whole again at its next look."""
        assert self.reconciler is not None
        await self.reconciler.reconcile(trigger="database_changed")
        async with self._store.statements() as db:
            due = await db.reconcile_running_jobs_now()
        log.info("after the database changed: %d running jobs to reconcile with the core now", due)
        await self.sweep_once()

    async def _watch_database_identity(self) -> None:
        """Looks at the database's identity every few seconds (one cheap query), first at once
        (the identity this replica started on), and reconciles with the core's runs as soon as it
        changed: a failover is seen within seconds, not a sweep interval later. The work after a
        change is owed until it has gone through whole (the new primary or the core not answering
        yet), retried at every look rather than at the next sweep. Failing looks are logged
        quietly at first, then as a warning, so a watch that cannot see the database is noticed."""
        assert self.reconciler is not None
        every = min(_IDENTITY_CHECK_SECONDS, self._config.sweep_interval_seconds)
        watch = self.identity_watch
        while True:
            watch.looks += 1
            try:
                # A look is one trivial read: bounded like a call, so a look whose exchange
                # stalls (a connection left half-open by the failover) is given up in seconds.
                with deadline.call_budget(_IDENTITY_LOOK_SECONDS):
                    replaced = await self.reconciler.database_replaced()
                if replaced:
                    watch.changes_seen += 1
                    watch.work_owed = True
                if watch.work_owed:
                    await self.after_database_replaced()
                    watch.work_owed = False
                elif self.reconciler.reconcile_owed:
                    # An orphan the reconciliation after the change could not settle yet.
                    await self.reconciler.reconcile_if_due()
                if watch.failures_in_a_row >= _IDENTITY_FAILURES_BEFORE_WARNING:
                    log.info("database identity watch works again after %d failed looks", watch.failures_in_a_row)
                watch.failures_in_a_row = 0
            except Exception as exc:
                watch.failures_in_a_row += 1
                watch.last_failure = f"{exc.__class__.__name__}: {exc}"
                loud = watch.failures_in_a_row % _IDENTITY_FAILURES_BEFORE_WARNING == 0
                if isinstance(exc, errors.QueueError):
                    log.log(
                        logging.WARNING if loud else logging.DEBUG,
                        "database identity look failed (%s, %d in a row%s); retrying",
                        exc.message,
                        watch.failures_in_a_row,
                        ", failover work owed" if watch.work_owed else "",
                    )
                else:
                    log.exception("database identity look failed; retrying")
            await asyncio.sleep(every * random.uniform(0.8, 1.0))

    async def _run(self) -> None:
        interval = self._config.sweep_interval_seconds
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.0))
            try:
                await self.sweep_once()
            except errors.QueueError as exc:
                log.warning("sweeper pass failed (%s); the next pass retries", exc.message)
            except Exception:
                log.exception("sweeper pass failed; the next pass retries")

    async def sweep_once(self) -> SweepReport:
        recovery, config = self._recovery, self._config
        report = SweepReport()
        started = time.perf_counter()
        with telemetry.tracer.start_as_current_span("sweep") as span:
            if self.reconciler is not None:
                # First: runs adopted now are promoted, released and reconciled by this pass.
                reconciled = await self._guarded(self.reconciler.reconcile_if_due(), None)
                if reconciled is not None and reconciled.trigger == "database_changed":
                    async with self._store.statements() as db:
                        await db.reconcile_running_jobs_now()
                if reconciled is not None:
                    report.runs_adopted += reconciled.adopted
                    report.runs_lost += reconciled.lost
            lease = config.release_lease_seconds
            async with self._store.statements() as db:
                users = await db.users_needing_promotion(default_max_active=config.max_active_per_user, batch_size=_BATCH)
                expired = await db.expired_pending_releases(batch_size=_BATCH)
                overdue = await db.claim_due_reconciliations(
                    recheck_seconds=config.reconcile_after_seconds,
                    cancel_recheck_seconds=recovery.cancel_recheck_seconds,
                    batch_size=_BATCH,
                )
                unsettled = await db.claim_due_run_settlements(lease_seconds=lease, batch_size=_BATCH)
                orphans = await db.claim_due_run_reservations(lease_seconds=lease, batch_size=_BATCH)
                waiting_canceled = await db.waiting_jobs_to_cancel(batch_size=_BATCH)
                telemetry.metrics.depth = await db.queue_depth()
                capacity = await db.capacity_state()
            telemetry.metrics.capacity["in_use"] = capacity.in_use
            telemetry.metrics.capacity["waiting"] = capacity.waiting_jobs
            if capacity.effective_limit is None:
                telemetry.metrics.capacity.pop("limit", None)
            else:
                telemetry.metrics.capacity["limit"] = capacity.effective_limit
            for user_id in users:
                report.promoted += len(await self._guarded(recovery.promote(user_id, cause=Cause.SWEEPER), []))
            window = config.release_window_seconds
            for release in expired:
                gave_up = recovery.give_up_release(
                    release.job_id,
                    release.user_id,
                    f"release window of {window:g}s passed without a successful release",
                    attempts=release.attempts,
                )
                report.gave_up += int(await self._guarded(gave_up, False))
            # Steps that ask the core run side by side (bounded), so a slow core costs one
            # deadline per pass, not one per row.
            report.reconciled += await self._each_asking_core([self._reconcile(run) for run in overdue])
            report.runs_settled += await self._each_asking_core([recovery.attempt_run_settlement(c) for c in unsettled])
            report.orphans_canceled += await self._each_asking_core([recovery.cancel_reserved_run(o) for o in orphans])
            for job_id, user_id in waiting_canceled:
                report.waiting_canceled += int(await self._guarded(recovery.cancel_waiting_job(job_id, user_id), False))
            report.feed_rows_trimmed += await self._guarded(self._trim_feed(), 0)
            report.abandoned_runs_forgotten += await self._guarded(self._forget_abandoned_runs(), 0)
            await self._guarded(prune_ended_jobs(self._store, config), None)
            self._wake_dispatcher()
            span.set_attribute("queue.sweep.promoted", report.promoted)
            span.set_attribute("queue.sweep.gave_up", report.gave_up)
            span.set_attribute("queue.sweep.reconciled", report.reconciled)
        telemetry.metrics.sweep_duration.record(time.perf_counter() - started)
        for action, count in dataclasses.asdict(report).items():
            if count:
                telemetry.metrics.sweep_rows.add(count, {"action": action})
        return report

    async def _reconcile(self, run: OverdueRun) -> bool:
        """One claimed reconciliation, tried again within the pass when the core or the database
        failed it (a connection lost mid-failover, an answer lost): its claim pushed the job's
        next look out by QUEUE_RECONCILE_AFTER_SECONDS, so without a retry a completion the core
        has would wait that long. Each attempt is fenced (a completion applied by an attempt whose
        answer was lost leaves the next nothing to do)."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(_RECONCILE_ATTEMPTS),
            wait=wait_random_exponential(multiplier=_RECONCILE_RETRY_SECONDS, max=4 * _RECONCILE_RETRY_SECONDS),
            retry=retry_if_exception_type(errors.QueueError),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                ended = await self._recovery.reconcile(run.job_id, run.user_id, run.run_id, cancel_requested=run.cancel_requested)
        return ended

    async def _forget_abandoned_runs(self) -> int:
        async with self._store.statements() as db:
            return await db.forget_abandoned_runs(retention_seconds=_ABANDONED_RUN_RETENTION_SECONDS, batch_size=_ABANDONED_RUNS_PER_PASS)

    async def _trim_feed(self) -> int:
        """Deletes the feed's rows of transactions that ended more than its retention ago."""
        now = time.monotonic()
        async with self._store.statements() as db:
            self._feed_horizons.append((now, await db.job_feed_horizon()))
            mark = None
            while self._feed_horizons and now - self._feed_horizons[0][0] >= RETENTION_SECONDS:
                mark = self._feed_horizons.popleft()
            if mark is None:
                return 0
            deleted = 0
            for _ in range(_FEED_TRIM_STATEMENTS):
                count = await db.trim_job_feed(before_xid=mark[1], batch_size=_FEED_TRIM_BATCH)
                deleted += count
                if count < _FEED_TRIM_BATCH:
                    return deleted
        self._feed_horizons.appendleft(mark)  # not done: the next pass goes on
        return deleted

    async def _each_asking_core(self, steps: list[Coroutine[Any, Any, bool]]) -> int:
        """Runs the steps at most _CORE_CALLS_AT_ONCE at a time; returns how many succeeded."""
        gate = asyncio.Semaphore(_CORE_CALLS_AT_ONCE)

        async def gated(step: Coroutine[Any, Any, bool]) -> int:
            async with gate:
                return int(await self._guarded(step, False))

        return sum(await asyncio.gather(*(gated(step) for step in steps)))

    @staticmethod
    async def _guarded(step: Coroutine[Any, Any, T], default: T) -> T:
        """Runs one row's step; a failure is logged and the pass goes on."""
        try:
            return await step
        except errors.QueueError as exc:
            log.warning("sweeper step failed: %s", exc.message)
            return default
