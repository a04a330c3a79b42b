"""The job-change feed: what each replica learns of the changes any replica (or code version)
commits, without a NOTIFY in the committing transaction.

The trigger on `analysis_jobs` appends one row per change to `analysis_job_feed` (migration
0015), with the writing transaction's id (`xid`, an xid8) and an id drawn while the job's row is
locked (`change_id`). A reader keeps, in memory, the snapshot of its previous read (a
`FeedCursor`) and asks for the rows that snapshot could not see: written by a transaction that
was in flight then (its `xip` list) or had not begun (an xid at or past its `xmax`). A committed
row is visible to the new read's snapshot, which becomes the next cursor. So each committed row
is read exactly once, however its commit interleaves with others, and a row whose transaction is
still in flight is never passed over: it is not visible yet, and its xid stays in the cursor's
`xip` until it is. Rows are handed on in `change_id` order, which for any one job is the order
its changes committed (the next change of a job waits for the previous one's row lock, and draws
its id after that commit). The cursor lives in the process, so a lost connection loses nothing;
the sweeper deletes rows of transactions that ended more than `RETENTION_SECONDS` ago, and a
reader that could not read for half of that starts afresh (its caller resyncs).

Wake-ups: a replica that committed a change wakes its own reader at once (`CommitHints.local`)
and tells the others with one NOTIFY on `HINT_CHANNEL` from a short transaction of its own, after
the change has committed, at most one per `HINT_INTERVAL_SECONDS`. The hint carries nothing the
reader needs: a lost hint costs latency, never a change (every reader also reads on a timer).
Such a transaction writes no WAL, so the notify lock it takes is held for microseconds, not
through a WAL flush as it was when every job-changing commit notified.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from queue_service import deadline, telemetry
from queue_service.model import JobStatus

log = logging.getLogger(__name__)

HINT_CHANNEL = "analysis_job_feed"
# At most one hint per replica in this interval: a change another replica's stream shows waits
# for it at most this long beyond its commit.
HINT_INTERVAL_SECONDS = 0.02
# Rows of transactions that ended longer ago than this are deleted by the sweeper.
RETENTION_SECONDS = 120.0
# A reader that has not read for this long may have missed deleted rows: it starts afresh.
STALE_AFTER_SECONDS = RETENTION_SECONDS / 2
# At most this many rows in one read; more means a resync is cheaper than handing them on.
MAX_ROWS_PER_READ = 10_000


@dataclasses.dataclass(frozen=True)
class FeedCursor:
    """Where a reader stands: the snapshot of its last read (`pg_snapshot` text form), and when
    it read (monotonic seconds of this process)."""

    snapshot: str
    read_at: float


@dataclasses.dataclass(frozen=True)
class JobChange:
    """One committed change of a job, as the trigger recorded it: its status before (None: the
    job was inserted) and after, and whether a PENDING job's release was claimed with it (the
    replica that claimed it starts it; nobody else needs to)."""

    change_id: int
    job_id: uuid.UUID
    user_id: str
    status: JobStatus
    old_status: JobStatus | None
    release_claimed: bool
    lag_seconds: float

    @property
    def left_unclaimed_pending(self) -> bool:
        """A job became or stayed PENDING and no replica claimed its release."""
        return self.status is JobStatus.PENDING and not self.release_claimed


@dataclasses.dataclass(frozen=True)
class FeedRead:
    """What one read found; `complete` is False when there were more than the read's limit (the
    changes are then not handed on: the reader resyncs from `cursor`). `line_moved`: a change of
    any user may have moved the fleet's line for capacity (asked for by the read)."""

    cursor: FeedCursor
    changes: list[JobChange]
    complete: bool
    line_moved: bool = False


class CommitHints:
    """This replica's own commits of job changes: its reader is woken at once (`local`), and the
    other replicas by a debounced NOTIFY on `HINT_CHANNEL`, sent from a transaction of its own
    once the change has committed (never inside the committing transaction)."""

    def __init__(self, send: Callable[[str], Awaitable[None]], *, interval: float = HINT_INTERVAL_SECONDS) -> None:
        self._send_hint = send
        self._interval = interval
        # The payload names the sender, so a replica skips its own hints.
        self.sender = uuid.uuid4().hex
        self.local = asyncio.Event()
        self._due = False
        self._last_sent = -interval
        self._sender_task: asyncio.Task[None] | None = None
        self._closed = False

    def committed(self) -> None:
        """Called after a statement that may have changed jobs has committed."""
        self.local.set()
        if self._closed:
            return
        self._due = True
        if self._sender_task is None:
            self._sender_task = deadline.spawn_detached(self._send(), name="feed-hints")

    async def _send(self) -> None:
        try:
            while self._due and not self._closed:
                wait = self._last_sent + self._interval - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._due = False
                self._last_sent = time.monotonic()
                try:
                    await self._send_hint(self.sender)
                    telemetry.metrics.feed_hints_sent.add(1)
                except Exception as exc:  # a lost hint costs latency only: readers also read on a timer
                    log.debug("feed hint not sent: %s", exc)
        finally:
            self._sender_task = None

    async def close(self) -> None:
        self._closed = True
        task = self._sender_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
