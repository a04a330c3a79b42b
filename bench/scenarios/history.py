"""Scenario 4: does history slow the hot path? Admit and ListJobs latency on an empty table, then
again with 1 000 000 finished jobs of 100 000 users in it (quick: 20 000 / 2 000).

Both phases run the same load on a fresh replica: `probe_users` users each admit 10 jobs
(16 callers), then ListJobs (page of 10, 16 callers) over the same users, then the console's
operator reads: GetOverview (last hour) and SearchJobs (a page of 10 across all users, and of one
user's jobs), as many calls each. In the history phase
the probe users are history users (each already has ~10 finished jobs), so their first page and
every per-user index scan crosses real history.
"""

from __future__ import annotations

from typing import Any

from bench import dbsetup
from bench.context import Context, with_peak_rss
from bench.ghz import ADMIT, GET_OVERVIEW, LIST_JOBS, OVERVIEW_DATA, SEARCH_JOBS, admit_data, list_jobs_data, search_jobs_data
from bench.measure import ratio

HISTORY_PREFIX = "hist-u"
_CALLERS = 16
_PAGE_SIZE = 10
CALLS = ("admit", "list_jobs", "get_overview", "search_jobs_all_users", "search_jobs_one_user")


def run(ctx: Context, dsn: str) -> dict[str, Any]:
    sizes = ctx.sizes
    empty = probe(ctx, dsn, "s4_empty", "s4-empty-u")
    dbsetup.finish_in_flight(dsn)
    load_seconds = dbsetup.load_history(dsn, jobs=sizes.history_jobs, users=sizes.history_users, user_prefix=HISTORY_PREFIX)
    table = dbsetup.table_sizes(dsn)
    full = probe(ctx, dsn, "s4_history", HISTORY_PREFIX)
    ratios = {
        call: {key: ratio(full[call]["latency_ms"][key], empty[call]["latency_ms"][key]) for key in ("p50", "p90", "p99", "max")}
        | {"throughput": ratio(full[call]["throughput_per_s"], empty[call]["throughput_per_s"])}
        for call in CALLS
    }
    return {
        "empty": empty,
        "history": full,
        "history_table": table,
        "history_load_seconds": round(load_seconds, 1),
        "ratios_history_to_empty": ratios,
    }


def probe(ctx: Context, dsn: str, name: str, prefix: str) -> dict[str, Any]:
    sizes = ctx.sizes
    users, per_user = sizes.history_probe_users, sizes.history_jobs_per_probe_user
    calls = users * per_user
    warm_prefix = f"{name}-w"
    dbsetup.grant_credits(dsn, prefix, users, per_user + 5)
    dbsetup.grant_credits(dsn, warm_prefix, 50, sizes.warmup_calls)
    with ctx.stack(dsn, name) as stack:
        ctx.ghz(stack.address, ADMIT, admit_data(warm_prefix, 50, f"{name}-warm"), concurrency=_CALLERS, total=sizes.warmup_calls)
        ctx.ghz(stack.address, LIST_JOBS, list_jobs_data(warm_prefix, 50, _PAGE_SIZE), concurrency=_CALLERS, total=sizes.warmup_calls)
        admit = ctx.measured_ghz(
            stack.address, ADMIT, admit_data(prefix, users, name), concurrency=_CALLERS, total=calls, cpu_roots=stack.cpu_roots()
        )
        database = dsn.rsplit("/", 1)[-1]
        ctx.statements_reset(database)
        listing = ctx.measured_ghz(
            stack.address,
            LIST_JOBS,
            list_jobs_data(prefix, users, _PAGE_SIZE),
            concurrency=_CALLERS,
            total=calls,
            cpu_roots=stack.cpu_roots(),
        )
        listing.update(ctx.statements_since_reset(database, listing["ops"]))
        # The console's operator reads, over the whole table (not one user's rows).
        overview = ctx.measured_ghz(
            stack.address, GET_OVERVIEW, OVERVIEW_DATA, concurrency=_CALLERS, total=calls, cpu_roots=stack.cpu_roots()
        )
        search_all = ctx.measured_ghz(
            stack.address,
            SEARCH_JOBS,
            search_jobs_data(None, users, _PAGE_SIZE),
            concurrency=_CALLERS,
            total=calls,
            cpu_roots=stack.cpu_roots(),
        )
        ctx.statements_reset(database)
        search_user = ctx.measured_ghz(
            stack.address,
            SEARCH_JOBS,
            search_jobs_data(prefix, users, _PAGE_SIZE),
            concurrency=_CALLERS,
            total=calls,
            cpu_roots=stack.cpu_roots(),
        )
        search_user.update(ctx.statements_since_reset(database, search_user["ops"]))
        with_peak_rss(listing, stack.service.pid)
    return {
        "admit": admit,
        "list_jobs": listing,
        "get_overview": overview,
        "search_jobs_all_users": search_all,
        "search_jobs_one_user": search_user,
    }
