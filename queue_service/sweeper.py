"""The sweeper: every replica's backstop for whatever a lost tail call or a crash left behind.

Each pass (every QUEUE_SWEEP_INTERVAL_SECONDS, jittered so replicas spread out) promotes users
with a free slot and queued work, wakes the dispatcher for due releases, fails releases past
their window, and reconciles RUNNING jobs whose completion never came by asking the core. It is
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

import grpc

from queue_service import errors, telemetry
from queue_service import repository as repo
from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2
from queue_service.background import cancel_and_wait
from queue_service.db import connection
from queue_service.engine import ACTIVE, QueueEngine

log = logging.getLogger(__name__)

_BATCH = 500


@dataclasses.dataclass
class SweepReport:
    promoted: int = 0
    gave_up: int = 0
    reconciled: int = 0


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
            for row in overdue:
                report.reconciled += await self._guarded(self._reconcile(row), False, int)
            self._wake_dispatcher()
            span.set_attribute("queue.sweep.promoted", report.promoted)
            span.set_attribute("queue.sweep.gave_up", report.gave_up)
            span.set_attribute("queue.sweep.reconciled", report.reconciled)
        telemetry.metrics.sweep_duration.record(time.perf_counter() - started)
        for action, count in dataclasses.asdict(report).items():
            if count:
                telemetry.metrics.sweep_rows.add(count, {"action": action})
        return report

    @staticmethod
    async def _guarded(step, default, count):  # type: ignore[no-untyped-def]
        """Runs one row's step; a failure is logged and the pass goes on."""
        try:
            return count(await step)
        except (errors.QueueError, grpc.aio.AioRpcError) as exc:
            log.warning("sweeper step failed: %s", exc)
            return count(default)

    async def _reconcile(self, row: dict) -> bool:
        """Asks the core about a RUNNING job whose completion never arrived."""
        engine = self._engine
        run = await engine.core.get_run(row["run_id"])
        if run is not None and run.state in (core_pb2.RUN_STATE_HELD, core_pb2.RUN_STATE_JUDGING):
            return False
        if run is None:
            status, message, refund = "failed", "the core no longer knows this run", True
        elif run.state == core_pb2.RUN_STATE_SUCCEEDED:
            status, message, refund = "succeeded", "", False
        elif run.state == core_pb2.RUN_STATE_CANCELED:
            status, message, refund = "canceled", run.message or "canceled at the core", True
        else:
            status, message, refund = "failed", run.message or "the core reported a failure", True
        log.info("reconciling a run whose completion never arrived", extra={"job_id": row["job_id"], "run_id": row["run_id"], "status": status})
        ended = await engine.end_job(
            job_id=row["job_id"],
            user_id=row["user_id"],
            status=status,
            from_statuses=ACTIVE,
            last_error=message,
            refund=refund,
            trigger="reconcile",
        )
        return ended is not None
