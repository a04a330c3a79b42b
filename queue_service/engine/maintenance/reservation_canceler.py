"""Reservation canceler: a run reserved by an admit that failed or died (an orphaned
reservation) is canceled until the core confirms, then forgotten; one whose job a failover lost
is adopted instead."""

from __future__ import annotations

from queue_service.engine.maintenance.ports import Recovering
from queue_service.engine.maintenance.service import BATCH, EVERY_PASS, Work, count_each_asking_core
from queue_service.store import Statements


class ReservationCanceler:
    action = "orphans_canceled"
    interval_seconds = EVERY_PASS

    def __init__(self, recovery: Recovering, *, release_lease_seconds: float, batch_size: int = BATCH) -> None:
        self._recovery = recovery
        self._release_lease_seconds = release_lease_seconds
        self.batch_size = batch_size

    async def find(self, db: Statements) -> Work:
        claims = await db.claim_due_run_reservations(lease_seconds=self._release_lease_seconds, batch_size=self.batch_size)

        async def work() -> int:
            return await count_each_asking_core([self._recovery.cancel_reserved_run(claim) for claim in claims])

        return work
