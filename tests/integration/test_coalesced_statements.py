"""Statements that arrive while one of their kind runs are applied together in the next one.

Marking accepted releases RUNNING and applying the core's completions are coalesced
(`engine/coalescer.py`): a lone one runs at once, and a burst shares one statement and one
commit. These tests hold the first statement back with a row lock (a slow database), send more
through the public API, and read each replica's own count of statements and items
(`queue.statement.batch_size`) from its Prometheus endpoint.
"""

from __future__ import annotations

import asyncio
import random
import urllib.request
import uuid
from typing import Any

import psycopg
import psycopg.sql

from queue_service import errors
from queue_service.dev.core import AnswerFault
from queue_service.dev.embedded_postgres import free_port
from queue_service.model import JobStatus, PromotionLimits, RunReportToApply, Transition
from tests.harness import InvariantChecker, S, new_user, running_with_one_queued


def _batches(metrics_port: int, statement: str) -> tuple[float, float]:
    """(statements, items) of the replica's `queue.statement.batch_size` histogram for `statement`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    totals = {"count": 0.0, "sum": 0.0}
    for line in exposition.splitlines():
        for part in totals:
            if line.startswith(f"queue_statement_batch_size_{part}{{") and f'statement="{statement}"' in line:
                totals[part] += float(line.rsplit(" ", 1)[1])
    return totals["count"], totals["sum"]


def _counter(metrics_port: int, name: str, label: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line.startswith(name + "{") and label in line)


# In the first kilobyte of the completions' statement (pg_stat_activity keeps no more of it): its
# owners query.
_COMPLETIONS_STATEMENT = "j.run_id = ANY("


async def _statement_waits_for_a_row(database_url: str, marker: str) -> None:
    """Returns once a statement whose text contains `marker` waits for a row lock."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as probe:
        for _ in range(300):
            cursor = await probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s", (f"%{marker}%",)
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"no statement with {marker!r} ever waited for the held row")


async def _hold_row(conn: psycopg.AsyncConnection[Any], job_id: str) -> None:
    await conn.execute("SELECT 1 FROM analysis_jobs WHERE job_id = %s FOR UPDATE", (job_id,))


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
            await _hold_row(holder, first.job_id)
            core.answer_faults.clear()
            await _statement_waits_for_a_row(database_url, "released(job_id, attempt)")

            # Twenty more users' first jobs: their releases are accepted at once, and their
            # marks wait for the statement in flight.
            users = [new_user() for _ in range(20)]
            await asyncio.gather(*(replica.stubs.grant(user, 1) for user in users))
            jobs = await asyncio.gather(*(replica.stubs.admit(user) for user in users))
            while not {job.run_id for job in jobs} <= {run_id for run_id, _ in core.release_log}:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            assert {(await replica.stubs.job(job.job_id)).status for job in jobs} == {S.JOB_STATUS_PENDING}
            assert _batches(metrics_port, "mark_released") == (0, 0)

    for job in [first, *jobs]:
        await replica.stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    statements, marked = _batches(metrics_port, "mark_released")
    assert marked == 21
    # The first job alone, then the twenty whose answers came while it waited.
    assert statements == 2, f"{statements:.0f} statements marked 21 releases"


async def test_completions_sent_while_one_is_applied_end_their_jobs_in_one_statement(services, database_url) -> None:  # type: ignore[no-untyped-def]
    core = await services.core()
    metrics_port = free_port()
    replica = await services.start_process(core, QUEUE_LOG_LEVEL="warning", QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}")
    first = await running_with_one_queued(replica.stubs)
    others = [await running_with_one_queued(replica.stubs) for _ in range(6)]

    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        async with holder.transaction():
            await _hold_row(holder, first[1].job_id)
            first_completion = asyncio.create_task(core.finish(first[1].run_id, refund_credit=True))
            await _statement_waits_for_a_row(database_url, _COMPLETIONS_STATEMENT)
            completions = [asyncio.create_task(core.finish(running.run_id, refund_credit=True)) for _, running, _ in others]
            await asyncio.sleep(0.3)
            assert not any(completion.done() for completion in completions)  # they wait for the first
            assert _batches(metrics_port, "end_runs") == (0, 0)

    responses = await asyncio.gather(first_completion, *completions)
    assert [response.job.status for response in responses] == [S.JOB_STATUS_SUCCEEDED] * 7
    for _, running, queued in [first, *others]:
        assert (await replica.stubs.job(running.job_id)).status == S.JOB_STATUS_SUCCEEDED
        # Each freed slot went to the user's next job, released at once (handed over, no lease wait).
        await replica.stubs.wait_for(queued.job_id, S.JOB_STATUS_RUNNING, timeout=5)
    statements, completed = _batches(metrics_port, "end_runs")
    assert completed == 7
    assert statements == 2, f"{statements:.0f} statements applied 7 completions"
    # Each refund names the caller that reported it, the batched ones too (not the system).
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT job_id::text, actor FROM credit_ledger WHERE kind = 'refund' AND job_id::text = ANY(%s)",
            ([running.job_id for _, running, _ in [first, *others]],),
        )
        actors = dict(await cursor.fetchall())
    assert len(actors) == 7
    assert len(set(actors.values())) == 1 and not next(iter(actors.values())).startswith("system:"), actors
    assert InvariantChecker(database_url).all_violations() == []


async def test_a_busy_user_in_a_batch_of_completions_holds_up_only_its_own(services, database_url) -> None:  # type: ignore[no-untyped-def]
    core = await services.core()
    metrics_port = free_port()
    replica = await services.start_process(core, QUEUE_LOG_LEVEL="warning", QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}")
    # A replica of another version, say, holds one user's queue lock for a long time.
    other_version = await services.start(core)
    first = await running_with_one_queued(replica.stubs)
    busy = await running_with_one_queued(replica.stubs)
    others = [await running_with_one_queued(replica.stubs) for _ in range(3)]

    async with other_version.app.store.holding_user_queue_lock(busy[0]):
        async with await psycopg.AsyncConnection.connect(database_url) as holder:
            async with holder.transaction():
                await _hold_row(holder, first[1].job_id)
                first_completion = asyncio.create_task(core.finish(first[1].run_id))
                await _statement_waits_for_a_row(database_url, _COMPLETIONS_STATEMENT)
                busy_completion = asyncio.create_task(core.finish(busy[1].run_id))
                completions = [asyncio.create_task(core.finish(running.run_id)) for _, running, _ in others]
                await asyncio.sleep(0.3)
        # The batch of the busy user and the others could not take the busy user's lock: each
        # completion then ran alone, so the others ended while the busy user's lock is still held.
        await asyncio.wait_for(asyncio.gather(first_completion, *completions), timeout=10)
        for _, running, _ in others:
            assert (await replica.stubs.job(running.job_id)).status == S.JOB_STATUS_SUCCEEDED
        assert not busy_completion.done()
        assert (await replica.stubs.job(busy[1].job_id)).status == S.JOB_STATUS_RUNNING
    response = await asyncio.wait_for(busy_completion, timeout=10)
    assert response.job.status == S.JOB_STATUS_SUCCEEDED
    # The first alone; then the batch of four failed as a whole, and each of its completions ran
    # alone: five statements that applied five completions.
    assert _batches(metrics_port, "end_runs") == (5, 5)
    assert _counter(metrics_port, "queue_statement_batch_failures_total", 'statement="end_runs"') == 1
    assert InvariantChecker(database_url).all_violations() == []


async def test_batches_over_overlapping_users_never_deadlock(services) -> None:  # type: ignore[no-untyped-def]
    """Many batches over overlapping users, their runs in random orders, race on real
    connections: each batch takes its users' locks in key order, so none waits in a cycle (a
    deadlock would fail a batch with PostgreSQL's deadlock error)."""
    # A batch waits at most 100 ms for any user's lock, far less than PostgreSQL's deadlock check
    # (1 s by default), so a cycle would end as a plain lock timeout and pass unseen. With the
    # check after 10 ms, a cycle ends as DeadlockDetected (CONFLICT) before any batch gives up
    # waiting; a batch that gave up waiting on a loaded machine is retried, as the engine applies
    # its items again alone.
    with psycopg.connect(services.database_url, autocommit=True) as conn:
        database = conn.info.dbname
        conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET deadlock_timeout = '10ms'").format(psycopg.sql.Identifier(database)))
    service = await services.start(lock_timeout_ms=30_000)
    jobs = []
    for _ in range(12):
        user = new_user()
        await service.stubs.grant(user, 2)
        await service.stubs.admit(user)
        jobs.append(await service.stubs.admit(user))  # QUEUED: its run's report changes nothing
    queued_runs = [uuid.UUID(job.run_id) for job in jobs]
    store, limits = service.app.store, PromotionLimits(1, 1800.0, 15.0)
    rng = random.Random(7)
    gave_up_waiting = [0]

    async def batches(rounds: int) -> int:
        applied = 0
        for _ in range(rounds):
            runs = rng.sample(queued_runs, rng.randint(2, len(queued_runs)))
            reports = [RunReportToApply(run, Transition.completed(succeeded=True, refund=False, message=""), "core:test") for run in runs]
            for _ in range(100):
                try:
                    completions = await store.end_runs(reports, limits)
                    break
                except errors.LockTimeout:
                    gave_up_waiting[0] += 1
            else:
                raise AssertionError("a batch never got its users' locks in 100 tries")
            assert [completion.job.status for completion in completions if completion.job] == [JobStatus.QUEUED] * len(runs)
            applied += len(completions)
        return applied

    try:
        applied = await asyncio.gather(*(batches(15) for _ in range(12)))
    finally:
        with psycopg.connect(services.database_url, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("ALTER DATABASE {} RESET deadlock_timeout").format(psycopg.sql.Identifier(database)))
    assert sum(applied) > 12 * 15 * 2
