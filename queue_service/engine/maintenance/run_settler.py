"""Run settler: an ended job whose run the core has not confirmed settled has its run canceled
until the core confirms; then its seat frees and the user's next job is promoted."""

from __future__ import annotations

from queue_service.engine.maintenance.ports import Recovering
from queue_service.engine.maintenance.service import BATCH, EVERY_PASS, Work, count_each_asking_core
from queue_service.store import Statements


class RunSettler:
    action = "runs_settled"
    interval_seconds = EVERY_PASS

    def __init__(self, recovery: Recovering, *, release_lease_seconds: float, batch_size: int = BATCH) -> None:
        self._recovery = recovery
        self._release_lease_seconds = release_lease_seconds
        self.batch_size = batch_size

    async def find(self, db: Statements) -> Work:
        claims = await db.claim_due_run_settlements(lease_seconds=self._release_lease_seconds, batch_size=self.batch_size)

        async def work() -> int:
            return await count_each_asking_core([self._recovery.attempt_run_settlement(claim) for claim in claims])

        return work
