"""Release expirer: a PENDING job whose release window passed while no replica released it is
given up (failed and refunded)."""

from __future__ import annotations

from queue_service.engine.maintenance.ports import Recovering
from queue_service.engine.maintenance.service import BATCH, EVERY_PASS, Work, guarded
from queue_service.store import Statements


class ReleaseExpirer:
    action = "gave_up"
    interval_seconds = EVERY_PASS

    def __init__(self, recovery: Recovering, *, release_window_seconds: float, batch_size: int = BATCH) -> None:
        self._recovery = recovery
        self._release_window_seconds = release_window_seconds
        self.batch_size = batch_size

    async def find(self, db: Statements) -> Work:
        expired = await db.expired_pending_releases(batch_size=self.batch_size)

        async def work() -> int:
            window = self._release_window_seconds
            gave_up = 0
            for release in expired:
                step = self._recovery.give_up_release(
                    release.job_id,
                    release.user_id,
                    f"release window of {window:g}s passed without a successful release",
                    attempts=release.attempts,
                )
                gave_up += int(await guarded(step, False))
            return gave_up

        return work
