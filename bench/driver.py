"""The Python load generator, for what ghz cannot express. Runs as its own process:

    python -m bench.driver <task> '<json params>'

Protocol with the orchestrator (bench.run): the driver sets up (pools, streams, warm-up), prints
`{"ready": true}`, waits for a line on stdin (the orchestrator starts its CPU meters then), runs
the measured part and prints one JSON result line. Tasks:

- db_floor: the bare admit's database work (the run reservation with the state read, then the
  locked admit statement), no service.
- watch_fanout: N WatchJobs streams on one user; a committed change of one of its jobs; time
  from the change to the first and to the last watcher's message.
- sweeper: `Sweeper.sweep_once()` in process against the database, and each of its statements.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import sys
import time
import uuid
from typing import Any

import grpc
import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.measure import Latency
from queue_service.config import SETTINGS
from queue_service.model import AdmitLimits, NewJob
from queue_service.store import Store
from queue_service.store.pool import Timeouts, create_pool

TIMEOUTS = Timeouts(lock_timeout_ms=5000, statement_timeout_ms=10000)
_DIGEST = hashlib.sha256(b"bench").digest()


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


async def _wait_for_go() -> None:
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def _bare_pool(dsn: str, max_size: int) -> AsyncConnectionPool:
    """The service's own pool (session timeouts, no per-lend ping), all connections open."""
    pool = create_pool(dsn, timeouts=TIMEOUTS, min_size=max_size, max_size=max_size, timeout=10)
    await pool.open(wait=True)
    return pool


# -- db_floor --------------------------------------------------------------------------------------


# The admit's limits as the service's defaults, but a queue without bound: the db floor here and
# the minimal server's admit (bench/minimal_server.py) run the admit statement with these.
ADMIT_LIMITS = AdmitLimits(
    default_max_active=1,
    max_queued=2**31 - 1,
    max_running_deltas=4,
    release_window_seconds=1800,
    release_lease_seconds=15,
    reconcile_after_seconds=900,
)


# The pre-check reads the user's free work of the last hour up to the service's limit: the default.
FREE_ADMITS_PER_HOUR = int(SETTINGS["max_free_admits_per_user_per_hour"].default)


async def bare_admit(store: Store, user_id: str, key: str) -> None:
    """The admit's database work and nothing else: the run reservation with the state read, then
    the locked admit statement (`Store.admit_job`), as the service runs them."""
    job = NewJob(uuid.uuid4(), user_id, uuid.uuid4(), key, _DIGEST, None, 1)
    async with store.statements() as db:
        await db.reserve_run_and_read_admit_state(
            run_id=job.run_id,
            user_id=user_id,
            idempotency_key=key,
            delta_of_job_id=None,
            grace_seconds=60,
            max_free_admits=FREE_ADMITS_PER_HOUR,
        )
    admitted = await store.admit_job(job, ADMIT_LIMITS)
    if admitted is None:
        raise RuntimeError(f"{user_id} has no credit left")


async def db_floor(
    dsn: str, user_prefix: str, users: int, concurrency: int, total: int, warmup: int, pool_max_size: int = 20
) -> dict[str, Any]:
    pool = await _bare_pool(dsn, pool_max_size)
    store = Store(pool, database_url=dsn)

    async def admit(user_id: str, key: str) -> float:
        started = time.perf_counter()
        await bare_admit(store, user_id, key)
        return time.perf_counter() - started

    async def run(count: int, key_prefix: str) -> tuple[list[float], float]:
        numbers = itertools.count()
        latencies: list[float] = []

        async def worker() -> None:
            while (n := next(numbers)) < count:
                latencies.append(await admit(f"{user_prefix}{n % users}", f"{key_prefix}-{n}"))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, time.perf_counter() - started

    await run(warmup, "warm")
    _emit({"ready": True})
    await _wait_for_go()
    latencies, seconds = await run(total, "measure")
    await pool.close()
    return {
        "count": len(latencies),
        "seconds": seconds,
        "rps": len(latencies) / seconds,
        "latency_ms": Latency.from_seconds(latencies).as_dict(),
    }


# -- watch_fanout ----------------------------------------------------------------------------------

# The job-change feed's wake-up channel (queue_service/store/feed.py), named here so the bench runs
# against service versions without it too.
FEED_HINT_CHANNEL = "analysis_job_feed"


async def watch_fanout(
    address: str, dsn: str, user_id: str, tick_job_id: str, streams: int, channels: int, ticks: int, interval: float
) -> dict[str, Any]:
    from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
    from queue_service._gen.acurio.queue.v1 import queue_service_pb2_grpc as queue_grpc

    # A local subchannel pool gives each channel its own HTTP/2 connection, as separate
    # dashboards would have.
    chans = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(channels)]
    stubs = [queue_grpc.AnalysisQueueServiceStub(c) for c in chans]
    received: list[list[tuple[float, str]]] = [[] for _ in range(streams)]
    snapshot_seen = [asyncio.Event() for _ in range(streams)]
    errors: list[str] = []

    async def watch(index: int) -> None:
        try:
            call = stubs[index % channels].WatchJobs(queue_pb2.WatchJobsRequest(user_id=user_id))
            async for message in call:
                now = time.monotonic()
                snapshot_seen[index].set()
                if message.job.job_id == tick_job_id:
                    received[index].append((now, message.job.last_error))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                errors.append(exc.code().name)
            snapshot_seen[index].set()

    watchers = [asyncio.create_task(watch(i)) for i in range(streams)]
    opened = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in snapshot_seen)), timeout=120)
    open_seconds = time.perf_counter() - opened
    _emit({"ready": True})
    await _wait_for_go()

    tick_times: list[float] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for tick in range(ticks):
            started = time.monotonic()
            # A real status change of one of the user's jobs, tagged so each watcher's message
            # for this very change is recognised; the table's trigger records it as usual. Then,
            # as a replica that committed a change does, the wake-up hint of the job-change feed
            # from a transaction of its own (no listener hears it where the trigger notifies).
            await conn.execute(
                "UPDATE analysis_jobs SET status = CASE status WHEN 'succeeded' THEN 'failed' ELSE 'succeeded' END,"
                " last_error = %s WHERE job_id = %s",
                (f"bench-tick-{tick}", tick_job_id),
            )
            await conn.execute("SELECT pg_notify(%s, 'bench-driver')", (FEED_HINT_CHANNEL,))
            tick_times.append(started)
            await asyncio.sleep(interval)
    await asyncio.sleep(max(1.0, interval))

    first, last, missing = [], [], 0
    for tick, started in enumerate(tick_times):
        tag = f"bench-tick-{tick}"
        arrivals = [next((t for t, e in messages if e == tag), None) for messages in received]
        got = [t - started for t in arrivals if t is not None]
        missing += len(arrivals) - len(got)
        if got:
            first.append(min(got))
            last.append(max(got))
    for task in watchers:
        task.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)
    for chan in chans:
        await chan.close()
    return {
        "streams": streams,
        "ticks": len(tick_times),
        "open_seconds": open_seconds,
        "first_watcher_ms": Latency.from_seconds(first).as_dict(),
        "last_watcher_ms": Latency.from_seconds(last).as_dict(),
        "missing_messages": missing,
        "stream_errors": errors[:10],
    }


# -- sweeper ---------------------------------------------------------------------------------------


async def sweeper(dsn: str, core_addr: str, passes: int) -> dict[str, Any]:
    from queue_service.config import Config
    from queue_service.core_client import CoreClient
    from queue_service.engine import (
        BackgroundTasks,
        FleetCapacity,
        NoFailoverGuard,
        OwedReleases,
        QueueEngine,
        QueueEngineSettings,
        Recovery,
        ReleaseHandoff,
        Releases,
        ReleasesSettings,
        SharedParts,
        Sweeper,
        SweeperSettings,
    )

    config = Config.from_env(environ={}, database_url=dsn, core_addr=core_addr)
    pool = create_pool(dsn, timeouts=TIMEOUTS, min_size=2, max_size=4, timeout=10)
    await pool.open(wait=True)
    core = CoreClient.connect(core_addr, deadline_seconds=5)
    store = Store(pool, database_url=dsn)
    # No dispatcher: the releases handed over wait in the handoff.
    handoff, tasks, guard = ReleaseHandoff(), BackgroundTasks(), NoFailoverGuard()
    capacity = FleetCapacity(wake_grant=handoff.request_grant, probe_interval_seconds=config.core_probe_interval_seconds)
    owed = OwedReleases(store, handoff, lease_seconds=config.release_lease_seconds, spawn=tasks.in_background)
    parts = SharedParts(
        store=store, core=core, tasks=tasks, capacity=capacity, starter=handoff, owed_releases=owed, wake_dispatcher=lambda: None
    )
    engine = QueueEngine(parts, QueueEngineSettings.from_config(config))
    releases = Releases(engine, parts, ReleasesSettings.from_config(config), guard=guard)
    recovery = Recovery(engine, releases, parts, guard=guard)
    sweep = Sweeper(recovery, store, SweeperSettings.from_config(config), wake_dispatcher=lambda: None)
    await sweep.sweep_once()  # warm: connections, prepared plans, caches
    _emit({"ready": True})
    await _wait_for_go()

    durations, reports = [], []
    for _ in range(passes):
        started = time.perf_counter()
        report = await sweep.sweep_once()
        durations.append(time.perf_counter() - started)
        reports.append(report)

    # Each statement of the pass on its own, to see which one the pass's time goes to.
    statements = {
        "users_needing_promotion": lambda db: db.users_needing_promotion(default_max_active=config.max_active_per_user, batch_size=500),
        "expired_pending_releases": lambda db: db.expired_pending_releases(batch_size=500),
        "claim_due_reconciliations": lambda db: db.claim_due_reconciliations(
            recheck_seconds=config.reconcile_after_seconds, cancel_recheck_seconds=config.release_lease_seconds, batch_size=500
        ),
    }
    per_statement = {}
    for name, run in statements.items():
        times = []
        for _ in range(passes):
            async with store.statements() as db:
                started = time.perf_counter()
                await run(db)
                times.append(time.perf_counter() - started)
        per_statement[name] = Latency.from_seconds(times).as_dict()
    await core.close()
    await pool.close()
    return {
        "passes": passes,
        "pass_ms": Latency.from_seconds(durations).as_dict(),
        "acted_on": {
            "promoted": sum(r.promoted for r in reports),
            "gave_up": sum(r.gave_up for r in reports),
            "reconciled": sum(r.reconciled for r in reports),
        },
        "statement_ms": per_statement,
    }


TASKS = {"db_floor": db_floor, "watch_fanout": watch_fanout, "sweeper": sweeper}


def main() -> None:
    task, params = sys.argv[1], json.loads(sys.argv[2])
    result = asyncio.run(TASKS[task](**params))
    _emit({"result": result})


if __name__ == "__main__":
    main()
