"""The sweeper: every replica's backstop for whatever a lost tail call or a crash left behind.

Each pass (every QUEUE_SWEEP_INTERVAL_SECONDS, jittered so replicas spread out; 0 turns it off)
runs the maintenance services of `engine/maintenance/`, one module per concern, in this order:
the core's live runs reconciled with the jobs when due (`core_runs`: runs the queue lost adopted,
jobs whose run the core forgot failed and refunded), then every service reads or
claims its rows (in one go, on one connection) and does its work: promotes users with a free seat
and queued work (`promoter`), fails releases past their window (`release_expirer`), asks the core
about RUNNING jobs whose completion never came (`run_reconciler`), confirms with the core that the
runs of ended jobs are settled, which frees their seats (`run_settler`), cancels runs reserved by
admits that failed or died (`reservation_canceler`), ends jobs waiting for capacity whose user's
cancel is recorded (`waiting_cancel_ender`), reads the depth and capacity gauges
(`metrics_reader`), deletes the job-change feed's rows past their retention (`feed_trimmer`),
forgets settled abandoned runs (`abandoned_run_forgetter`) and prunes ended jobs past their
retention (`pruner`); then it wakes the dispatcher for due releases. Each service declares how
often it is due (`interval_seconds`): most at every pass, the feed's trim every minute and the
pruner every QUEUE_PRUNE_INTERVAL_SECONDS, so the promoter's pace (the sweep interval) is not
theirs; a pass runs the services due (a pass run at once, `sweep_once`, runs them all). The database identity watch
(`identity_watch`) runs beside it, every few seconds. It is safe on every replica at once
(promotions take the user lock, claims skip locked rows, every transition is fenced), touches only
rows in flight (partial indexes), works in bounded batches, and one failure never stops the loop
(`background.SupervisedLoop`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from queue_service import errors, telemetry
from queue_service.background import SupervisedLoop
from queue_service.config import Config, settings_of
from queue_service.engine.maintenance.abandoned_run_forgetter import AbandonedRunForgetter
from queue_service.engine.maintenance.core_runs import CoreRunsReconciler
from queue_service.engine.maintenance.feed_trimmer import FeedTrimmer
from queue_service.engine.maintenance.identity_watch import DatabaseIdentityWatch, IdentityWatch
from queue_service.engine.maintenance.metrics_reader import MetricsReader
from queue_service.engine.maintenance.ports import Reconciliation, Reconciling, Recovering
from queue_service.engine.maintenance.promoter import LostPromotionPromoter
from queue_service.engine.maintenance.pruner import Pruner, PruneSettings
from queue_service.engine.maintenance.release_expirer import ReleaseExpirer
from queue_service.engine.maintenance.reservation_canceler import ReservationCanceler
from queue_service.engine.maintenance.run_reconciler import RunReconciler
from queue_service.engine.maintenance.run_settler import RunSettler
from queue_service.engine.maintenance.service import MaintenanceService, Work
from queue_service.engine.maintenance.waiting_cancel_ender import WaitingCancelEnder
from queue_service.store import Store

log = logging.getLogger(__name__)

__all__ = ["IdentityWatch", "Reconciliation", "Reconciling", "Recovering", "SweepReport", "Sweeper", "SweeperSettings"]


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
    runs_forgotten: int = 0
    waiting_canceled: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SweeperSettings:
    """The settings the sweeper and its maintenance services read (QUEUE_* of the same names)."""

    sweep_interval_seconds: float
    max_active_per_user: int
    release_window_seconds: float
    release_lease_seconds: float
    reconcile_after_seconds: float
    prune: PruneSettings

    @classmethod
    def from_config(cls, config: Config) -> SweeperSettings:
        return settings_of(cls, config, prune=PruneSettings.from_config(config))


class Sweeper:
    def __init__(
        self,
        recovery: Recovering,
        store: Store,
        settings: SweeperSettings,
        *,
        wake_dispatcher: Callable[[], None],
        reconciler: Reconciling | None = None,
    ) -> None:
        # The core's live runs against the jobs, when due (engine/core_reconciliation.py).
        self.reconciler = reconciler
        self._store = store
        self._settings = settings
        self._wake_dispatcher = wake_dispatcher
        self._core_runs = CoreRunsReconciler(reconciler, store) if reconciler is not None else None
        # The pass's services, in the order they read and then work.
        self.services: tuple[MaintenanceService, ...] = (
            LostPromotionPromoter(recovery, max_active_per_user=settings.max_active_per_user),
            ReleaseExpirer(recovery, release_window_seconds=settings.release_window_seconds),
            RunReconciler(recovery, reconcile_after_seconds=settings.reconcile_after_seconds),
            RunSettler(recovery, release_lease_seconds=settings.release_lease_seconds),
            ReservationCanceler(recovery, release_lease_seconds=settings.release_lease_seconds),
            WaitingCancelEnder(recovery),
            MetricsReader(),
            FeedTrimmer(store),
            AbandonedRunForgetter(store),
            Pruner(store, settings.prune),
        )
        # When each service is due again (monotonic; 0: at the first pass).
        self._due_at = [0.0] * len(self.services)
        self._loop = SupervisedLoop(
            "sweeper",
            self._pass,
            interval_seconds=settings.sweep_interval_seconds,
            jitter=(0.5, 1.0),
            wait_first=True,
            expected=(errors.QueueError,),
            failure_log=("sweeper pass failed (%s); the next pass retries", "sweeper pass failed; the next pass retries"),
        )
        self._identity = (
            DatabaseIdentityWatch(reconciler, self.after_database_replaced, sweep_interval_seconds=settings.sweep_interval_seconds)
            if reconciler is not None
            else None
        )

    @property
    def identity_watch(self) -> IdentityWatch:
        """What the database identity watch has done (an empty record without a reconciler)."""
        return self._identity.record if self._identity is not None else IdentityWatch()

    def start(self) -> None:
        if self._settings.sweep_interval_seconds > 0:
            self._loop.start()
            if self._identity is not None:
                self._identity.loop.start()

    async def stop(self) -> None:
        if self._identity is not None:
            await self._identity.loop.stop()
        await self._loop.stop()

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

    async def _pass(self) -> None:
        await self.sweep_once(due_only=True)

    async def sweep_once(self, *, due_only: bool = False) -> SweepReport:
        """One pass, in order, of every service, or (the loop's pass) of those due (a test or a
        failover runs a whole pass at once)."""
        report = SweepReport()
        started = time.perf_counter()
        now = time.monotonic()
        running = [i for i, due_at in enumerate(self._due_at) if not due_only or due_at <= now]
        with telemetry.tracer.start_as_current_span("sweep") as span:
            span.set_attribute("queue.sweep.services", len(running))
            if self._core_runs is not None:
                reconciled = await self._core_runs.reconcile_if_due()
                if reconciled is not None:
                    report.runs_adopted += reconciled.adopted
                    report.runs_lost += reconciled.lost
                    report.runs_forgotten += reconciled.forgotten
            found: list[tuple[int, Work]] = []
            async with self._store.statements() as db:
                for i in running:
                    found.append((i, await self.services[i].find(db)))
            for i, work in found:
                done = await work()
                service = self.services[i]
                # Read after the work: a service left behind asks for the next pass.
                self._due_at[i] = now + service.interval_seconds
                if service.action is not None:
                    setattr(report, service.action, getattr(report, service.action) + done)
            self._wake_dispatcher()
            span.set_attribute("queue.sweep.promoted", report.promoted)
            span.set_attribute("queue.sweep.gave_up", report.gave_up)
            span.set_attribute("queue.sweep.reconciled", report.reconciled)
        telemetry.metrics.sweep_duration.record(time.perf_counter() - started)
        for action, count in dataclasses.asdict(report).items():
            if count:
                telemetry.metrics.sweep_rows.add(count, {"action": action})
        return report
