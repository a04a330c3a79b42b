"""Metrics reader: the queue's depth and the fleet's capacity at the core, read once a pass for
the gauges (`queue.depth`, `queue.capacity.*`, the pauses of releases among them)."""

from __future__ import annotations

from queue_service import telemetry
from queue_service.engine.maintenance.service import EVERY_PASS, Work, nothing_to_do
from queue_service.store import Statements


class MetricsReader:
    action = None
    interval_seconds = EVERY_PASS

    async def find(self, db: Statements) -> Work:
        telemetry.metrics.depth = await db.queue_depth()
        capacity = await db.capacity_state()
        telemetry.metrics.capacity["in_use"] = capacity.in_use
        telemetry.metrics.capacity["waiting"] = capacity.waiting_jobs
        # Pauses of releases in force: 1 while the fleet's are paused; users paused on their own.
        telemetry.metrics.capacity["fleet_paused"] = int(capacity.fleet_pause is not None)
        telemetry.metrics.capacity["paused_users"] = capacity.paused_users
        if capacity.effective_limit is None:
            telemetry.metrics.capacity.pop("limit", None)
        else:
            telemetry.metrics.capacity["limit"] = capacity.effective_limit
        return nothing_to_do
