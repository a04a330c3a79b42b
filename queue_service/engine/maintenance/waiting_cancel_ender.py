"""Waiting-cancel ender: a job waiting for capacity whose user's cancel is recorded (no release of
its is due to apply it) is ended, refunded, without waiting for a grant."""

from __future__ import annotations

from queue_service.engine.maintenance.ports import Recovering
from queue_service.engine.maintenance.service import BATCH, EVERY_PASS, Work, guarded
from queue_service.store import Statements


class WaitingCancelEnder:
    action = "waiting_canceled"
    interval_seconds = EVERY_PASS

    def __init__(self, recovery: Recovering, *, batch_size: int = BATCH) -> None:
        self._recovery = recovery
        self.batch_size = batch_size

    async def find(self, db: Statements) -> Work:
        waiting = await db.waiting_jobs_to_cancel(batch_size=self.batch_size)

        async def work() -> int:
            ended = 0
            for job_id, user_id in waiting:
                ended += int(await guarded(self._recovery.cancel_waiting_job(job_id, user_id), False))
            return ended

        return work
