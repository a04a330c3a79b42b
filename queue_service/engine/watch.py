"""One LISTEN connection per replica, fanned out to the dispatcher and to WatchJobs streams.

The table's trigger announces every status change on channel `analysis_job_changes`, whichever
replica (or code version) made it. The hub reads each job's view once per change and hands it
to every stream of that user on this replica. When the listening connection drops (or a slow
reader's backlog is dropped), changes may have been missed: each stream then resyncs, re-reading
every job it may have missed, ended ones included, so that a stream's last message for a job is
what GetJob returns (I11).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable

import psycopg

from queue_service import errors, telemetry
from queue_service.store import store as repo
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service.background import cancel_and_wait
from queue_service.store.pool import connection
from queue_service.engine.job_reads import JobViews

log = logging.getLogger(__name__)

CHANNEL = "analysis_job_changes"
_STREAM_BUFFER = 256


_ACTIVE_STATUSES = (job_pb2.JOB_STATUS_QUEUED, job_pb2.JOB_STATUS_PENDING, job_pb2.JOB_STATUS_RUNNING)


@dataclasses.dataclass(frozen=True)
class WatchItem:
    """A job's view to send, with its queue_seq (where the stream's knowledge of the user ends)."""

    seq: int
    job: job_pb2.Job


class WatchStream:
    """What one WatchJobs call reads from: jobs to send, or None when it must resync; and what
    it has told its caller, so a resync can cover exactly what may have been missed."""

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id
        self.queue: asyncio.Queue[WatchItem | None] = asyncio.Queue(maxsize=_STREAM_BUFFER)
        # Jobs last reported active: after a gap they may have ended.
        self.active_job_ids: set[uuid.UUID] = set()
        # The newest queue_seq reported: jobs after it were admitted during a gap.
        self.newest_seq = 0

    def saw(self, item: WatchItem) -> None:
        """Records that the caller is told of this job's state."""
        job_id = uuid.UUID(item.job.job_id)
        if item.job.status in _ACTIVE_STATUSES:
            self.active_job_ids.add(job_id)
        else:
            self.active_job_ids.discard(job_id)
        self.newest_seq = max(self.newest_seq, item.seq)

    def offer(self, item: WatchItem | None) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            # A slow reader: drop its backlog and make it resync from a fresh snapshot.
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)


class NotificationHub:
    def __init__(
        self,
        dsn: str,
        views: JobViews,
        pool,  # type: ignore[no-untyped-def]
        *,
        max_streams: int,
        max_streams_per_user: int,
    ) -> None:
        self._dsn = dsn
        self._views = views
        self._pool = pool
        self._max_streams = max_streams
        self._max_streams_per_user = max_streams_per_user
        self._streams: dict[str, set[WatchStream]] = defaultdict(set)
        self._stream_count = 0
        self._runner: asyncio.Task[None] | None = None
        self.on_pending: Callable[[], None] = lambda: None
        self.listening = asyncio.Event()

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run(), name="notification-hub")

    async def stop(self) -> None:
        await cancel_and_wait(self._runner)
        for streams in self._streams.values():
            for stream in streams:
                stream.offer(None)

    def subscribe(self, user_id: str) -> WatchStream:
        if self._stream_count >= self._max_streams:
            raise errors.TooManyStreams(
                f"this replica has {self._stream_count} open WatchJobs streams (the maximum); retry later",
                metadata={"maxStreams": str(self._max_streams)},
            )
        if len(self._streams[user_id]) >= self._max_streams_per_user:
            raise errors.TooManyStreams(
                f"this user has {self._max_streams_per_user} open WatchJobs streams (the maximum); close one",
                metadata={"maxStreamsPerUser": str(self._max_streams_per_user)},
            )
        stream = WatchStream(user_id)
        self._streams[user_id].add(stream)
        self._stream_count += 1
        telemetry.metrics.watch_streams.add(1)
        return stream

    def unsubscribe(self, stream: WatchStream) -> None:
        streams = self._streams.get(stream.user_id)
        if streams is not None and stream in streams:
            streams.discard(stream)
            self._stream_count -= 1
            telemetry.metrics.watch_streams.add(-1)
            if not streams:
                del self._streams[stream.user_id]

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    if failures:
                        self._resync_all()
                        self.on_pending()
                    failures = 0
                    self.listening.set()
                    async for notice in conn.notifies():
                        await self._dispatch(notice.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                failures += 1
                log.warning("notification listener lost its connection (%s); reconnecting", exc.__class__.__name__)
                await asyncio.sleep(min(5.0, 0.1 * 2**failures))

    def _resync_all(self) -> None:
        for streams in self._streams.values():
            for stream in streams:
                stream.offer(None)

    async def _dispatch(self, payload: str) -> None:
        try:
            change = json.loads(payload)
            user_id = change["user_id"]
            job_id = uuid.UUID(change["job_id"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed job change notice")
            return
        if change.get("status") == "pending":
            self.on_pending()
        streams = self._streams.get(user_id)
        if not streams:
            return
        try:
            async with connection(self._pool) as conn:
                rows = await repo.job_views_by_ids(conn, job_ids=[job_id])
                if change.get("old_status") == "queued" and change.get("status") != "queued":
                    # Everyone behind it moved up: send the new positions too.
                    rows += await repo.queued_job_views_of_user(conn, user_id=user_id)
                mean = await self._views.mean_judging_seconds(conn)
            items = [WatchItem(row["queue_seq"], self._views.to_proto(row, mean)) for row in rows]
        except errors.QueueError:
            for stream in list(streams):
                stream.offer(None)
            return
        for stream in list(streams):
            for item in items:
                stream.offer(item)
