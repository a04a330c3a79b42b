"""Feed trimmer: the job-change feed's rows past their retention are deleted, in bounded batches
(the rest waits for the next pass)."""

from __future__ import annotations

import collections
import time

from queue_service.engine.maintenance.service import Work, guarded
from queue_service.store import Statements, Store
from queue_service.store.feed import RETENTION_SECONDS

# Feed rows deleted per statement, and statements per pass at most (the rest waits for the next).
TRIM_BATCH = 10_000
TRIM_STATEMENTS = 20


class FeedTrimmer:
    action = "feed_rows_trimmed"

    def __init__(self, store: Store, *, batch_size: int = TRIM_BATCH) -> None:
        self._store = store
        self.batch_size = batch_size
        # (when, horizon) of each pass: the oldest transaction in flight then. Rows of transactions
        # below a horizon seen RETENTION_SECONDS ago ended at least that long ago, and every
        # reader of the feed has read them (a reader that has not read for half of it resyncs).
        self._horizons: collections.deque[tuple[float, int]] = collections.deque()

    async def find(self, db: Statements) -> Work:
        async def work() -> int:
            return await guarded(self.trim(), 0)

        return work

    async def trim(self) -> int:
        """Deletes the feed's rows of transactions that ended more than its retention ago."""
        now = time.monotonic()
        async with self._store.statements() as db:
            self._horizons.append((now, await db.job_feed_horizon()))
            mark = None
            while self._horizons and now - self._horizons[0][0] >= RETENTION_SECONDS:
                mark = self._horizons.popleft()
            if mark is None:
                return 0
            deleted = 0
            for _ in range(TRIM_STATEMENTS):
                count = await db.trim_job_feed(before_xid=mark[1], batch_size=self.batch_size)
                deleted += count
                if count < self.batch_size:
                    return deleted
        self._horizons.appendleft(mark)  # not done: the next pass goes on
        return deleted
