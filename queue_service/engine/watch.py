"""The watch hub: one LISTEN connection per replica, fanned out to the dispatcher and to WatchJobs
streams.

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

from queue_service import errors, telemetry
from queue_service.background import cancel_and_wait
from queue_service.engine.job_reads import JobReads
from queue_service.model import JobStatus, JobView
from queue_service.store import Store

log = logging.getLogger(__name__)

_STREAM_BUFFER = 256


@dataclasses.dataclass(frozen=True)
class WatchItem:
    """A job's view to send; its queue_seq marks where the stream's knowledge of the user ends."""

    job: JobView


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
        job = item.job
        if job.status.is_live:
            self.active_job_ids.add(job.job_id)
        else:
            self.active_job_ids.discard(job.job_id)
        self.newest_seq = max(self.newest_seq, job.queue_seq)

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
        self, store: Store, reads: JobReads, *, on_pending: Callable[[], None], max_streams: int, max_streams_per_user: int
    ) -> None:
        self._store = store
        self._reads = reads
        self._max_streams = max_streams
        self._max_streams_per_user = max_streams_per_user
        self._streams: dict[str, set[WatchStream]] = defaultdict(set)
        self._stream_count = 0
        self._runner: asyncio.Task[None] | None = None
        # A job became PENDING without its release claimed (by a replica of an earlier version):
        # this replica's dispatcher may release it too.
        self._on_pending = on_pending
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
                async with self._store.job_changes() as changes:
                    if failures:
                        self._resync_all()
                        self._on_pending()
                    failures = 0
                    self.listening.set()
                    async for payload in changes:
                        await self._dispatch(payload)
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
        if change.get("status") == "pending" and not change.get("release_claimed", False):
            self._on_pending()
        streams = self._streams.get(user_id)
        if not streams:
            return
        try:
            async with self._store.statements() as db:
                views = await db.job_views_by_ids(job_ids=[job_id])
                if change.get("old_status") == JobStatus.QUEUED and change.get("status") != JobStatus.QUEUED:
                    # Everyone behind it moved up: send the new positions too.
                    views += await db.queued_job_views_of_user(user_id=user_id)
                items = [WatchItem(view) for view in await self._reads.estimated(views, db)]
        except errors.QueueError:
            for stream in list(streams):
                stream.offer(None)
            return
        for stream in list(streams):
            for item in items:
                stream.offer(item)

    async def catch_up(self, stream: WatchStream, *, resync: bool) -> list[WatchItem]:
        """The first snapshot (the user's active jobs) or, after a gap in the stream's changes,
        a resync: every job that may have changed meanwhile, ended ones included (I11). Marks
        them seen."""
        user_id = stream.user_id
        async with self._store.statements() as db:
            if resync:
                views = await db.watch_resync_views(user_id=user_id, job_ids=sorted(stream.active_job_ids), after_seq=stream.newest_seq)
            else:
                views = await db.active_job_views_of_user(user_id=user_id)
            newest_seq = await db.newest_seq_of_user(user_id=user_id)
            items = [WatchItem(view) for view in await self._reads.estimated(views, db)]
        for item in items:
            stream.saw(item)
        stream.newest_seq = max(stream.newest_seq, newest_seq)
        return items
