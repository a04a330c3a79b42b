"""The job-change feed hands on every committed change exactly once and, per job, in the order the
changes committed, however the committing transactions interleave (store/feed.py).

Writers on their own connections take a transaction id first, wait, change one to three jobs
(each change bumps the job's own version, kept in `last_error`, so the trigger records it),
wait again and commit, or roll back one time in ten. Their commits therefore land in another
order than their transaction ids and their feed rows' ids. A reader reads the feed meanwhile,
on pooled connections, and halfway through goes on from its cursor on a new pool (a reconnect).
At the end, each job's versions as the reader received them must be 1, 2, ... up to the last one
committed: nothing skipped, nothing twice, nothing out of order, nothing of a rolled-back
transaction. The run must also have produced the hazard the feed exists for: rows that became
visible after rows with a higher id had been read (a reader by id would have passed them over).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import psycopg

from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.engine import watch
from queue_service.engine.maintenance import feed_trimmer
from queue_service.store import JOB_CHANGES_CHANNEL, Store
from queue_service.store.feed import HINT_CHANNEL, FeedCursor
from queue_service.store.pool import Timeouts, create_pool
from tests.harness import S, new_user

_JOBS = 6
_WRITERS = 8
_SECONDS = 4.0


def _seed(database_url: str, user: str) -> list[uuid.UUID]:
    jobs = [uuid.uuid4() for _ in range(_JOBS)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # no trigger: the feed starts empty for them
        for job_id in jobs:
            conn.execute(
                "INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price,"
                " last_error, end_time)"
                " VALUES (%s, %s, gen_random_uuid(), %s, '\\x00', 'succeeded', nextval('analysis_jobs_queue_seq'), 0, '0',"
                " clock_timestamp())",
                (job_id, user, f"feed-{job_id}"),
            )
    return jobs


def _store(database_url: str) -> Store:
    pool = create_pool(database_url, timeouts=Timeouts(5000, 10000), min_size=1, max_size=2, timeout=5, name="feed-reader")
    return Store(pool, database_url=database_url)


async def _writer(database_url: str, jobs: list[uuid.UUID], until: float, committed: dict[uuid.UUID, int], rng: random.Random) -> int:
    """Commits changes until `until`; records each job's newest committed version."""
    commits = 0
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        while time.monotonic() < until:
            chosen = sorted(rng.sample(jobs, rng.randint(1, 3)))  # in key order: no deadlocks
            async with conn.transaction(force_rollback=rng.random() < 0.1) as tx:
                await conn.execute("SELECT pg_current_xact_id()")  # the transaction id, drawn early
                await asyncio.sleep(rng.uniform(0, 0.01))
                versions = {}
                for job_id in chosen:
                    cursor = await conn.execute(
                        "UPDATE analysis_jobs SET last_error = (last_error::int + 1)::text WHERE job_id = %s RETURNING last_error",
                        (job_id,),
                    )
                    row = await cursor.fetchone()
                    assert row is not None
                    versions[job_id] = int(row[0])
                    await asyncio.sleep(rng.uniform(0, 0.005))
                rolled_back = tx.force_rollback
            if not rolled_back:
                commits += 1
                for job_id, version in versions.items():
                    committed[job_id] = max(committed.get(job_id, 0), version)
    return commits


async def test_racing_commits_reach_the_reader_once_each_and_in_commit_order_per_job(database_url: str) -> None:
    user = new_user()
    jobs = _seed(database_url, user)
    # Each feed row's version: the trigger does not record last_error, so a companion trigger on
    # the test's rows copies it into a side table keyed by the feed row's id, in the same transaction.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """
            CREATE TABLE IF NOT EXISTS test_feed_versions (change_id bigint PRIMARY KEY, version integer NOT NULL);
            CREATE OR REPLACE FUNCTION test_feed_version() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO test_feed_versions (change_id, version)
                SELECT f.change_id, NEW.last_error::int
                  FROM analysis_job_feed f
                 WHERE f.xid = pg_current_xact_id() AND f.job_id = NEW.job_id
                 ORDER BY f.change_id DESC LIMIT 1;
                RETURN NULL;
            END $$;
            DROP TRIGGER IF EXISTS zz_test_feed_version ON analysis_jobs;
            CREATE TRIGGER zz_test_feed_version AFTER UPDATE ON analysis_jobs FOR EACH ROW
              WHEN (NEW.idempotency_key LIKE 'feed-%%' AND OLD.last_error IS DISTINCT FROM NEW.last_error)
              EXECUTE FUNCTION test_feed_version();
            """
        )
    received: dict[uuid.UUID, list[int]] = {job_id: [] for job_id in jobs}
    change_ids: list[int] = []
    late = 0  # rows read after a row with a higher id had been read
    reads = 0
    committed: dict[uuid.UUID, int] = {}
    store = _store(database_url)
    await store.open(timeout=10)
    try:
        async with store.statements() as db:
            cursor: FeedCursor = await db.job_feed_start()
        until = time.monotonic() + _SECONDS
        writers = [asyncio.create_task(_writer(database_url, jobs, until, committed, random.Random(seed))) for seed in range(_WRITERS)]
        switched = False
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as side:

            async def take(changes: list) -> None:
                nonlocal late
                for change in changes:
                    if change.job_id not in received:
                        continue
                    if change_ids and change.change_id < max(change_ids):
                        late += 1
                    change_ids.append(change.change_id)
                    row = await (
                        await side.execute("SELECT version FROM test_feed_versions WHERE change_id = %s", (change.change_id,))
                    ).fetchone()
                    assert row is not None, f"feed row {change.change_id} has no version: read before its transaction committed?"
                    received[change.job_id].append(row[0])

            while not all(task.done() for task in writers) or reads == 0:
                async with store.statements() as db:
                    read = await db.job_feed_since(cursor, user_ids=[user], limit=10_000)
                assert read.complete
                cursor = read.cursor
                reads += 1
                await take(read.changes)
                if not switched and time.monotonic() > until - _SECONDS / 2:
                    # A reconnect: the cursor goes on, on another pool's connections.
                    await store.close()
                    store = _store(database_url)
                    await store.open(timeout=10)
                    switched = True
                await asyncio.sleep(random.uniform(0, 0.004))
            commits = sum(await asyncio.gather(*writers))
            # Everything committed is visible to a read that starts now.
            async with store.statements() as db:
                read = await db.job_feed_since(cursor, user_ids=[user], limit=10_000)
            await take(read.changes)
    finally:
        await store.close()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER IF EXISTS zz_test_feed_version ON analysis_jobs")
    assert commits > 100, f"only {commits} commits raced"
    for job_id in jobs:
        assert received[job_id] == list(range(1, committed.get(job_id, 0) + 1)), (job_id, received[job_id][:40], committed.get(job_id))
    assert len(change_ids) == len(set(change_ids))
    print(f"{commits} commits, {len(change_ids)} changes in {reads} reads, {late} read after a higher id")
    assert late > 0, "no commit landed behind a higher feed id: the race this test is about never happened"


async def _listening(database_url: str, *channels: str) -> tuple[psycopg.AsyncConnection, list[tuple[str, str]]]:
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    heard: list[tuple[str, str]] = []
    conn.add_notify_handler(lambda notice: heard.append((notice.channel, notice.payload)))
    for channel in channels:
        await conn.execute(f"LISTEN {channel}")
    return conn, heard


async def _drain(conn: psycopg.AsyncConnection) -> None:
    await conn.execute("SELECT 1")  # psycopg hands on the notices that arrived meanwhile


async def test_no_job_changing_commit_notifies_only_the_hints_do(services, database_url: str) -> None:
    """A job's whole life (admit into the slot, release, completion, the next job's promotion and
    release) sends nothing on the channel the trigger notified from each of those commits; what
    reaches listeners are the feed's hints, sent by the replica after its commits."""
    service = await services.start()
    stubs, user = service.stubs, new_user()
    store = service.app.store
    async with store.statements() as db:
        start = await db.job_feed_start()
    conn, heard = await _listening(database_url, JOB_CHANGES_CHANNEL, HINT_CHANNEL)
    try:
        await stubs.grant(user, 2)
        first = await stubs.admit(user)
        second = await stubs.admit(user)
        await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
        await stubs.complete(first.run_id)
        await stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
        async with store.statements() as db:
            read = await db.job_feed_since(start, user_ids=[user], limit=100)
        await asyncio.sleep(0.2)
        await _drain(conn)
    finally:
        await conn.close()
    statuses = [(str(c.job_id), c.status) for c in read.changes]
    # Every change of both jobs is in the feed, in the order it was made.
    assert [s for j, s in statuses if j == first.job_id] == ["pending", "running", "succeeded"], statuses
    assert [s for j, s in statuses if j == second.job_id] == ["queued", "pending", "running"], statuses
    assert [c for c, _ in heard if c == JOB_CHANGES_CHANNEL] == [], heard
    hints = [payload for c, payload in heard if c == HINT_CHANNEL]
    assert hints and set(hints) == {store.hints.sender}, heard


async def test_a_change_another_replica_commits_reaches_a_stream_by_its_hint(services, monkeypatch) -> None:
    """With the readers' timers far off, what carries another replica's change to a stream is
    that replica's hint: the change arrives within seconds, not at the timer."""
    monkeypatch.setattr(watch, "READ_EVERY_SECONDS", 120.0)
    core = await services.core()
    watched = await services.start(core)
    other = await services.start(core)
    core.set_callback_addr(other.address)
    user = new_user()
    await other.stubs.grant(user, 3)
    stream = watched.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), timeout=60)
    try:
        async for message in stream:
            if message.snapshot_complete:
                break
        await asyncio.sleep(0.3)  # the watched replica's reader is back waiting, on its timer or a hint
        for _ in range(3):
            job = await other.stubs.admit(user)

            async def arrival(job_id: str = job.job_id) -> float:
                async for message in stream:
                    if message.job.job_id == job_id:
                        return time.monotonic()
                raise AssertionError("stream ended")

            admitted = time.monotonic()
            arrived = await asyncio.wait_for(arrival(), 10)
            assert arrived - admitted < 10
    finally:
        stream.cancel()


async def test_the_sweeper_deletes_feed_rows_past_the_retention_only(services, database_url: str, monkeypatch) -> None:
    """Rows of transactions that ended before a horizon the sweeper saw a retention ago go; a row
    written after that horizon stays."""
    service = await services.start()
    user = new_user()
    jobs = _seed(database_url, user)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE analysis_jobs SET last_error = 'old' WHERE job_id = ANY(%s)", (jobs[:3],))

    def rows() -> list[uuid.UUID]:
        with psycopg.connect(database_url, autocommit=True) as conn:
            return [r[0] for r in conn.execute("SELECT job_id FROM analysis_job_feed WHERE user_id = %s ORDER BY change_id", (user,))]

    assert len(rows()) == 3
    monkeypatch.setattr(feed_trimmer, "RETENTION_SECONDS", 0.5)
    first = await service.app.sweeper.sweep_once()  # records a horizon past the three rows
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE analysis_jobs SET last_error = 'new' WHERE job_id = %s", (jobs[3],))
    await asyncio.sleep(0.6)
    second = await service.app.sweeper.sweep_once()  # trims below the first pass's horizon
    assert rows() == [jobs[3]], rows()
    assert second.feed_rows_trimmed >= 3 and first.feed_rows_trimmed >= 0
