"""Feed trimmer: the job-change feed's rows past their retention are deleted, in bounded batches
(the rest waits for the next pass), every minute rather than at every pass of the sweeper."""

from __future__ import annotations

import collections
import time

from queue_service.engine.maintenance.service import EVERY_PASS, Work, guarded
from queue_service.store import Statements, Store
from queue_service.store.feed import RETENTION_SECONDS

# Feed rows deleted per statement, and statements per pass at most (the rest waits for the next).
TRIM_BATCH = 10_000
TRIM_STATEMENTS = 20
# How often the trim is due. Rows live 120 s (RETENTION_SECONDS) and no reader looks at them after
# half of it: trimming every minute leaves the table at most a minute's changes larger (about
# three minutes of them instead of two and a half at the default 30 s sweep), in half the
# deleting statements, and the promoter's pass no longer sets the trim's pace. Not a setting: it
# follows the feed's retention, which is not one either.
TRIM_INTERVAL_SECONDS = 60.0


class FeedTrimmer:
    action = "feed_rows_trimmed"

    def __init__(self, store: Store, *, batch_size: int = TRIM_BATCH) -> None:
        self._store = store
        self.batch_size = batch_size
        # (when, horizon) of each pass: the oldest transaction in flight then. Rows of transactions
        # below a horizon seen RETENTION_SECONDS ago ended at least that long ago, and every
        # reader of the feed has read them (a reader that has not read for half of it resyncs).
        self._horizons: collections.deque[tuple[float, int]] = collections.deque()
        # Whether the previous trim deleted all that was past the retention (else it goes on at
        # the next pass).
        self._caught_up = True

    @property
    def interval_seconds(self) -> float:
        return TRIM_INTERVAL_SECONDS if self._caught_up else EVERY_PASS

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
                    self._caught_up = True
                    return deleted
        self._horizons.appendleft(mark)  # not done: the next pass goes on
        self._caught_up = False
        return deleted
