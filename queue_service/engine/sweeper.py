"""The sweeper: every replica's backstop for whatever a lost tail call or a crash left behind.

Each pass (every QUEUE_SWEEP_INTERVAL_SECONDS, jittered so replicas spread out) promotes users
with a free slot and queued work, wakes the dispatcher for due releases, fails releases past
their window, reconciles RUNNING jobs whose completion never came by asking the core, confirms
with the core that the runs of ended jobs are settled (which frees their slots), and cancels runs
reserved by admits that failed or died. It is
safe on every replica at once (promotions take the user lock, claims skip locked rows, every
transition is fenced), touches only rows in flight (partial indexes), works in bounded batches,
and one failure never stops the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Coroutine
from typing import Any

from queue_service import errors, telemetry
from queue_service.store import store as repo
from queue_service.background import cancel_and_wait
from queue_service.store.pool import connection
from queue_service.engine.engine import QueueEngine

log = logging.getLogger(__name__)

_BATCH = 500
_CORE_CALLS_AT_ONCE = 16


@dataclasses.dataclass
class SweepReport:
    promoted: int = 0
    gave_up: int = 0
    reconciled: int = 0
    runs_settled: int = 0
    orphans_canceled: int = 0


class Sweeper:
    def __init__(self, engine: QueueEngine, wake_dispatcher) -> None:  # type: ignore[no-untyped-def]
        self._engine = engine
        self._wake_dispatcher = wake_dispatcher
        self._runner: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._engine.config.sweep_interval_seconds > 0:
            self._runner = asyncio.create_task(self._run(), name="sweeper")

    async def stop(self) -> None:
        await cancel_and_wait(self._runner)

    async def _run(self) -> None:
        interval = self._engine.config.sweep_interval_seconds
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.0))
            try:
                await self.sweep_once()
            except errors.QueueError as exc:
                log.warning("sweeper pass failed (%s); the next pass retries", exc.message)
            except Exception:
                log.exception("sweeper pass failed; the next pass retries")

    async def sweep_once(self) -> SweepReport:
        engine = self._engine
        report = SweepReport()
        started = time.perf_counter()
        with telemetry.tracer.start_as_current_span("sweep") as span:
            async with connection(engine.pool) as conn:
                users = await repo.users_needing_promotion(
                    conn, default_max_active=engine.config.max_active_per_user, batch_size=_BATCH
                )
                expired = await repo.expired_pending_releases(conn, batch_size=_BATCH)
                overdue = await repo.claim_due_reconciliations(
                    conn, recheck_seconds=engine.config.reconcile_after_seconds, batch_size=_BATCH
                )
                lease = engine.config.release_lease_seconds
                unsettled = await repo.claim_due_run_settlements(conn, lease_seconds=lease, batch_size=_BATCH)
                orphans = await repo.claim_due_run_reservations(conn, lease_seconds=lease, batch_size=_BATCH)
                telemetry.metrics.depth = await repo.queue_depth(conn)
            for user_id in users:
                report.promoted += await self._guarded(engine.promote(user_id, trigger="sweeper"), 0, len)
            for row in expired:
                window = engine.config.release_window_seconds
                gave_up = engine.give_up_release(
                    row["job_id"], row["user_id"], f"release window of {window:g}s passed without a successful release",
                    expected_attempts=row["release_attempts"],
                )
                report.gave_up += await self._guarded(gave_up, False, int)
            # Steps that ask the core run side by side (bounded), so a slow core costs one
            # deadline per pass, not one per row.
            report.reconciled += await self._each_asking_core(
                [engine.reconcile(row["job_id"], row["user_id"], row["run_id"]) for row in overdue]
            )
            report.runs_settled += await self._each_asking_core([engine.attempt_run_settlement(c) for c in unsettled])
            report.orphans_canceled += await self._each_asking_core([engine.cancel_reserved_run(o) for o in orphans])
            self._wake_dispatcher()
            span.set_attribute("queue.sweep.promoted", report.promoted)
            span.set_attribute("queue.sweep.gave_up", report.gave_up)
            span.set_attribute("queue.sweep.reconciled", report.reconciled)
        telemetry.metrics.sweep_duration.record(time.perf_counter() - started)
        for action, count in dataclasses.asdict(report).items():
            if count:
                telemetry.metrics.sweep_rows.add(count, {"action": action})
        return report

    async def _each_asking_core(self, steps: list[Coroutine[Any, Any, bool]]) -> int:
        """Runs the steps at most _CORE_CALLS_AT_ONCE at a time; returns how many succeeded."""
        gate = asyncio.Semaphore(_CORE_CALLS_AT_ONCE)

        async def gated(step: Coroutine[Any, Any, bool]) -> int:
            async with gate:
                return int(await self._guarded(step, False, bool))

        return sum(await asyncio.gather(*(gated(step) for step in steps)))

    @staticmethod
    async def _guarded(step, default, count):  # type: ignore[no-untyped-def]
        """Runs one row's step; a failure is logged and the pass goes on."""
        try:
            return count(await step)
        except errors.QueueError as exc:
            log.warning("sweeper step failed: %s", exc.message)
            return count(default)
