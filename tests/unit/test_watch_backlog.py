"""A WatchJobs stream's backlog: bounded in estimated bytes, dropped for a resync when full, and
what a stream remembers of the jobs it reported active (queue_seqs, 8 bytes each)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid

from queue_service.engine.watch_stream import SeqSet, VanishedJob, WatchItem, WatchStream, estimated_bytes
from queue_service.model import JobStatus, JobView


def _view(seq: int, status: JobStatus = JobStatus.RUNNING, last_error: str = "") -> JobView:
    now = dt.datetime.now(dt.UTC)
    return JobView(
        job_id=uuid.uuid4(),
        user_id="ada",
        run_id=uuid.uuid4(),
        status=status,
        delta_of_job_id=None,
        release_attempts=0,
        last_error=last_error,
        create_time=now,
        promote_time=None,
        start_time=None,
        end_time=None,
        price=1,
        refunded=False,
        queue_seq=seq,
        queue_position=0,
        waiting_for_job_id=None,
        active_since=None,
        max_active_override=None,
    )


async def _next_now(stream: WatchStream) -> WatchItem | None:
    return await asyncio.wait_for(stream.next(), 1)


async def test_the_backlog_holds_what_fits_and_a_change_beyond_it_drops_it_for_a_resync() -> None:
    item_bytes = estimated_bytes(_view(1))
    stream = WatchStream("ada", backlog_bytes=3 * item_bytes)
    items = [WatchItem(_view(seq)) for seq in range(1, 6)]
    for item in items[:3]:
        stream.offer(item)
    assert [await _next_now(stream) for _ in range(3)] == items[:3], "what fits is sent in order"

    for item in items[:4]:  # one more than fits
        stream.offer(item)
    assert await _next_now(stream) is None, "a full backlog is dropped and the reader resyncs first"
    stream.offer(items[4])
    assert await _next_now(stream) == items[4], "changes after the drop follow the resync"


async def test_a_long_error_text_counts_against_the_backlog() -> None:
    stream = WatchStream("ada", backlog_bytes=8 * 1024)
    stream.offer(WatchItem(_view(1, last_error="x" * 10_000)))
    assert await _next_now(stream) is None


async def test_a_resync_request_drops_what_waits() -> None:
    stream = WatchStream("ada", backlog_bytes=64 * 1024)
    stream.offer(WatchItem(_view(1)))
    stream.resync()
    assert await _next_now(stream) is None
    later = WatchItem(_view(2))
    stream.offer(later)
    assert await _next_now(stream) == later


async def test_a_resync_keeps_the_jobs_that_vanished() -> None:
    """No resync read finds a deleted job again, so a resync that dropped its vanished message
    would leave the stream's last view of it for good (I11): the message outlives the resync."""
    stream = WatchStream("ada", backlog_bytes=64 * 1024)
    pruned = VanishedJob(uuid.uuid4(), "ada")
    stream.offer(WatchItem(_view(1)))
    stream.offer(pruned)
    stream.resync()
    assert await _next_now(stream) is None, "the resync first"
    assert await _next_now(stream) == pruned, "then the vanished job, which no read can bring back"


def test_a_stream_remembers_active_jobs_by_queue_seq_and_forgets_ended_ones() -> None:
    stream = WatchStream("ada", backlog_bytes=64 * 1024)
    running = _view(7)
    for view in (_view(9, JobStatus.QUEUED), running, _view(3, JobStatus.PENDING), running):
        stream.saw(WatchItem(view))
    assert stream.active_seqs.tolist() == [3, 7, 9]
    stream.saw(WatchItem(dataclasses.replace(running, status=JobStatus.SUCCEEDED)))
    assert stream.active_seqs.tolist() == [3, 9]
    assert stream.newest_seq == 9


def test_a_seq_set_is_a_set() -> None:
    seqs = SeqSet()
    for seq in (5, 1, 5, 3, 9, 1):
        seqs.add(seq)
    seqs.discard(4)
    seqs.discard(3)
    assert seqs.tolist() == [1, 5, 9] and len(seqs) == 3
