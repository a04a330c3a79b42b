"""The release dispatcher of an idle replica sleeps.

With nothing PENDING, the earliest due release is unknown and the claiming loop must wait for a
wake (a PENDING job nobody claimed, a sweep, a retry) or its idle timeout. It once read "nothing
pending" as "due now" (`GREATEST(0, NULL)` is 0 in PostgreSQL) and ran a claim and a due-time
query back to back, hundreds of times a second on every replica, loaded or not.
"""

from __future__ import annotations

import asyncio

from queue_service.dev.embedded_postgres import free_port
from tests.harness import metric_total, running_with_one_queued


def _claim_passes(metrics_port: int) -> float:
    """The replica's own count of claiming passes (its `queue.release.claim_passes` counter)."""
    return metric_total(metrics_port, "queue_release_claim_passes_total")


def _feed_timer_reads(metrics_port: int) -> float:
    """The replica's own count of the watch hub's reads of the job-change feed on its timer."""
    return metric_total(metrics_port, "queue_feed_reads_total", woken_by="timer")


async def test_an_idle_replica_does_not_poll_the_database_for_releases(services) -> None:  # type: ignore[no-untyped-def]
    core = await services.core()
    metrics_port = free_port()
    replica = await services.start_process(core, QUEUE_LOG_LEVEL="warning", QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}")

    # No job at all.
    before = _claim_passes(metrics_port)
    assert before >= 1  # the loop's first pass is counted: this reads the right counter
    await asyncio.sleep(2.0)
    passes = _claim_passes(metrics_port) - before
    # The idle timeout is 5 s and the sweeper is off: at most one pass may fall in these 2 s.
    assert passes <= 1, f"the dispatcher ran {passes:.0f} claiming passes in 2 s with no job"

    # Work exists, but nothing is PENDING: a job released and held RUNNING by the manual core, and
    # another QUEUED behind it. No release can come due until something wakes the dispatcher.
    await running_with_one_queued(replica.stubs)
    before = _claim_passes(metrics_port)
    await asyncio.sleep(6.0)
    passes = _claim_passes(metrics_port) - before
    # Longer than the idle timeout, so a pass the admit's short-lived PENDING state scheduled has
    # come and gone: one or two passes, not hundreds.
    assert passes <= 2, f"the dispatcher ran {passes:.0f} claiming passes in 6 s with nothing pending"


async def test_an_idle_replica_without_streams_does_not_poll_the_job_change_feed(services) -> None:  # type: ignore[no-untyped-def]
    """With no WatchJobs stream open, the watch hub reads the feed only to keep its cursor fresh
    (every 30 s): what it would find, a PENDING job nobody claimed, the dispatcher claims within its
    own 5 s. It once read every 5 s, a wake-up and a statement of every idle replica."""
    core = await services.core()
    metrics_port = free_port()
    await services.start_process(core, QUEUE_LOG_LEVEL="warning", QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}")
    await asyncio.sleep(1.0)  # past the first read, which starts the cursor
    before = _feed_timer_reads(metrics_port)
    await asyncio.sleep(11.0)
    reads = _feed_timer_reads(metrics_port) - before
    assert reads == 0, f"the watch hub read the feed {reads:.0f} times on its timer in 11 s with no stream open"
