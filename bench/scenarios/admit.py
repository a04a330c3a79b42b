"""Scenarios 1 and 2: Admit throughput and latency, many users and one hot user, each with its
three floors at the same concurrency.

1) 1 000 users round-robin, 16 and 64 concurrent callers: the common case, where the per-user
   lock never contends and the cost is the service's own work per call.
2) one user, 50 concurrent callers: every admit serializes on that user's advisory lock, so
   this measures the lock hold time (the admit transaction's length) more than anything else.

The core is manual: each user's first job is released and stays RUNNING, the rest queue, so
only admits (and one release per user) load the service.
"""

from __future__ import annotations

import time
from typing import Any

from bench import dbsetup
from bench.context import Context, with_peak_rss
from bench.ghz import ADMIT, admit_data
from bench.measure import ratio
from bench.notify_count import NotifyCounter, per_job
from bench.scenarios.floors import db_floor, grpc_floor, minimal_floor, ratios_against

_WARM_USERS = 50


def run_many_users(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    return {
        f"c{callers}": admit_run(ctx, f"s1_c{callers}", users=sizes.many_users, callers=callers, admits=sizes.many_users_admits)
        for callers in sizes.concurrencies
    }


def run_hot_user(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    # Every admit but the first queues behind the one running job: lift the per-user cap.
    env = {"QUEUE_MAX_QUEUED_PER_USER": str(min(100_000, sizes.hot_user_admits + sizes.warmup_calls + 100))}
    return admit_run(ctx, "s2_hot", users=1, callers=sizes.hot_user_callers, admits=sizes.hot_user_admits, env=env)


def admit_run(ctx: Context, name: str, *, users: int, callers: int, admits: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    sizes = ctx.sizes
    floors = {
        "db": db_floor(ctx, name, users, callers, sizes.floor_calls),
        "minimal": minimal_floor(ctx, name, users, callers, sizes.floor_calls),
        "minimal_core": minimal_floor(ctx, name, users, callers, sizes.floor_calls, with_core=True),
    }
    # What the core's CreateRun alone adds to the minimal Admit's CPU.
    floors["minimal_core"]["cpu_over_minimal"] = ratio(
        floors["minimal_core"]["cpu_ms_per_op"].get("service"), floors["minimal"]["cpu_ms_per_op"].get("service")
    )
    dsn = ctx.database(name)
    prefix, warm_prefix = f"{name}-u", f"{name}-w"
    warm_users = min(users, _WARM_USERS)
    dbsetup.grant_credits(dsn, prefix, users, admits // users + 10)
    dbsetup.grant_credits(dsn, warm_prefix, warm_users, sizes.warmup_calls // warm_users + 10)
    with ctx.stack(dsn, name, env=env) as stack:
        ctx.ghz(stack.address, ADMIT, admit_data(warm_prefix, warm_users, "warm"), concurrency=callers, total=sizes.warmup_calls)
        floors["grpc"] = grpc_floor(ctx, stack, callers, sizes.floor_calls)
        ctx.statements_reset(name)
        with NotifyCounter(dsn) as notices:
            before = notices.counts()
            run = ctx.measured_ghz(
                stack.address, ADMIT, admit_data(prefix, users, "measure"), concurrency=callers, total=admits, cpu_roots=stack.cpu_roots()
            )
            time.sleep(0.3)  # what the last admits notified reaches the counter
            run["notifications"] = per_job(before, notices.counts(), run["ops"])
        run.update(ctx.statements_since_reset(name, run["ops"]))
        with_peak_rss(run, stack.service.pid)
    run.update(users=users, callers=callers, floors=floors, ratios=ratios_against(run, floors))
    return run
