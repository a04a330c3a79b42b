"""Promoter of lost tail calls: a user with a free seat and queued work (the promotion a lost
answer or a crash skipped) has the next job promoted."""

from __future__ import annotations

from queue_service.engine.maintenance.ports import Recovering
from queue_service.engine.maintenance.service import BATCH, EVERY_PASS, Work, guarded
from queue_service.model import Cause
from queue_service.store import Statements


class LostPromotionPromoter:
    action = "promoted"
    interval_seconds = EVERY_PASS

    def __init__(self, recovery: Recovering, *, max_active_per_user: int, batch_size: int = BATCH) -> None:
        self._recovery = recovery
        self._max_active_per_user = max_active_per_user
        self.batch_size = batch_size

    async def find(self, db: Statements) -> Work:
        users = await db.users_needing_promotion(default_max_active=self._max_active_per_user, batch_size=self.batch_size)

        async def work() -> int:
            promoted = 0
            for user_id in users:
                promoted += len(await guarded(self._recovery.promote(user_id, cause=Cause.SWEEPER), []))
            return promoted

        return work
