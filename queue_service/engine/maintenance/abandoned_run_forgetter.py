"""Abandoned-run forgetter: a failed admit's run settled at the core is remembered a day (no core
reports a run a day later), then forgotten, a bounded batch a pass."""

from __future__ import annotations

from queue_service.engine.maintenance.service import EVERY_PASS, Work, guarded
from queue_service.store import Statements, Store

RETENTION_SECONDS = 86_400.0
FORGOTTEN_PER_PASS = 1_000


class AbandonedRunForgetter:
    action = "abandoned_runs_forgotten"
    interval_seconds = EVERY_PASS

    def __init__(self, store: Store, *, batch_size: int = FORGOTTEN_PER_PASS) -> None:
        self._store = store
        self.batch_size = batch_size

    async def find(self, db: Statements) -> Work:
        async def work() -> int:
            return await guarded(self.forget(), 0)

        return work

    async def forget(self) -> int:
        async with self._store.statements() as db:
            return await db.forget_abandoned_runs(retention_seconds=RETENTION_SECONDS, batch_size=self.batch_size)
