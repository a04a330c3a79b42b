"""A WatchJobs stream's side of the watch hub: what one call reads from, and what it holds.

The hub (`watch.NotificationHub`) offers each stream the views of its user's changed jobs
(`WatchItem`s); the stream keeps them in a backlog capped in estimated bytes until its client takes
them, and a slow reader's backlog is dropped for a resync. A snapshot or resync is sent a page at a
time (`WatchPage`). What a stream remembers of the jobs it reported active is their queue_seq
(`SeqSet`, 8 bytes each and the job's id), so a resync can cover exactly what it may have missed,
and name the jobs that vanished. A job deleted by the pruner reaches the backlog as a
`VanishedJob`.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import uuid
from array import array
from typing import Any

from queue_service.model import JobView

# What a job waiting in a stream's backlog costs beyond its error text: the view (a dataclass of
# some twenty fields, its UUIDs and timestamps; ~0.8 KB measured) and its place in the backlog.
_ITEM_BYTES = 1024


def estimated_bytes(job: JobView) -> int:
    """What a view waiting in a backlog costs, roughly; its error text is the one unbounded part."""
    return _ITEM_BYTES + len(job.last_error) + len(job.user_id)


@dataclasses.dataclass(frozen=True, eq=False)
class WatchItem:
    """A job's view to send; its queue_seq marks where the stream's knowledge of the user ends.

    One change is one item offered to every stream of its user: `rendered` keeps what the API
    made of it (its message), so a change fanned out to a thousand streams is converted once."""

    job: JobView
    rendered: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)


@dataclasses.dataclass(frozen=True)
class VanishedJob:
    """A job of the stream's user that no longer exists (the pruner deleted it past its retention):
    the stream's last message for it says so (`vanished`), as GetJob answers NOT_FOUND (I11)."""

    job_id: uuid.UUID
    user_id: str


# What a vanished job waiting in a backlog costs: its two ids and its place in the backlog.
_VANISHED_BYTES = 128


@dataclasses.dataclass(frozen=True)
class WatchPage:
    """One page of a snapshot or resync; `last` ends it."""

    items: list[WatchItem]
    last: bool
    # On a resync's last page: jobs the stream had reported active that no longer exist (a
    # failover lost them); each gets a `vanished` message.
    vanished: list[uuid.UUID] = dataclasses.field(default_factory=list)


class SeqSet:
    """A set of queue_seqs kept as a sorted array (8 bytes a job, where a set of UUIDs costs ~130),
    each with the id of its job alongside (16 bytes more), so a resync can name a job that
    vanished (a failover lost it)."""

    def __init__(self) -> None:
        self._seqs = array("q")
        self._ids = bytearray()

    def add(self, seq: int, job_id: uuid.UUID | None = None) -> None:
        at = bisect.bisect_left(self._seqs, seq)
        raw = (job_id or NO_JOB).bytes
        if at == len(self._seqs) or self._seqs[at] != seq:
            self._seqs.insert(at, seq)
            self._ids[at * 16 : at * 16] = raw
        else:
            self._ids[at * 16 : at * 16 + 16] = raw

    def discard(self, seq: int, job_id: uuid.UUID | None = None) -> None:
        """Forgets `seq` (only while it names `job_id`, when given)."""
        at = bisect.bisect_left(self._seqs, seq)
        if at < len(self._seqs) and self._seqs[at] == seq:
            if job_id is not None and bytes(self._ids[at * 16 : at * 16 + 16]) != job_id.bytes:
                return
            del self._seqs[at]
            del self._ids[at * 16 : at * 16 + 16]

    def discard_job(self, job_id: uuid.UUID) -> None:
        """Forgets the job, whatever its seq (a vanished job's is not known)."""
        raw = job_id.bytes
        for at in range(len(self._seqs)):
            if bytes(self._ids[at * 16 : at * 16 + 16]) == raw:
                del self._seqs[at]
                del self._ids[at * 16 : at * 16 + 16]
                return

    def tolist(self) -> list[int]:
        return self._seqs.tolist()

    def items(self) -> list[tuple[int, uuid.UUID]]:
        """(queue_seq, job id) pairs in queue order."""
        return [(seq, uuid.UUID(bytes=bytes(self._ids[i * 16 : i * 16 + 16]))) for i, seq in enumerate(self._seqs)]

    def __len__(self) -> int:
        return len(self._seqs)


NO_JOB = uuid.UUID(int=0)


class WatchStream:
    """What one WatchJobs call reads from: jobs to send, or None when it must resync; and what
    it has told its caller, so a resync can cover exactly what may have been missed."""

    def __init__(self, user_id: str, *, backlog_bytes: int, caller: str = "") -> None:
        self.user_id = user_id
        self.caller = caller
        self._backlog: collections.deque[tuple[WatchItem | VanishedJob, int]] = collections.deque()
        self._backlog_bytes = 0
        self._max_backlog_bytes = backlog_bytes
        self._resync_due = False
        self._ready = asyncio.Event()
        # Jobs last reported active (by queue_seq, which names a job within its user's queue):
        # after a gap they may have ended.
        self.active_seqs = SeqSet()
        # The newest queue_seq reported: jobs after it were admitted during a gap.
        self.newest_seq = 0

    def saw(self, item: WatchItem) -> None:
        """Records that the caller is told of this job's state."""
        job = item.job
        if job.status.is_live:
            self.active_seqs.add(job.queue_seq, job.job_id)
        else:
            self.active_seqs.discard(job.queue_seq)
        self.newest_seq = max(self.newest_seq, job.queue_seq)

    def saw_vanish(self, gone: VanishedJob) -> None:
        """Records that the caller is told the job no longer exists: a resync need not say it again."""
        self.active_seqs.discard_job(gone.job_id)

    def offer(self, item: WatchItem | VanishedJob) -> None:
        cost = _VANISHED_BYTES if isinstance(item, VanishedJob) else estimated_bytes(item.job)
        if self._backlog_bytes + cost > self._max_backlog_bytes:
            # A slow reader: drop its backlog and make it resync from a fresh read instead.
            self.resync()
            return
        self._backlog.append((item, cost))
        self._backlog_bytes += cost
        self._ready.set()

    def resync(self) -> None:
        """Changes may have been missed: the reader re-reads what it may have missed. The jobs
        waiting in the backlog are dropped, since that read comes later and covers them; a job
        that vanished is kept, since no read finds it any more (a resync tells only of the jobs the
        stream reported active: an ended job the pruner deleted would keep its last view, I11)."""
        kept = [(item, cost) for item, cost in self._backlog if isinstance(item, VanishedJob)]
        # Within half the backlog's bytes (a flood of deletions beyond it is the resync's gap).
        kept = kept[-max(0, self._max_backlog_bytes // 2 // _VANISHED_BYTES) :] if kept else kept
        self._backlog.clear()
        self._backlog.extend(kept)
        self._backlog_bytes = sum(cost for _, cost in kept)
        self._resync_due = True
        self._ready.set()

    async def next(self) -> WatchItem | VanishedJob | None:
        """The next job to send (or to say it vanished), or None: resync first."""
        while True:
            if self._resync_due:
                self._resync_due = False
                return None
            if self._backlog:
                item, cost = self._backlog.popleft()
                self._backlog_bytes -= cost
                return item
            self._ready.clear()
            await self._ready.wait()
