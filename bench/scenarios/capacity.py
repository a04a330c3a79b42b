"""Scenario 8: the fleet's capacity saturated (`capacity_saturated`).

200 users x 5 jobs each (one slot per user) meet a capacity of 20 runs at the core, each run
judging 200 ms; the same batch runs again with the capacity unlimited, and the figures are given
as ratios to that run (`ratios_to_unlimited`). A third batch, `paced`, runs the same number of jobs
at the capacity's pace with no capacity at work (20 users x 50 jobs, unlimited: 20 runs judging at
once, each user's next job promoted into her slot), and the figures are also given as ratios to it
(`ratios_to_paced`): the cost of the capacity itself, apart from the unlimited burst's batching. As in scenario 3 the core starts manual, so the runs released before
judging starts (20, or every user's first) are held judging; SIGUSR1 starts them all at one
instant, and the core records each ReleaseRun received and each CompleteRun sent and returned.
Before judging starts the jobs table is vacuumed and analyzed, as autovacuum keeps a database in
service (a database made a moment ago has no statistics for the planner).

From the core's record:
- `most_runs_at_once`: the most runs judging at once (+1 at a release, -1 at its completion);
  it must equal the capacity, never more;
- `completions_together`: the instants the core's completions were sent at (each within 2 ms of
  the previous one) and how many came at each: what the completion coalescer can share a
  statement among. The unlimited burst's come bunched, the capacity's spread out;
- `jain_index`: Jain's fairness index of the users' completed jobs, sampled every second of the
  run ((sum x)^2 / (n sum x^2)); `min` and `mean` over the samples. Low by construction, whatever
  the order: completions are whole jobs, and 20 runs at once cannot serve 200 users each second
  (at full size, perfect round-robin completes 100 jobs in the first second, one for half the
  users: 0.5; its mean over the run is about 0.94);
- `jain_of_best`: each sample's index divided by the best any order could reach with the same
  number of jobs completed by then (the most even split in whole jobs, none above a user's own
  jobs, so a user who has completed all of hers is not counted against the order); 1.0 is as
  fair as whole jobs allow. `min` and `mean` over the same samples;
- `most_passed_over`: for each job after a user's first, the releases of each other user between
  her previous completion and this job's release; the most by any one user (I13: at most 1);
- the handover gap: from a run's CompleteRun returned to the release of the run that takes its
  place (the i-th completion after judging starts frees the capacity the i-th release after it
  takes); unlimited, that is scenario 3's promotion gap (the user's own next job);
- CPU per completed job of the service and of PostgreSQL.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import dbsetup
from bench.context import Context, load_record
from bench.ghz import ADMIT, admit_data
from bench.measure import CpuMeter, Latency
from bench.scenarios.promotion import promotion_gaps


def run(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    limited = saturated_batch(ctx, "s8_capacity", users=sizes.capacity_users, capacity=sizes.capacity)
    unlimited = saturated_batch(ctx, "s8_unlimited", users=sizes.capacity_users, capacity=0)
    # The same jobs at the capacity's pace with no capacity at work: as many users as the capacity
    # (each her own next job, one slot each), so as many runs judge at once and completions
    # arrive as often as in the limited run. The unlimited batch above finishes every user's run
    # at one instant and batches about three completions per statement; this one shows how much
    # of the ratio is that burst, not the capacity's work.
    paced = saturated_batch(
        ctx,
        "s8_paced",
        users=sizes.capacity,
        capacity=0,
        queue=sizes.capacity_users * sizes.capacity_queue // sizes.capacity,
    )
    return {
        "capacity": limited,
        "unlimited": unlimited,
        "paced": paced,
        "ratios_to_unlimited": _ratios(limited, unlimited),
        "ratios_to_paced": _ratios(limited, paced),
    }


def _ratios(limited: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    for part in ("service", "postgres"):
        mine, theirs = limited["cpu_ms_per_op"].get(part), baseline["cpu_ms_per_op"].get(part)
        ratios[f"cpu_per_job_{part}"] = round(mine / theirs, 2) if mine and theirs else None
    for quantile in ("p50", "p99"):
        mine, theirs = limited["latency_ms"].get(quantile), baseline["latency_ms"].get(quantile)
        ratios[f"gap_{quantile}"] = round(mine / theirs, 2) if mine and theirs else None
    return ratios


def saturated_batch(
    ctx: Context,
    name: str,
    *,
    users: int,
    capacity: int,
    queue: int | None = None,
    before_judging: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One batch: `users` x `queue` jobs admitted, the first wave held judging, then judged to the end.
    `before_judging(dsn)` runs once the first wave is running, before the statistics and the meter
    (bench.probes.capacity_floor installs its floor's grant there)."""
    sizes = ctx.sizes
    queue, judging = queue or sizes.capacity_queue, sizes.judging_seconds
    jobs = users * queue
    dsn = ctx.database(name)
    prefix = f"{name}-u"
    dbsetup.grant_credits(dsn, prefix, users, queue + 1)
    with ctx.stack(dsn, name, env={"QUEUE_CORE_CAPACITY": str(capacity)}, judging_seconds=judging) as stack:
        admitted = ctx.ghz(stack.address, ADMIT, admit_data(prefix, users, "batch"), concurrency=16, total=jobs)
        if admitted.ok != jobs:
            raise RuntimeError(f"{name}: only {admitted.ok}/{jobs} admits succeeded: {admitted.errors}")
        first_wave = min(users, capacity) if capacity else users
        ready = dbsetup.wait_for(dsn, prefix, lambda c: c.get("running", 0) == first_wave, timeout=60)
        if ready.get("running", 0) != first_wave:
            raise RuntimeError(f"{name}: first runs not all running: {ready}")
        if before_judging is not None:
            before_judging(dsn)
        dbsetup.vacuum_analyze(dsn)
        ctx.statements_reset(name)
        wal_before = dbsetup.wal_position(dsn)
        meter = CpuMeter(stack.cpu_roots()).start()
        stack.start_judging()
        timeout = 60 + jobs * judging / max(1, first_wave) * 2
        done = dbsetup.wait_for(dsn, prefix, lambda c: c.get("succeeded", 0) == jobs, timeout=timeout, poll=0.05)
        cpu = meter.stop()
        wal_bytes = dbsetup.wal_bytes_since(dsn, wal_before)
        statements = ctx.statements_since_reset(name, jobs)
    if done.get("succeeded", 0) != jobs:
        raise RuntimeError(f"{name}: batch did not finish in {timeout:.0f}s: {done}")
    figures = record_figures(stack.record_path, prefix)
    if capacity:
        gap = figures["handover_gap_ms"]
    else:
        gap = promotion_gaps(stack.record_path, prefix)["gap_ms"]
    result = load_record(ok=jobs, seconds=figures["makespan_seconds"], latency_ms=gap, cpu_seconds=cpu)
    result.update(
        users=users,
        queue_per_user=queue,
        capacity=capacity,
        judging_seconds=judging,
        most_runs_at_once=figures["most_runs_at_once"],
        completions_together=figures["completions_together"],
        jain_index=figures["jain_index"],
        jain_of_best=figures["jain_of_best"],
        most_passed_over=figures["most_passed_over"],
        makespan_seconds=round(figures["makespan_seconds"], 3),
        ideal_makespan_seconds=round(jobs * judging / first_wave, 3),
        # The whole server's WAL while judging (only this batch's database is in use then).
        wal_bytes_per_job=round(wal_bytes / jobs),
    )
    result["latency_note"] = (
        "latency_ms is the handover gap (CompleteRun returned -> the next release that takes its capacity)"
        if capacity
        else "latency_ms is the promotion gap (CompleteRun returned -> the user's next ReleaseRun received)"
    )
    result.update(statements)
    return result


def _jain(counts: list[int]) -> float:
    total = sum(counts)
    return total * total / (len(counts) * sum(c * c for c in counts)) if total else 1.0


def most_even_split(total: int, caps: list[int]) -> list[int]:
    """`total` whole jobs over users as evenly as they go, none above its user's cap (water-filling)."""
    split = [0] * len(caps)
    left = total
    order = sorted(range(len(caps)), key=lambda i: caps[i])
    for rank, i in enumerate(order):
        share = left // (len(caps) - rank)
        split[i] = min(caps[i], share)
        left -= split[i]
    # What is left over (less than one job per user still below her cap) goes one job each.
    for i in sorted(order, key=lambda i: split[i]):
        if left == 0:
            break
        if split[i] < caps[i]:
            split[i] += 1
            left -= 1
    return split


# Completions sent this close after the previous one arrive "together": a statement applying one
# takes about this long, so the coalescer can share a statement only among completions this close.
_TOGETHER_NS = 2_000_000


def completions_together(events: list[dict[str, Any]]) -> dict[str, Any]:
    """How the core's completions bunch in time: the instants they were sent at (each within 2 ms
    of the previous completion) and how many came at each. A statement is shared only by
    completions that arrive while another is being applied, so this bounds the batching."""
    sent = sorted(e["mono_ns"] for e in events if e["event"] == "complete_sent")
    sizes = [1]
    for before, after in zip(sent, sent[1:], strict=False):
        if after - before <= _TOGETHER_NS:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return {"instants": len(sizes), "mean_per_instant": round(len(sent) / len(sizes), 2), "largest": max(sizes)}


def record_figures(record_path: Path, user_prefix: str) -> dict[str, Any]:
    events = [json.loads(line) for line in record_path.read_text().splitlines() if line.strip()]
    started = next(e["mono_ns"] for e in events if e["event"] == "judging_started")
    ours = sorted((e for e in events if e["user_id"].startswith(user_prefix)), key=lambda e: e["mono_ns"])
    # Runs judging at once.
    judging = most = 0
    for event in ours:
        if event["event"] == "release_received":
            judging += 1
        elif event["event"] == "complete_sent":
            judging -= 1
        most = max(most, judging)
    returned = [e for e in ours if e["event"] == "complete_returned"]
    releases_after = [e for e in ours if e["event"] == "release_received" and e["mono_ns"] > started]
    handover = [(release["mono_ns"] - done["mono_ns"]) / 1e9 for done, release in zip(returned, releases_after, strict=False)]
    # Jain's index of completed jobs per user, every second.
    users = sorted({e["user_id"] for e in ours})
    jobs_of = Counter(e["user_id"] for e in returned)
    caps = [jobs_of[user] for user in users]
    last = returned[-1]["mono_ns"]
    samples = []
    of_best = []
    completed: Counter[str] = Counter()
    index = 0
    tick = started + 1_000_000_000
    while tick <= last + 1_000_000_000:
        while index < len(returned) and returned[index]["mono_ns"] <= tick:
            completed[returned[index]["user_id"]] += 1
            index += 1
        counts = [completed[user] for user in users]
        total = sum(counts)
        if total:
            samples.append(_jain(counts))
            of_best.append(samples[-1] / _jain(most_even_split(total, caps)))
        tick += 1_000_000_000
    # Turns passed over: other users' releases between a user's completion and her next release.
    user_releases: dict[str, list[int]] = defaultdict(list)
    user_returns: dict[str, list[int]] = defaultdict(list)
    for event in ours:
        if event["event"] == "release_received":
            user_releases[event["user_id"]].append(event["mono_ns"])
        elif event["event"] == "complete_returned":
            user_returns[event["user_id"]].append(event["mono_ns"])
    all_releases = [(e["mono_ns"], e["user_id"]) for e in ours if e["event"] == "release_received"]
    most_passed = 0
    for user, ends in user_returns.items():
        for k, ended in enumerate(ends):
            if k + 1 >= len(user_releases[user]):
                continue
            next_release = user_releases[user][k + 1]
            others = Counter(other for at, other in all_releases if ended < at < next_release and other != user)
            if others:
                most_passed = max(most_passed, max(others.values()))
    return {
        "most_runs_at_once": most,
        "completions_together": completions_together(ours),
        "handover_gap_ms": Latency.from_seconds(handover).as_dict(),
        "jain_index": {"min": round(min(samples), 3), "mean": round(sum(samples) / len(samples), 3), "samples": len(samples)},
        "jain_of_best": {"min": round(min(of_best), 3), "mean": round(sum(of_best) / len(of_best), 3), "samples": len(of_best)},
        "most_passed_over": most_passed,
        "makespan_seconds": (last - started) / 1e9,
    }
