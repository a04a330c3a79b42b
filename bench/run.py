"""Runs the benchmark suite of the Acurio analysis queue and writes its report.

    .venv/bin/python -m bench.run            # full size (~12 min), bench/results/report.json + explain.txt
    .venv/bin/python -m bench.run --quick    # small sizes (~2 min), bench/results/quick.json + quick-explain.txt

Everything runs on this machine in separate processes: an embedded PostgreSQL in a temp folder,
the service (`queue-service serve`), the dev core (`queue-service core`), the minimal floor server,
and the load generators (ghz, or `bench.driver` where ghz cannot express the scenario).
See bench/README.md for what each scenario measures and how to read the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import dbsetup, explain, procs, report
from bench.context import FULL, QUICK, Context
from bench.ghz import GHZ
from bench.procs import REPO_ROOT, Database
from bench.protoset import write_protoset
from bench.scenarios import admit, capacity, history, idle, promotion, sweeper, watch

RESULTS = Path(__file__).resolve().parent / "results"
SCENARIOS = (
    "admit_many_users",
    "admit_hot_user",
    "promotion_gap",
    "history",
    "sweeper",
    "explain",
    "watch_fanout",
    "idle_replica",
    "capacity_saturated",
)


def _log(started: float, message: str) -> None:
    print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (under ~2 minutes)")
    parser.add_argument("--out", type=Path, help="JSON report path (default bench/results/report.json, --quick: quick.json)")
    parser.add_argument(
        "--explain-out", type=Path, help="EXPLAIN text path (default bench/results/explain.txt, --quick: quick-explain.txt)"
    )
    parser.add_argument(
        "--no-durable",
        dest="durable",
        action="store_false",
        help="PostgreSQL with fsync/synchronous_commit off (default: durable, as in production)",
    )
    parser.add_argument(
        "--statement-stats",
        action="store_true",
        help="load pg_stat_statements (track = all) and add a per-statement breakdown to the admit and promotion runs; "
        "it costs a few per cent, so judge the targets on runs without it",
    )
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="run only these scenarios (development aid)")
    parser.add_argument(
        "--keep-workdir",
        action="store_true",
        help="keep the temp folder (database, logs, core event files); removed otherwise, also after a failure",
    )
    return parser.parse_args(argv)


def _history_database(ctx: Context, state: dict[str, Any]) -> str:
    """The history database, loaded by scenario 4 or, when it is skipped, loaded here."""
    if "history_dsn" not in state:
        dsn = ctx.database("s4_history")
        dbsetup.load_history(dsn, jobs=ctx.sizes.history_jobs, users=ctx.sizes.history_users, user_prefix=history.HISTORY_PREFIX)
        state["history_dsn"] = dsn
    return state["history_dsn"]


def run_scenarios(ctx: Context, selected: tuple[str, ...], explain_path: Path, started: float) -> tuple[dict[str, Any], dict[str, Any]]:
    results: dict[str, Any] = {}
    explained: dict[str, Any] = {}
    state: dict[str, Any] = {}
    if "admit_many_users" in selected:
        _log(started, "1) admit, many users (floors + service at each concurrency)")
        results["admit_many_users"] = admit.run_many_users(ctx)
    if "admit_hot_user" in selected:
        _log(started, "2) admit, one hot user")
        results["admit_hot_user"] = admit.run_hot_user(ctx)
    if "promotion_gap" in selected:
        _log(started, "3) promotion gap")
        results["promotion_gap"] = promotion.run(ctx)
    if "history" in selected:
        _log(started, "4) history: empty table, bulk load, history table")
        state["history_dsn"] = ctx.database("s4_history")
        results["history"] = history.run(ctx, state["history_dsn"])
    if "sweeper" in selected:
        _log(started, "5) sweeper pass")
        results["sweeper"] = sweeper.run(ctx, _history_database(ctx, state))
    if "explain" in selected:
        _log(started, f"EXPLAIN -> {explain_path}")
        dsn = _history_database(ctx, state)
        if "sweeper" not in selected:
            sweeper.prepare_in_flight(ctx, dsn)
        table = dbsetup.table_sizes(dsn)
        header = (
            f"EXPLAIN (ANALYZE, BUFFERS) of the service's named queries, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC\n"
            f"database: {table['jobs']} jobs of {table['users']} users, {table['in_flight']} in flight; "
            f"PostgreSQL durable={ctx.db.durable}; tables VACUUM ANALYZEd after the bulk load\n"
            "custom plan = EXPLAIN with the bound values; generic = the plan of a prepared statement "
            "(plan_cache_mode = force_generic_plan)\n"
        )
        explained = explain.explain_all(
            dsn,
            explain_path,
            idle_user=f"{history.HISTORY_PREFIX}{ctx.sizes.history_probe_users + 1}",
            busy_user=f"{sweeper.IN_FLIGHT_PREFIX}0",
            header=header,
        )
    if "watch_fanout" in selected:
        _log(started, "6) WatchJobs fan-out")
        results["watch_fanout"] = watch.run(ctx)
    if "idle_replica" in selected:
        _log(started, "7) an idle replica")
        results["idle_replica"] = idle.run(ctx)
    if "capacity_saturated" in selected:
        _log(started, "8) the fleet's capacity saturated")
        results["capacity_saturated"] = capacity.run(ctx)
    return results, explained


def _postgres_settings(dsn: str) -> str:
    with dbsetup.connect(dsn) as conn:
        names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
        return ", ".join(f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}" for name in names)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    sizes = QUICK if args.quick else FULL
    out = args.out or RESULTS / ("quick.json" if args.quick else "report.json")
    explain_path = args.explain_out or RESULTS / ("quick-explain.txt" if args.quick else "explain.txt")
    explain_path.parent.mkdir(parents=True, exist_ok=True)
    selected = tuple(args.only or SCENARIOS)
    if not os.access(GHZ, os.X_OK):  # checked before anything starts
        print(
            "bench.run: ghz is not installed (looked on PATH and in ~/go/bin); install the version CI runs: "
            "go install github.com/bojand/ghz/cmd/ghz@v0.120.0",
            file=sys.stderr,
        )
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="acurio-bench-"))
    started = time.monotonic()
    db = Database(workdir, durable=args.durable, statement_stats=args.statement_stats)
    succeeded = False
    try:
        db.start()
        _log(started, f"PostgreSQL up (durable={args.durable}), work folder {workdir}")
        ctx = Context(db, workdir, sizes, write_protoset(workdir / "queue.protoset"))
        settings = _postgres_settings(db.dsn)
        results, explained = run_scenarios(ctx, selected, explain_path, started)
        succeeded = True
    finally:
        db.stop()
        if args.keep_workdir:
            print(f"logs and data kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            if not succeeded:
                print("the run failed; run again with --keep-workdir to keep its logs and data", file=sys.stderr)
    document = {
        "meta": {
            "size": "quick" if args.quick else "full",
            "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "git_head": procs.git_head(),
            "duration_seconds": round(time.monotonic() - started, 1),
            "cpus": os.cpu_count(),
            "machine": platform.platform(),
            "python": platform.python_version(),
            "postgres_durable": args.durable,
            "postgres_settings": settings,
            "scenarios": list(selected),
            "sizes": dataclasses.asdict(sizes),
            "explain_file": str(explain_path.relative_to(REPO_ROOT)) if explain_path.is_relative_to(REPO_ROOT) else str(explain_path),
            "units": "latency_ms in milliseconds; cpu_ms_per_op = CPU milliseconds per successful operation; throughput_per_s = successful operations per second",
        },
        "results": results,
        "explain": explained,
    }
    document["targets"] = report.evaluate_targets(results)
    report.write_json(document, out)
    print(report.render_table(document))
    print(f"\nwrote {out}" + (f" and {explain_path}" if explained else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
