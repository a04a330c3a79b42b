"""Scenario 3: the promotion gap, from a job landing to the next one of its user starting.

Each user gets a queue of 5 while the dev core is manual (so every user's first job is released
and held RUNNING); then SIGUSR1 makes the core judge everything from one instant, each run for
`judging_seconds`, and call CompleteRun. The core records (CLOCK_MONOTONIC) when each
CompleteRun was sent and returned and when each ReleaseRun arrived. Per user and job k:

    gap_k = ReleaseRun(job k+1) received - CompleteRun(job k) returned     (the brief's figure)
    gap_from_send_k = ReleaseRun(job k+1) received - CompleteRun(job k) sent (what the user sees)

The first can be negative: the service commits the promotion and its dispatcher releases the
next job before the CompleteRun response is back at the core. Makespan is from the judging start
to the last CompleteRun returned, against the ideal of queue x judging_seconds.

Two loads: `burst` (the brief's 200 users all in step: every completion wave is 200 CompleteRun
calls at once on a 2-core box) and `light` (20 users whose judging starts are spread evenly over
one judging time, so completions arrive one at a time) to see the gap when the service is not
saturated. The ideal makespan is queue x judging_seconds (+ the spread for `light`).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import dbsetup
from bench.context import Context, load_record, with_peak_rss
from bench.ghz import ADMIT, admit_data
from bench.measure import CpuMeter, Latency
from bench.notify_count import NotifyCounter, per_job


def run(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    return {
        "burst": promotion_batch(ctx, "s3_burst", users=sizes.promotion_users, spread=0.0),
        "light": promotion_batch(ctx, "s3_light", users=sizes.promotion_light_users, spread=sizes.judging_seconds),
    }


def promotion_batch(ctx: Context, name: str, *, users: int, spread: float) -> dict[str, Any]:
    sizes = ctx.sizes
    queue, judging = sizes.promotion_queue, sizes.judging_seconds
    jobs = users * queue
    dsn = ctx.database(name)
    prefix = f"{name}-u"
    dbsetup.grant_credits(dsn, prefix, users, queue + 1)
    with ctx.stack(dsn, name, judging_seconds=judging, judging_spread_seconds=spread) as stack:
        admitted = ctx.ghz(stack.address, ADMIT, admit_data(prefix, users, "batch"), concurrency=16, total=jobs)
        if admitted.ok != jobs:
            raise RuntimeError(f"{name}: only {admitted.ok}/{jobs} admits succeeded: {admitted.errors}")
        ready = dbsetup.wait_for(dsn, prefix, lambda c: c.get("running", 0) == users, timeout=60)
        if ready.get("running", 0) != users:
            raise RuntimeError(f"{name}: first jobs not all running: {ready}")
        ctx.statements_reset(name)
        with NotifyCounter(dsn) as notices:
            counted = notices.counts()
            meter = CpuMeter(stack.cpu_roots()).start()
            stack.start_judging()
            timeout = 60 + jobs * judging + spread
            done = dbsetup.wait_for(dsn, prefix, lambda c: c.get("succeeded", 0) == jobs, timeout=timeout, poll=0.02)
            cpu = meter.stop()
            time.sleep(0.3)  # what the last completions notified reaches the counter
            # Per completed job: its completion, the next job's promotion, its release claim and mark.
            notifications = per_job(counted, notices.counts(), jobs)
        statement_breakdown = ctx.statements_since_reset(name, jobs)
        peak_rss = with_peak_rss({}, stack.service.pid)["service_peak_rss_mb"]
    # The core writes its event file when it stops.
    if done.get("succeeded", 0) != jobs:
        raise RuntimeError(f"{name}: batch did not finish in {timeout:.0f}s: {done}")
    gaps = promotion_gaps(stack.record_path, prefix)
    makespan = gaps.pop("makespan_seconds")
    ideal = queue * judging + spread * (users - 1) / users
    result = load_record(ok=jobs, seconds=makespan, latency_ms=gaps["gap_ms"], cpu_seconds=cpu)
    result.update(
        users=users,
        queue_per_user=queue,
        judging_seconds=judging,
        judging_spread_seconds=spread,
        makespan_seconds=round(makespan, 3),
        ideal_makespan_seconds=round(ideal, 3),
        makespan_ratio_to_ideal=round(makespan / ideal, 2),
        gap_from_send_ms=gaps["gap_from_send_ms"],
        gap_min_ms=gaps["gap_min_ms"],
        gaps_counted=gaps["count"],
        service_peak_rss_mb=peak_rss,
        notifications=notifications,
        **statement_breakdown,
    )
    result["latency_note"] = "latency_ms is the promotion gap (CompleteRun returned -> next ReleaseRun received)"
    return result


def promotion_gaps(record_path: Path, user_prefix: str) -> dict[str, Any]:
    events = [json.loads(line) for line in record_path.read_text().splitlines() if line.strip()]
    started = next(e["mono_ns"] for e in events if e["event"] == "judging_started")
    releases: dict[str, list[int]] = defaultdict(list)
    sent: dict[str, list[int]] = defaultdict(list)
    returned: dict[str, list[int]] = defaultdict(list)
    by_event = {"release_received": releases, "complete_sent": sent, "complete_returned": returned}
    for e in events:
        series = by_event.get(e["event"])
        if series is not None and e["user_id"].startswith(user_prefix):
            series[e["user_id"]].append(e["mono_ns"])
    gaps, gaps_from_send = [], []
    for user, user_releases in releases.items():
        user_releases.sort()
        # One slot per user: job k+1 is released after job k completes, so the k-th completion
        # pairs with the (k+1)-th release (a retried ReleaseRun would show up as an extra one).
        for k, (sent_ns, returned_ns) in enumerate(zip(sorted(sent[user]), sorted(returned[user]), strict=False)):
            if k + 1 < len(user_releases):
                gaps.append((user_releases[k + 1] - returned_ns) / 1e9)
                gaps_from_send.append((user_releases[k + 1] - sent_ns) / 1e9)
    last_return = max(ns for per_user in returned.values() for ns in per_user)
    return {
        "count": len(gaps),
        "gap_ms": Latency.from_seconds(gaps).as_dict(),
        "gap_from_send_ms": Latency.from_seconds(gaps_from_send).as_dict(),
        "gap_min_ms": round(min(gaps) * 1000, 3) if gaps else None,
        "makespan_seconds": (last_return - started) / 1e9,
    }
