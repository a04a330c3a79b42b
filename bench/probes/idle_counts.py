"""Counts, not CPU, of what an idle replica and a completed job make PostgreSQL do: figures that a
busy neighbour on the machine does not change. Run from a checkout's root with its venv (any
version whose `bench.procs` has `Database`, `Stack` and `create_database`, so it measures older
commits too):

    .venv/bin/python -m bench.probes.idle_counts [--idle-seconds 30] [--burst-users 200] [--out FILE]

Three phases on one durable PostgreSQL with pg_stat_statements (track = all) and connection,
disconnection and autovacuum logging:

- `idle_empty`: a fresh replica on a fresh database, nobody calling, no job;
- `idle_in_flight`: the same replica after 50 users' admits, one job RUNNING and one QUEUED
  each, nothing due;
- `burst`: the bench's promotion burst (200 users x 5 jobs, judging 0.2 s, started at one
  instant), per completed job; `--disable-triggers` switches triggers of the job table off in its
  database first (`analysis_jobs_announce_insert,analysis_jobs_announce_update`: the change feed),
  so what a design's trigger costs a completed job is measured, not guessed.

Per phase: each statement's calls, rows and shared blocks (toplevel and nested) per second or
per job; the database's sessions opened, commits, rows written per table; autovacuum and
autoanalyze runs per table; WAL records; the backends that started or ended within the window
(from the server log: `connection authorized` / `disconnection` lines with the application name
and session time). CPU of the service and PostgreSQL is reported too, with the load average, as
a noisy companion to the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import dbsetup, procs, statements
from bench.ghz import admit_data, run_ghz
from bench.measure import CpuMeter
from bench.protoset import write_protoset

ADMIT = "acurio.queue.v1.AnalysisQueueService.Admit"

_STATS_FLUSH_SECONDS = 11.0

_LOG_SETTINGS = {
    "log_connections": "on",
    "log_disconnections": "on",
    "log_autovacuum_min_duration": "0",
    "log_line_prefix": "'%m [%p] <%b> db=%d app=%a : '",
}


class Counters:
    """A snapshot of the cumulative counters of one database, read from the admin database on a
    connection of its own (so the probe opens no session in the measured database)."""

    def __init__(self, admin: psycopg.Connection, inside: psycopg.Connection, database: str) -> None:
        # `inside`: one connection to the measured database, opened before the replica started,
        # for its per-table statistics (a connection per snapshot would count as sessions).
        self.admin, self.inside, self.database = admin, inside, database

    def table_stats(self) -> dict[str, dict[str, int]]:
        rows = self.inside.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count, autoanalyze_count FROM pg_stat_user_tables"
        ).fetchall()
        return {r[0]: dict(zip(("ins", "upd", "hot_upd", "del", "autovacuum", "autoanalyze"), r[1:], strict=True)) for r in rows}

    def snapshot(self) -> dict[str, Any]:
        self.admin.execute("SELECT pg_stat_force_next_flush()")
        db = self.admin.execute(
            "SELECT sessions, xact_commit, xact_rollback, blks_hit + blks_read, tup_inserted, tup_updated, tup_deleted"
            "  FROM pg_stat_database WHERE datname = %s",
            (self.database,),
        ).fetchone()
        wal = self.admin.execute("SELECT wal_records, wal_bytes FROM pg_stat_wal").fetchone()
        stmts = self.admin.execute(
            """
            SELECT s.toplevel, regexp_replace(s.query, '\\s+', ' ', 'g'), s.calls, s.rows, s.shared_blks_hit + s.shared_blks_read,
                   s.total_exec_time
              FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s
            """,
            (self.database,),
        ).fetchall()
        assert db is not None and wal is not None
        return {
            "at": time.monotonic(),
            "database": dict(
                zip(("sessions", "commits", "rollbacks", "blocks", "tup_inserted", "tup_updated", "tup_deleted"), db, strict=True)
            ),
            "wal_records": wal[0],
            "statements": {(top, q): (calls, rows, blks, ms) for top, q, calls, rows, blks, ms in stmts},
        }


def _difference(before: dict[str, Any], after: dict[str, Any], per: float) -> dict[str, Any]:
    database = {k: round((after["database"][k] - before["database"][k]) / per, 3) for k in after["database"]}
    statements_: list[dict[str, Any]] = []
    for key, (calls, rows, blks, ms) in after["statements"].items():
        calls0, rows0, blks0, ms0 = before["statements"].get(key, (0, 0, 0, 0.0))
        if calls - calls0 <= 0:
            continue
        statements_.append(
            {
                "level": "top" if key[0] else "nested",
                "calls": round((calls - calls0) / per, 3),
                "rows": round((rows - rows0) / per, 3),
                "blocks": round((blks - blks0) / per, 2),
                "exec_ms": round((ms - ms0) / per, 4),
                "query": key[1][:140],
            }
        )
    statements_.sort(key=lambda e: (-e["calls"], e["query"]))
    return {
        "database": database,
        "wal_records": round((after["wal_records"] - before["wal_records"]) / per, 2),
        "statement_calls_top": round(sum(e["calls"] for e in statements_ if e["level"] == "top"), 3),
        "statements": statements_,
    }


def _table_difference(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    changed = {}
    for table, values in after.items():
        delta = {k: v - before.get(table, {}).get(k, 0) for k, v in values.items()}
        if any(delta.values()):
            changed[table] = {k: v for k, v in delta.items() if v}
    return changed


_LOG_LINE = re.compile(r"\[(\d+)\] <([^>]*)> db=(\S*) app=(.*?) : (?:LOG:\s+)?(.*)$")


def _log_events(log_path: Path, offset: int, database: str) -> tuple[dict[str, Any], int]:
    """The connections, disconnections and autovacuum runs logged since `offset`."""
    text = log_path.read_text(errors="replace")
    events: dict[str, Any] = {"connections": {}, "disconnections": {}, "autovacuum": [], "analyze": []}
    for line in text[offset:].splitlines():
        m = _LOG_LINE.search(line)
        if not m:
            continue
        _, backend, db, app, message = m.groups()
        if "connection authorized" in message and db == database:
            key = app or "(no application name)"
            events["connections"][key] = events["connections"].get(key, 0) + 1
        elif "disconnection: session time" in message and db == database:
            key = f"{app or '(no application name)'}"
            events["disconnections"].setdefault(key, []).append(message.split("session time: ")[1].split(" ")[0])
        elif "automatic vacuum of table" in message and f'"{database}.' in message:
            events["autovacuum"].append(message.split("automatic vacuum of table ")[1].split(":")[0])
        elif "automatic analyze of table" in message and f'"{database}.' in message:
            events["analyze"].append(message.split("automatic analyze of table ")[1].split(" ")[0])
    return events, len(text)


def _measured(
    admin: psycopg.Connection,
    inside: psycopg.Connection,
    database: str,
    stack: procs.Stack,
    log_path: Path,
    seconds: float | None,
    per: float | None,
    run: Any = None,
) -> dict[str, Any]:
    counters = Counters(admin, inside, database)
    # An idle backend sends its pending statistics within 10 s (PGSTAT_IDLE_INTERVAL): what came
    # before the window is counted before it.
    time.sleep(_STATS_FLUSH_SECONDS)
    offset = len(log_path.read_text(errors="replace"))
    tables_before = counters.table_stats()
    before = counters.snapshot()
    meter = CpuMeter(stack.cpu_roots()).start()
    load_before = os.getloadavg()
    if run is None:
        assert seconds is not None
        time.sleep(seconds)
    else:
        run()
    cpu = meter.stop()
    elapsed = time.monotonic() - before["at"]
    # pg_stat_statements and the log are current at once; the database's and tables' counters
    # once the backends have sent what they hold (the timers' few statements meanwhile count too).
    statements_after = counters.snapshot()["statements"]
    events, _ = _log_events(log_path, offset, database)
    time.sleep(_STATS_FLUSH_SECONDS)
    after = {**counters.snapshot(), "statements": statements_after}
    tables_after = counters.table_stats()
    divisor = per if per is not None else elapsed
    result = _difference(before, after, divisor)
    result["per"] = "completed job" if per is not None else "second"
    result["elapsed_seconds"] = round(elapsed, 2)
    result["tables"] = _table_difference(tables_before, tables_after)
    result["log"] = events
    result["cpu_ms"] = {k: round(v * 1000 / divisor, 3) for k, v in cpu.items() if k in ("service", "postgres", "core")}
    result["load_average"] = [load_before, os.getloadavg()]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--burst-users", type=int, default=200)
    parser.add_argument("--queue", type=int, default=5)
    parser.add_argument("--skip-burst", action="store_true")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--disable-triggers",
        default="",
        help="comma-separated triggers of analysis_jobs disabled in the burst's database (what a design's trigger costs a job)",
    )
    parser.add_argument("--keep-workdir", action="store_true")
    args = parser.parse_args(argv)

    statements.SERVER_SETTINGS.update(_LOG_SETTINGS)
    workdir = Path(tempfile.mkdtemp(prefix="idle-counts-"))
    protoset = write_protoset(workdir / "queue.protoset")
    db = procs.Database(workdir, durable=True, statement_stats=True)
    db.start()
    log_path = workdir / "pgdata" / "server.log"
    report: dict[str, Any] = {"commit": os.popen("git rev-parse --short HEAD").read().strip()}
    try:
        with psycopg.connect(db.dsn, autocommit=True) as admin:
            if not args.skip_idle:
                dsn = procs.create_database(db, "idle")
                dbsetup.grant_credits(dsn, "idle-u", 50, 2)
                with psycopg.connect(dsn, autocommit=True) as inside, procs.Stack(db, dsn, workdir, "idle", manual=True) as stack:
                    time.sleep(2.0)
                    report["idle_empty"] = _measured(admin, inside, "idle", stack, log_path, args.idle_seconds, None)
                    run_ghz(stack.address, ADMIT, admit_data("idle-u", 50, "idle"), protoset=protoset, concurrency=4, total=100)
                    dbsetup.wait_for(dsn, "idle-u", lambda c: c.get("running", 0) == 50, timeout=30)
                    time.sleep(2.0)
                    report["idle_in_flight"] = _measured(admin, inside, "idle", stack, log_path, args.idle_seconds, None)
            if not args.skip_burst:
                users, queue = args.burst_users, args.queue
                jobs = users * queue
                dsn = procs.create_database(db, "burst")
                dbsetup.grant_credits(dsn, "burst-u", users, queue + 1)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    for trigger in filter(None, args.disable_triggers.split(",")):
                        conn.execute(sql.SQL("ALTER TABLE analysis_jobs DISABLE TRIGGER {}").format(sql.Identifier(trigger)))
                report["burst_disabled_triggers"] = list(filter(None, args.disable_triggers.split(",")))
                with (
                    psycopg.connect(dsn, autocommit=True) as inside,
                    procs.Stack(db, dsn, workdir, "burst", manual=True, judging_seconds=0.2) as stack,
                ):
                    run_ghz(stack.address, ADMIT, admit_data("burst-u", users, "batch"), protoset=protoset, concurrency=16, total=jobs)
                    dbsetup.wait_for(dsn, "burst-u", lambda c: c.get("running", 0) == users, timeout=60)
                    # What autovacuum makes of the admits' writes is not the completions' work.
                    inside.execute("VACUUM ANALYZE")
                    time.sleep(1.0)

                    def judge() -> None:
                        stack.start_judging()
                        dbsetup.wait_for(dsn, "burst-u", lambda c: c.get("succeeded", 0) == jobs, timeout=120, poll=0.02)

                    report["burst"] = _measured(admin, inside, "burst", stack, log_path, None, float(jobs), run=judge)
    finally:
        db.stop()
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    if args.keep_workdir:
        print(f"workdir: {workdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
