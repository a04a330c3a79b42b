"""How often PostgreSQL plans the admit's reservation statement, and under how many entries.

The interleaved pairs of the end of round five (docs/scaling.md §15) found the admit's
PostgreSQL CPU 1.24-1.28x its round's start at 16 callers, and pg_stat_statements put the
difference on `reserve_run_and_read_admit_state` (sql/queries/admit.sql): in the benchmark it
shows as two entries, and one of them is planned on every call. This probe reproduces that
outside the benchmark, with and without the one thing that made the difference when it was
found: the bench's `db` floor (the bare admit transaction from the driver, 10 000 admits) run
first in another database on the same server.

Each case: a fresh durable PostgreSQL with pg_stat_statements, optionally the `db` floor, then
a fresh replica warmed up (300 admits of 50 users) and `--admits` admits of 1 000 users from 16
callers; then every pg_stat_statements entry of the statement in the replica's database: its
calls, how many times it was planned and the planning time.

`--before SQL` runs statements in the replica's database before the load (for example a table's
storage parameter), `--db-floor-first no` (or `yes`) runs one case only, `--watch SECONDS` samples
the entries and the tables' analyze and vacuum counts during the load (the split starts with
autovacuum's first analyze of the admit's tables: docs/scaling.md §15.1).

    .venv/bin/python -m bench.probes.statement_variants [--admits 20000] [--before SQL ...] [--db-floor-first yes|no] [--watch 5] [--out bench/results/history/statement-variants.json]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import dbsetup, statements
from bench.context import FULL, Context
from bench.ghz import ADMIT, admit_data
from bench.probes.rounds import RESULTS, loadavg, new_report, scratch_database, write_report
from bench.protoset import write_protoset
from bench.scenarios.floors import db_floor

_USERS = 1000
_CALLERS = 16
_MARK = "INSERT INTO run_reservations"


_ENTRIES = """
    SELECT s.queryid, s.calls, s.plans, s.total_plan_time, s.total_exec_time
      FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
     WHERE d.datname = 'variants' AND s.toplevel AND strpos(s.query, %s) > 0
     ORDER BY s.calls DESC
"""


class _Watch:
    """Every `every` seconds during the load: each entry's calls and plans so far, and the
    analyze and vacuum counts of the tables the statement reads (when the split starts, and
    with what)."""

    def __init__(self, server_dsn: str, replica_dsn: str, every: float) -> None:
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server_dsn, replica_dsn, every), daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self, server_dsn: str, replica_dsn: str, every: float) -> None:
        started = time.monotonic()
        with psycopg.connect(server_dsn, autocommit=True) as server, psycopg.connect(replica_dsn, autocommit=True) as replica:
            while not self._stop.wait(every):
                entries = server.execute(_ENTRIES, (_MARK,)).fetchall()
                tables = replica.execute(
                    """
                    SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count
                      FROM pg_stat_user_tables
                     WHERE relname IN ('analysis_jobs', 'run_reservations', 'credit_ledger', 'credit_accounts')
                     ORDER BY relname
                    """
                ).fetchall()
                self.samples.append(
                    {
                        "seconds": round(time.monotonic() - started, 1),
                        "entries": [[str(q), calls, plans] for q, calls, plans, _, _ in entries],
                        "tables": {
                            name: {"live": live, "dead": dead, "vacuums": vac, "analyzes": an} for name, live, dead, vac, an in tables
                        },
                    }
                )


def one_case(db_floor_first: bool, admits: int, before: list[str], watch: float | None = None) -> dict[str, Any]:
    with scratch_database("acurio-statement-variants-", statement_stats=True) as (db, workdir):
        ctx = Context(db, workdir, FULL, write_protoset(workdir / "queue.protoset"))
        if db_floor_first:
            db_floor(ctx, "variants", _USERS, _CALLERS, ctx.sizes.floor_calls)
        dsn = ctx.database("variants")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in before:
                conn.execute(statement)  # type: ignore[call-overload]
        dbsetup.grant_credits(dsn, "v-u", _USERS, admits // _USERS + 10)
        dbsetup.grant_credits(dsn, "v-w", 50, 20)
        load = loadavg()
        with ctx.stack(dsn, "variants") as stack:
            ctx.ghz(stack.address, ADMIT, admit_data("v-w", 50, "warm"), concurrency=_CALLERS, total=300)
            statements.reset(db.dsn)
            watcher = _Watch(db.dsn, dsn, watch) if watch else None
            with watcher or contextlib.nullcontext():
                ctx.ghz(stack.address, ADMIT, admit_data("v-u", _USERS, "measure"), concurrency=_CALLERS, total=admits)
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            rows = conn.execute(_ENTRIES, (_MARK,)).fetchall()
    entries = [
        {
            "queryid": str(queryid),
            "calls": calls,
            "plans": plans,
            "plan_ms_per_call": round(plan_ms / calls, 3),
            "exec_ms_per_call": round(exec_ms / calls, 3),
        }
        for queryid, calls, plans, plan_ms, exec_ms in rows
    ]
    planned = sum(plans for _, _, plans, _, _ in rows)
    plan_ms = sum(plan_ms for _, _, _, plan_ms, _ in rows)
    return {
        "db_floor_first": db_floor_first,
        "before": before,
        "loadavg": load,
        "admits": admits,
        "entries": entries,
        "plans_per_admit": round(planned / admits, 3),
        "plan_ms_per_admit": round(plan_ms / admits, 3),
        **({"watch": watcher.samples} if watcher else {}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admits", type=int, default=20000)
    parser.add_argument("--before", nargs="*", default=[], metavar="SQL", help="statements run in the replica's database before the load")
    parser.add_argument("--db-floor-first", choices=("yes", "no", "both"), default="both")
    parser.add_argument(
        "--watch",
        type=float,
        default=None,
        metavar="SECONDS",
        help="sample the entries and the tables' analyze counts this often during the load",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "statement-variants.json")
    args = parser.parse_args()
    report = new_report(admits=args.admits, users=_USERS, callers=_CALLERS, statement="reserve_run_and_read_admit_state")
    cases = []
    for db_floor_first in {"no": (False,), "yes": (True,), "both": (False, True)}[args.db_floor_first]:
        case = one_case(db_floor_first, args.admits, args.before, args.watch)
        cases.append(case)
        print(
            f"db floor first: {db_floor_first!s:5}  entries {len(case['entries'])}  planned {case['plans_per_admit']} times per admit, "
            f"{case['plan_ms_per_admit']} ms of planning per admit  {[(e['calls'], e['plans']) for e in case['entries']]}",
            flush=True,
        )
    report.update(cases=cases)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
