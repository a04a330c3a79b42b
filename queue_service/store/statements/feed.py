"""The job-change feed's statements (`sql/queries/feed.sql`; the cursor and the hints: store/feed.py)."""

from __future__ import annotations

import time

from queue_service.store import rows as from_row
from queue_service.store.feed import FeedCursor, FeedRead
from queue_service.store.statements.base import StatementRunner


class FeedStatements(StatementRunner):
    """The job-change feed: its start, reads, horizon, trim and hint."""

    async def job_feed_start(self) -> FeedCursor:
        """A cursor at the present: the changes committed after it are read next."""
        row = await self._one("job_feed_start", {})
        assert row is not None
        return FeedCursor(row["snapshot"], time.monotonic())

    async def job_feed_since(self, after: FeedCursor, *, user_ids: list[str] | None, limit: int, watch_line: bool = False) -> FeedRead:
        """The changes committed since `after`, in change_id order (of `user_ids` and of PENDING
        jobs nobody claimed; of every user when None), and the cursor to read from next; not
        `complete` (and no changes) when there were more than `limit`. With `watch_line`, also
        whether a change of any user may have moved the fleet's line for capacity."""
        read_at = time.monotonic()
        rows = await self._all(
            "job_feed_since",
            {
                "after": after.snapshot,
                "all_users": user_ids is None,
                "user_ids": user_ids or [],
                "limit": limit + 1,
                "watch_line": watch_line,
            },
        )
        changes = [from_row.job_change(row) for row in rows if row["change_id"] is not None]
        complete = len(changes) <= limit
        return FeedRead(FeedCursor(rows[0]["snapshot"], read_at), changes if complete else [], complete, bool(rows[0]["line_moved"]))

    async def job_feed_horizon(self) -> int:
        """The oldest transaction still in flight: every older one has ended."""
        row = await self._one("job_feed_horizon", {})
        assert row is not None
        return int(row["xmin"])

    async def trim_job_feed(self, *, before_xid: int, batch_size: int) -> int:
        """Deletes up to `batch_size` feed rows of transactions older than `before_xid`; how many."""
        cursor = await self._send("trim_job_feed", {"before_xid": str(before_xid), "batch_size": batch_size})
        return max(0, cursor.rowcount)

    async def job_feed_hint(self, *, sender: str) -> None:
        await self._send("job_feed_hint", {"sender": sender})
