"""The watch hub: each replica's reader of the job-change feed, fanned out to the dispatcher and to
WatchJobs streams.

The table's trigger records every change a job's view shows (its status, error or release
attempts; a refund without a status change records itself) in the job-change feed
(`store/feed.py`), whichever replica (or code version) made it. The hub reads the changes
committed since its previous read, in the order each job's changes committed, reads each changed
job's view and hands it to every stream of that user on this replica, with the user's queued
jobs when the change moves them. It reads when this replica has committed a change, when another
replica's wake-up hint arrives (a NOTIFY sent after that replica's commit, on a connection that
only LISTENs), and on a timer; with no stream open, only on a slow timer that keeps its cursor
fresh (what it then reads is PENDING jobs nobody claimed, which the dispatcher's own pass claims
within 5 s too). The feed's cursor is this process's, so a lost
connection loses no change. When the hint connection drops, when the cursor is too old to trust
(the feed's rows are deleted after a retention) or too much came at once (or a slow reader's
backlog is dropped), each stream resyncs, re-reading every job it may have missed, ended ones
included, so that a stream's last message for a job is what GetJob returns (I11). A job the
pruner deleted is announced too (its DELETE's feed row): finding no view for it, the hub tells
its user's streams it vanished.

A job waiting for the fleet's capacity shows its place in the fleet-wide line, which moves with
other users' changes: the hub re-reads the places its streams show (`watch_line.ShownLine`).

What one stream holds is bounded whatever its user's jobs and however slowly its client reads
(docs/operations.md, section 11): the snapshot and a resync are read and sent a
page (`CATCH_UP_PAGE` jobs) at a time; the changes waiting for a slow reader are capped in
estimated bytes, beyond which they are dropped for a resync; and what a stream remembers of the
jobs it reported active is their queue_seq, 8 bytes each.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncGenerator, Callable

from queue_service import errors, telemetry
from queue_service.background import SupervisedLoop
from queue_service.engine.job_reads import JobReads
from queue_service.engine.watch_line import ShownLine
from queue_service.engine.watch_stream import NO_JOB, VanishedJob, WatchItem, WatchPage, WatchStream
from queue_service.model import JobStatus, JobView
from queue_service.store import JobChange, Statements, Store
from queue_service.store.feed import MAX_ROWS_PER_READ, STALE_AFTER_SECONDS, FeedCursor

log = logging.getLogger(__name__)

# Jobs per page of a snapshot or resync: what a stream holds while its client is slow to take them.
CATCH_UP_PAGE = 50
# With streams open, the feed is read at least this often (a change of a replica whose hint was
# lost, or of a writer that sends none, waits at most this long).
READ_EVERY_SECONDS = 1.0
# With no stream open, only PENDING jobs nobody claimed matter, and the dispatcher's own claiming
# pass finds those within its idle timeout (5 s) as well: the feed is read, not on commits or
# hints, only often enough that its cursor never goes stale (a replica that stays idle is not woken
# every 5 s for it).
READ_EVERY_IDLE_SECONDS = STALE_AFTER_SECONDS / 2
# Reads come at most this close together, however many commits wake the reader: a replica whose
# streams watch a few users among many busy ones reads the feed at most 100 times a second, each
# read taking all that committed meanwhile.
_MIN_READ_SPACING_SECONDS = 0.01
# A read re-done because streams subscribed while it ran, at most this often before reading all.
_FILTERED_READ_TRIES = 3
# How long a stream's first read waits for the hub's first read of the feed.
_FEED_READY_SECONDS = 10.0
# A failed read of the feed is retried after 0.1 s, doubling to at most this.
_READ_RETRY_MAX_SECONDS = 5.0


def _changes_the_users_queue(change: JobChange, views: list[JobView]) -> bool:
    """Whether the change shows the user's queued jobs differently: a job that leaves the queue
    moves everyone behind it up (`queue_position`, `waiting_for_job_id`), and a first-pass job
    that leaves PENDING or RUNNING is no longer what the first queued job waits behind (when it
    ends unsettled, no promotion follows to say so) nor the start its estimate counts from."""
    old_status, status = change.old_status, change.status
    if old_status is None or old_status is status:
        return False
    if old_status == JobStatus.QUEUED:
        return True
    return old_status in (JobStatus.PENDING, JobStatus.RUNNING) and any(view.delta_of_job_id is None for view in views)


class NotificationHub:
    def __init__(
        self,
        store: Store,
        reads: JobReads,
        *,
        on_pending: Callable[[], None],
        max_streams_per_user: int,
        backlog_bytes: int,
        reconnect_max_seconds: float = 5.0,
    ) -> None:
        self._store = store
        self._reads = reads
        self._backlog_bytes = backlog_bytes
        self._max_streams_per_user = max_streams_per_user
        self._streams: dict[str, set[WatchStream]] = defaultdict(set)
        self._stream_count = 0
        # Open streams by (caller, user): the per-user cap counts each caller's own, so one
        # caller's streams never lock another (an operator, another web backend) out of a user.
        self._per_caller: collections.Counter[tuple[str, str]] = collections.Counter()
        # The feed's reader and the hints' listener: two supervised loops (`background`).
        self._reader = self._feed_reader_loop()
        self._hint_listener = self._hint_listener_loop(reconnect_max_seconds)
        # Where the reader is in the feed (None: not started), and whether its wait is for
        # commits (streams were open when it began) or for a subscription.
        self._cursor: FeedCursor | None = None
        self._waiting_for_commits = False
        # A job became PENDING without its release claimed (by a replica of an earlier version):
        # this replica's dispatcher may release it too.
        self._on_pending = on_pending
        # Set by this replica's commits of job changes (the store's), by other replicas' hints and
        # by a subscription: the reader reads the feed (while streams are open).
        self._wake = store.hints.local
        self._hinted = False
        self._subscribed = asyncio.Event()
        # Counts subscriptions: a read filtered to the users with streams is re-done when one
        # subscribed while it ran.
        self._subscriptions = 0
        # Set once the feed has a cursor: a stream's snapshot is read after it, so every change
        # committed after the snapshot is read from the feed.
        self._feed_ready = asyncio.Event()
        # Set while the hint connection LISTENs.
        self.listening = asyncio.Event()
        # Set when the database was replaced (a failover): the feed's cursor, a snapshot of the
        # old primary's transaction ids, means nothing on the new one; start afresh and resync.
        self._cursor_reset = False
        # The places in the fleet-wide line of the waiting jobs the streams show.
        self._line = ShownLine(reads)

    def _feed_reader_loop(self) -> SupervisedLoop:
        """The loop that reads the job-change feed (`_read_step`), retried with a back-off."""
        return SupervisedLoop(
            "notification-hub",
            self._read_step,
            interval_seconds=READ_EVERY_SECONDS,
            expected=(errors.QueueError,),
            # Woken by this replica's commits and other replicas' hints while streams are open,
            # else by a subscription only; a failed read waits its back-off whatever wakes.
            wake=self._wake_for_next_read,
            wake_ends_backoff=False,
            backoff_seconds=(0.1, _READ_RETRY_MAX_SECONDS),
            failure_log=("job-change feed read failed (%r); retrying", "job-change feed read failed; retrying"),
        )

    def _hint_listener_loop(self, reconnect_max_seconds: float) -> SupervisedLoop:
        """The loop that LISTENs for other replicas' hints (`_listen_for_hints`), reconnecting
        with a back-off of at most `reconnect_max_seconds`."""
        return SupervisedLoop(
            "feed-hint-listener",
            self._listen_for_hints,
            interval_seconds=0.0,
            # Whatever drops the connection is a warning: the reader goes on without hints.
            expected=(Exception,),
            backoff_seconds=(0.1, reconnect_max_seconds),
            failure_log=(
                "feed hint listener lost its connection (%r); reconnecting",
                "feed hint listener lost its connection; reconnecting",
            ),
        )

    @property
    def open_streams(self) -> int:
        """WatchJobs streams open on this replica now."""
        return sum(len(streams) for streams in self._streams.values())

    def start(self) -> None:
        self._reader.start()
        self._hint_listener.start()

    async def stop(self) -> None:
        await self._hint_listener.stop()
        await self._reader.stop()
        self._resync_all()

    def subscribe(self, user_id: str, *, caller: str = "") -> WatchStream:
        """A stream of `user_id`'s jobs for `caller` (who the call's credentials name). The replica's
        streams and each caller's share of them are the call gate's (`api/road/gate.py`); what is
        counted here is what only the hub knows: a caller's streams of one user, so one user's
        tabs never take her web backend's whole share."""
        if self._per_caller[(caller, user_id)] >= self._max_streams_per_user:
            raise errors.TooManyStreams(
                f"this caller has {self._max_streams_per_user} open WatchJobs streams of this user (the maximum); close one",
                metadata={"maxStreamsPerUser": str(self._max_streams_per_user)},
            )
        stream = WatchStream(user_id, backlog_bytes=self._backlog_bytes, caller=caller)
        self._streams[user_id].add(stream)
        self._per_caller[(caller, user_id)] += 1
        self._stream_count += 1
        self._subscriptions += 1
        self._subscribed.set()
        telemetry.metrics.watch_streams.add(1)
        return stream

    def unsubscribe(self, stream: WatchStream) -> None:
        streams = self._streams.get(stream.user_id)
        if streams is not None and stream in streams:
            streams.discard(stream)
            self._stream_count -= 1
            key = (stream.caller, stream.user_id)
            self._per_caller[key] -= 1
            if self._per_caller[key] <= 0:
                del self._per_caller[key]
            telemetry.metrics.watch_streams.add(-1)
            if not streams:
                del self._streams[stream.user_id]
                self._line.forget_user(stream.user_id)

    async def _read_step(self) -> float:
        """One step of the reader: the changes committed since the previous read (a fresh cursor
        first, and whenever the old one cannot be trusted); the seconds the next read may wait
        for a wake-up (`_wake_for_next_read`)."""
        woken_by = await self._woken_by()
        cursor = self._cursor
        if cursor is None or self._cursor_reset or time.monotonic() - cursor.read_at > STALE_AFTER_SECONDS:
            reset, self._cursor_reset = self._cursor_reset, False
            async with self._store.statements() as db:
                fresh = await db.job_feed_start()
            if reset:
                log.warning("the database was replaced; the job-change feed starts afresh and streams resync")
                self._missed_changes()
            elif cursor is not None:
                # Rows this replica had not read may have been deleted meanwhile.
                log.warning("the job-change feed was not read for %.0f s; streams resync", fresh.read_at - cursor.read_at)
                self._missed_changes()
            self._cursor = fresh
            self._feed_ready.set()
        else:
            self._cursor = await self._read(cursor, woken_by)
        streams_open = self._stream_count > 0
        self._waiting_for_commits = streams_open
        timeout = READ_EVERY_SECONDS if streams_open else READ_EVERY_IDLE_SECONDS
        if self._line:
            # The next read also re-reads the line once due.
            timeout = min(timeout, self._line.reread_due_in())
        return timeout

    def _wake_for_next_read(self) -> asyncio.Event:
        """What ends the reader's wait: a commit or a hint while streams are open, else a subscription."""
        return self._wake if self._waiting_for_commits else self._subscribed

    async def _woken_by(self) -> str:
        """What woke the reader for this read; after a wake-up (not the first read, not a retry)
        the reads are spaced and the wake-ups cleared, so what commits during the read wakes the
        next one."""
        if self._reader.failures_in_a_row:
            return "retry"
        if self._cursor is None:
            return "start"
        if self._reader.woken_by == "event":
            woken_by = "hint" if self._hinted else "local" if self._waiting_for_commits else "subscribe"
        else:
            woken_by = "timer"
        spacing = self._cursor.read_at + _MIN_READ_SPACING_SECONDS - time.monotonic()
        if spacing > 0:
            await asyncio.sleep(spacing)
        self._wake.clear()
        self._subscribed.clear()
        self._hinted = False
        return woken_by

    async def _read(self, cursor: FeedCursor, woken_by: str) -> FeedCursor:
        """Hands on the changes committed since `cursor`; the cursor to read from next. The
        changed jobs' views are read on the same connection; when a read fails, the caller reads
        again from the same cursor (a stream may get a view twice, never miss one)."""
        async with self._store.statements() as db:
            for attempt in range(_FILTERED_READ_TRIES + 1):
                subscriptions = self._subscriptions
                user_ids = list(self._streams) if attempt < _FILTERED_READ_TRIES else None
                read = await db.job_feed_since(cursor, user_ids=user_ids, limit=MAX_ROWS_PER_READ, watch_line=bool(self._line))
                if user_ids is None or self._subscriptions == subscriptions:
                    break
                # A stream subscribed while the read ran: its user's changes were left out, and
                # the stream's snapshot may have been read before they committed. Read them again.
            metrics = telemetry.metrics
            metrics.feed_reads.add(1, {"woken_by": woken_by, "complete": read.complete})
            metrics.feed_rows_per_read.record(len(read.changes))
            if not read.complete:
                log.warning("more than %d job changes came in one read of the feed; streams resync", MAX_ROWS_PER_READ)
                self._missed_changes()
                return read.cursor
            for change in read.changes:
                metrics.feed_lag.record(change.lag_seconds)
                await self._dispatch(change, db)
            self._line.may_have_moved(read.line_moved)
            if self._line and self._line.reread_due():
                await self._line.reread(db, self._streams)
        return read.cursor

    async def _listen_for_hints(self) -> None:
        """Wakes the reader when another replica's hint arrives, for as long as the connection
        lives (its loss raises: the loop reconnects, backing off); resyncs the streams once it
        reconnected after a loss (no change is lost with it, but none was heard early either)."""
        own = self._store.hints.sender
        try:
            async with self._store.feed_hints() as hints:
                if self._hint_listener.failures_in_a_row:
                    self._missed_changes()
                self._hint_listener.recovered()
                self.listening.set()
                async for sender in hints:
                    if sender != own:
                        self._hinted = True
                        self._wake.set()
        except Exception:
            self.listening.clear()
            raise

    def database_replaced(self) -> None:
        """The database is another one now (a failover): commits the streams heard of may be
        gone. The feed restarts from the new primary's present and every stream resyncs, told of
        each job it reported active that no longer exists (WatchJobsResponse.vanished)."""
        self._cursor_reset = True
        self._wake.set()
        self._subscribed.set()

    def _missed_changes(self) -> None:
        """Changes may not reach the streams from the feed: they resync; and a PENDING job
        nobody claimed may be among them."""
        self._resync_all()
        self._on_pending()
        self._wake.set()

    def _resync_all(self) -> None:
        for streams in self._streams.values():
            for stream in streams:
                stream.resync()

    async def _dispatch(self, change: JobChange, db: Statements) -> None:
        user_id, job_id = change.user_id, change.job_id
        if change.left_unclaimed_pending:
            self._on_pending()
        streams = self._streams.get(user_id)
        if not streams:
            return
        views = await db.job_views_by_ids(job_ids=[job_id])
        if not views:
            # The job is gone (the pruner deleted it past its retention, announcing it): its
            # streams' last message for it says so, as GetJob answers NOT_FOUND (I11).
            gone = VanishedJob(job_id, user_id)
            for stream in list(streams):
                stream.offer(gone)
        if _changes_the_users_queue(change, views):
            views += await db.queued_job_views_of_user(user_id=user_id)
        items = [WatchItem(view) for view in await self._reads.estimated(views, db)]
        for item in items:
            self._line.offered(item.job)
        for stream in list(streams):
            for item in items:
                stream.offer(item)

    async def catch_up(self, stream: WatchStream, *, resync: bool) -> AsyncGenerator[WatchPage, None]:
        """The first snapshot (the user's active jobs) or, after a gap in the stream's changes,
        a resync: every job that may have changed meanwhile, ended ones included (I11). Read a
        page at a time in queue order, each on a connection of its own that is back in the pool
        before the page is handed on, so a slow reader holds one page and no connection. Marks
        the jobs seen as it goes.

        Pages are read at different moments; what changes between them reaches the stream as
        changes after the last page (the stream is subscribed before the first read)."""
        if not self._feed_ready.is_set():
            try:
                await asyncio.wait_for(self._feed_ready.wait(), _FEED_READY_SECONDS)
            except TimeoutError:
                raise errors.DatabaseUnavailable("this replica has not read the job-change feed yet; retry the call") from None
        user_id = stream.user_id
        reported_active = stream.active_seqs.items() if resync else []
        active_seqs = [seq for seq, _ in reported_active]
        resent: set[uuid.UUID] = set()
        newest_known_seq = stream.newest_seq
        newest_seq = 0
        after_seq = 0
        first = True
        while True:
            async with self._store.statements() as db:
                if first:
                    # Read before the jobs: those admitted after it come in later pages, or as changes.
                    newest_seq = await db.newest_seq_of_user(user_id=user_id)
                    first = False
                if resync:
                    views = await db.watch_resync_views(
                        user_id=user_id, seqs=active_seqs, newest_known_seq=newest_known_seq, after_seq=after_seq, limit=CATCH_UP_PAGE + 1
                    )
                else:
                    views = await db.active_job_views_of_user(user_id=user_id, after_seq=after_seq, limit=CATCH_UP_PAGE + 1)
                views = await self._reads.estimated(views, db)
            last = len(views) <= CATCH_UP_PAGE
            items = [WatchItem(view) for view in views[:CATCH_UP_PAGE]]
            for item in items:
                stream.saw(item)
                resent.add(item.job.job_id)
                if item.job.waiting_for_capacity and user_id in self._streams:
                    self._line.caught_up(item.job)
            vanished: list[uuid.UUID] = []
            if last:
                stream.newest_seq = max(stream.newest_seq, newest_seq)
                # A job reported active is read again by the resync whatever became of it,
                # unless it no longer exists: the database that had it failed over without it.
                for seq, job_id in reported_active:
                    if job_id not in resent and job_id != NO_JOB:
                        vanished.append(job_id)
                        stream.active_seqs.discard(seq, job_id)
            yield WatchPage(items, last, vanished)
            if last:
                return
            after_seq = items[-1].job.queue_seq
