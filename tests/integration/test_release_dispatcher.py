"""The release dispatcher of an idle replica sleeps.

With nothing PENDING, the earliest due release is unknown and the claiming loop must wait for a
wake (a PENDING job nobody claimed, a sweep, a retry) or its idle timeout. It once read "nothing
pending" as "due now" (`GREATEST(0, NULL)` is 0 in PostgreSQL) and ran a claim and a due-time
query back to back, hundreds of times a second on every replica, loaded or not.
"""

from __future__ import annotations

import asyncio
import urllib.request

import psycopg

from queue_service.dev.core import AnswerFault
from queue_service.dev.embedded_postgres import free_port
from tests.harness import S, new_user


def _claim_passes(metrics_port: int) -> float:
    """The replica's own count of claiming passes (its `queue.release.claim_passes` counter)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line.startswith("queue_release_claim_passes_total{")
    )


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
    user = new_user()
    await replica.stubs.grant(user, 2)
    first = await replica.stubs.admit(user)
    second = await replica.stubs.admit(user)
    assert second.status == S.JOB_STATUS_QUEUED
    await replica.stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    before = _claim_passes(metrics_port)
    await asyncio.sleep(6.0)
    passes = _claim_passes(metrics_port) - before
    # Longer than the idle timeout, so a pass the admit's short-lived PENDING state scheduled has
    # come and gone: one or two passes, not hundreds.
    assert passes <= 2, f"the dispatcher ran {passes:.0f} claiming passes in 6 s with nothing pending"


def _release_marks(metrics_port: int) -> tuple[float, float]:
    """(statements, jobs) of the replica's `queue.release.marks_per_statement` histogram."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    totals = {"count": 0.0, "sum": 0.0}
    for line in exposition.splitlines():
        for part in totals:
            if line.startswith(f"queue_release_marks_per_statement_{part}"):
                totals[part] += float(line.rsplit(" ", 1)[1])
    return totals["count"], totals["sum"]


async def test_releases_accepted_while_a_mark_runs_are_marked_running_in_the_next_statement(services, database_url) -> None:  # type: ignore[no-untyped-def]
    core = await services.core()
    metrics_port = free_port()
    replica = await services.start_process(core, QUEUE_LOG_LEVEL="warning", QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}")

    # The first job's release is answered late; meanwhile its row is held by another
    # transaction, so the statement that marks it RUNNING waits (a slow database).
    core.answer_faults["ReleaseRun"] = AnswerFault("late", seconds=1.0)
    first_user = new_user()
    await replica.stubs.grant(first_user, 1)
    first = await replica.stubs.admit(first_user)
    assert first.status == S.JOB_STATUS_PENDING
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM analysis_jobs WHERE job_id = %s FOR UPDATE", (first.job_id,))
            core.answer_faults.clear()
            for _ in range(200):
                if await _mark_is_waiting(database_url):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the first job's release was never marked: no statement waited for its row")

            # Twenty more users' first jobs: their releases are accepted at once, and their
            # marks wait for the statement in flight.
            users = [new_user() for _ in range(20)]
            await asyncio.gather(*(replica.stubs.grant(user, 1) for user in users))
            jobs = await asyncio.gather(*(replica.stubs.admit(user) for user in users))
            released = {run_id for run_id, _ in core.release_log}
            while not {job.run_id for job in jobs} <= released:
                await asyncio.sleep(0.05)
                released = {run_id for run_id, _ in core.release_log}
            await asyncio.sleep(0.2)
            assert {(await replica.stubs.job(job.job_id)).status for job in jobs} == {S.JOB_STATUS_PENDING}
            assert _release_marks(metrics_port) == (0, 0)

    for job in [first, *jobs]:
        await replica.stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    statements, marked = _release_marks(metrics_port)
    assert marked == 21
    # The first job alone, then the twenty whose answers came while it waited.
    assert statements == 2, f"{statements:.0f} statements marked 21 releases"


async def _mark_is_waiting(database_url: str) -> bool:
    """Whether a statement marking releases RUNNING waits for a row lock."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as probe:
        row = await (
            await probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%released(job_id, attempt)%'"
            )
        ).fetchone()
    return row is not None and row[0] > 0
