"""Cross-replica change delivery: how long a change committed through one replica takes to reach
a WatchJobs stream on another.

    .venv/bin/python -m bench.probes.feed_delivery [--probes 200] [--users 50] [--load-callers 16]

Two replicas (`queue-service serve`, each with its own manual dev core) on one durable embedded
PostgreSQL. Replica B holds one WatchJobs stream per user; probe admits go through replica A,
one at a time, 20 a second, round-robin over the users. Per probe: from A's Admit response
(the admit has committed by then) to the message for that job on B's stream (`from_response`),
and from sending the Admit (`from_send`, an upper bound). Two phases: `quiet` (nothing else
runs) and `loaded` (`--load-callers` callers admit for other users through A all along, so A's
hints are debounced and B's reader works behind a stream of changes).

The bench is the same for any service version (the replicas are whatever `queue_service` the
PYTHONPATH gives: `bench.procs`), so a run against the code before the job-change feed is the
comparison. Writes bench/results/feed-delivery.json (or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from bench import dbsetup
from bench.measure import Latency
from bench.probes.rounds import RESULTS, loadavg, new_report, scratch_database, write_report
from bench.procs import REPO_ROOT, Stack, create_database


async def _phase(a: str, b: str, *, users: list[str], probes: int, load_users: list[str], load_callers: int) -> dict[str, Any]:
    from queue_service._gen.acurio.queue.v1 import job_pb2
    from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
    from queue_service._gen.acurio.queue.v1 import queue_service_pb2_grpc as queue_grpc

    chan_a, chan_b = grpc.aio.insecure_channel(a), grpc.aio.insecure_channel(b)
    stub_a, stub_b = queue_grpc.AnalysisQueueServiceStub(chan_a), queue_grpc.AnalysisQueueServiceStub(chan_b)
    arrivals: dict[str, float] = {}
    ready = [asyncio.Event() for _ in users]
    calls = []

    async def watch(index: int, user: str) -> None:
        call = stub_b.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user))
        calls.append(call)
        try:
            async for message in call:
                if message.snapshot_complete:
                    ready[index].set()
                if message.HasField("job"):
                    arrivals.setdefault(message.job.job_id, time.monotonic())
        except grpc.aio.AioRpcError:
            ready[index].set()

    def request(user: str) -> Any:
        return queue_pb2.AdmitRequest(
            user_id=user,
            idempotency_key=uuid.uuid4().hex,
            document=job_pb2.Document(uri="s3://theses/bench.pdf", title="bench"),
            sources=[job_pb2.Source(doi="10.1234/bench", citation="Bench et al. 2024")],
        )

    watchers = [asyncio.create_task(watch(i, u)) for i, u in enumerate(users)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ready)), 60)
    stop = asyncio.Event()
    load_done = 0

    async def load(index: int) -> None:
        nonlocal load_done
        while not stop.is_set():
            try:
                await stub_a.Admit(request(load_users[(index + load_done * load_callers) % len(load_users)]), timeout=20)
                load_done += 1
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)

    loaders = [asyncio.create_task(load(i)) for i in range(load_callers)]
    await asyncio.sleep(1.0 if load_callers else 0.2)
    sent: list[tuple[str, float, float]] = []
    started = time.monotonic()
    for probe in range(probes):
        before = time.monotonic()
        job = (await stub_a.Admit(request(users[probe % len(users)]), timeout=20)).job
        sent.append((job.job_id, before, time.monotonic()))
        await asyncio.sleep(max(0.0, started + (probe + 1) * 0.05 - time.monotonic()))
    await asyncio.sleep(2.0)
    stop.set()
    await asyncio.gather(*loaders, return_exceptions=True)
    for call in calls:
        call.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)
    await chan_a.close()
    await chan_b.close()
    from_response = [arrivals[j] - answered for j, _, answered in sent if j in arrivals]
    from_send = [arrivals[j] - asked for j, asked, _ in sent if j in arrivals]
    return {
        "probes": probes,
        "missing": sum(1 for j, _, _ in sent if j not in arrivals),
        "from_response_ms": Latency.from_seconds(from_response).as_dict(),
        "from_send_ms": Latency.from_seconds(from_send).as_dict(),
        "load_admits": load_done,
        "load_admits_per_s": round(load_done / max(1e-9, time.monotonic() - started), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--load-callers", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS / "feed-delivery.json")
    args = parser.parse_args()
    git_head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    report = new_report(
        git_head=git_head or "(not a git checkout)",
        probes=args.probes,
        users=args.users,
        load_callers=args.load_callers,
    )
    with scratch_database("acurio-feed-delivery-") as (db, workdir):
        dsn = create_database(db, "feed_delivery")
        users = [f"fd-w{i}" for i in range(args.users)]
        dbsetup.grant_credits(dsn, "fd-w", args.users, 2 * args.probes)
        dbsetup.grant_credits(dsn, "fd-l", 1000, 200)
        load_users = [f"fd-l{i}" for i in range(1000)]
        env = {"QUEUE_MAX_QUEUED_PER_USER": "1000"}
        with Stack(db, dsn, workdir, "a", service_env=env) as a, Stack(db, dsn, workdir, "b", service_env=env) as b:
            for phase, callers in (("quiet", 0), ("loaded", args.load_callers)):
                load = loadavg()
                report[phase] = {
                    "loadavg": load,
                    **asyncio.run(
                        _phase(a.address, b.address, users=users, probes=args.probes, load_users=load_users, load_callers=callers)
                    ),
                }
                print(phase, json.dumps(report[phase]), flush=True)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
