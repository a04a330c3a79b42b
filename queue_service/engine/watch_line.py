"""The fleet-wide line as the watch hub's streams show it: the places of the jobs waiting for capacity.

A job waiting for the fleet's capacity shows its place in the fleet-wide line (`capacity_position`)
and an estimate from it, which move when other users' jobs change (a grant, a job leaving the line,
a run ending): changes the feed announces as theirs, not as this job's. `ShownLine` keeps which
waiting jobs the hub's streams show and what it last offered of each; when a read of the feed finds
a change of any user that may have moved the line (`FeedRead.line_moved`), the hub re-reads those
jobs in one statement (`reread`), at most every `LINE_REREAD_SPACING_SECONDS` however many changes
came, and offers the ones whose place or estimate changed. They are also re-read every
`LINE_REREAD_EVERY_SECONDS` while there are any, for what moves an estimate without a job's change
(the operator's capacity, the mean judging time).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping

from queue_service import telemetry
from queue_service.engine.job_reads import JobReads
from queue_service.engine.watch_stream import WatchItem, WatchStream
from queue_service.model import JobView
from queue_service.store import Statements

# The places in line of the waiting jobs this replica's streams show are re-read at most this often
# after changes that may have moved the line, one statement for all of them.
LINE_REREAD_SPACING_SECONDS = 0.2
# ...and at least this often while any are shown, changes or not.
LINE_REREAD_EVERY_SECONDS = 5.0

# A waiting job as offered, its estimate as what it was made from: the view without the estimate,
# and the mean judging time and capacity limit when its place is not the first (the first place's
# estimate is the read's own moment).
_LineKey = tuple[JobView, tuple[float | None, int | None] | None]


class ShownLine:
    def __init__(self, reads: JobReads) -> None:
        self._reads = reads
        # The jobs waiting for capacity that streams show, by user: what was last offered to every
        # stream of the user (`_LineKey`), or None when unknown (a snapshot or resync read it).
        self._shown: dict[str, dict[uuid.UUID, _LineKey | None]] = {}
        # A change may have moved the line since the last re-read of those jobs.
        self._moved = False
        self._read_at = float("-inf")

    def __bool__(self) -> bool:
        """Whether any stream shows a waiting job."""
        return bool(self._shown)

    def forget_user(self, user_id: str) -> None:
        """The user's last stream closed."""
        self._shown.pop(user_id, None)

    def may_have_moved(self, moved: bool) -> None:
        self._moved = self._moved or moved

    def reread_due_in(self) -> float:
        """Seconds until the line is due to be re-read (0: now)."""
        due = self._read_at + (LINE_REREAD_SPACING_SECONDS if self._moved else LINE_REREAD_EVERY_SECONDS)
        return max(0.0, due - time.monotonic())

    def reread_due(self) -> bool:
        since = time.monotonic() - self._read_at
        return since >= LINE_REREAD_EVERY_SECONDS or (self._moved and since >= LINE_REREAD_SPACING_SECONDS)

    def _key(self, view: JobView) -> _LineKey:
        """What a stream shows of a waiting job, its estimate as the place and basis it was made from
        (the estimate's own moment is the read's clock)."""
        basis = self._reads.estimate_basis() if view.capacity_position > 1 else None
        return dataclasses.replace(view, estimated_start_time=None), basis

    def offered(self, view: JobView) -> None:
        """Records what was offered to every stream of the job's user, for the line's re-reads."""
        shown = self._shown.get(view.user_id)
        if view.waiting_for_capacity:
            if shown is None:
                shown = self._shown[view.user_id] = {}
            shown[view.job_id] = self._key(view)
        elif shown is not None:
            shown.pop(view.job_id, None)
            if not shown:
                del self._shown[view.user_id]

    def caught_up(self, view: JobView) -> None:
        """A snapshot or resync sent a waiting job, read apart from what the user's other streams
        were offered: when that differs, the next re-read of the line offers the job to them all.
        The line may have moved since that read, while the hub's reads of the feed did not ask
        (no waiting job shown yet): the next read re-reads it."""
        shown = self._shown.setdefault(view.user_id, {})
        key = self._key(view)
        if view.job_id not in shown:
            shown[view.job_id] = key
            self._moved = True
        elif shown[view.job_id] != key:
            shown[view.job_id] = None
            self._moved = True

    async def reread(self, db: Statements, streams: Mapping[str, set[WatchStream]]) -> None:
        """Re-reads the waiting jobs the streams show and offers those whose place in line (or its
        estimate) is not what was last offered: their places move with other users' changes."""
        self._moved = False
        self._read_at = time.monotonic()
        for user_id in [user_id for user_id in self._shown if user_id not in streams]:
            del self._shown[user_id]
        job_ids = [job_id for shown in self._shown.values() for job_id in shown]
        if not job_ids:
            return
        views = await self._reads.estimated(await db.job_views_by_ids(job_ids=job_ids), db)
        telemetry.metrics.watch_line_rereads.add(1)
        read = {view.job_id for view in views}
        for view in views:
            shown = self._shown.get(view.user_id)
            if shown is None or view.job_id not in shown:
                continue  # its stream closed meanwhile
            if view.waiting_for_capacity and shown[view.job_id] == self._key(view):
                continue
            self.offered(view)
            item = WatchItem(view)
            for stream in list(streams.get(view.user_id, ())):
                stream.offer(item)
        # A job that no longer exists (a failover lost it) is the resync's to report. (Jobs a
        # snapshot added during the read are kept.)
        lost = set(job_ids) - read
        for user_id, shown in list(self._shown.items()):
            for job_id in lost.intersection(shown):
                del shown[job_id]
            if not shown:
                del self._shown[user_id]
