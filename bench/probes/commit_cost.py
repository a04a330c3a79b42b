"""What a commit and a job's status changes cost PostgreSQL's backend, in CPU per call.

One connection, durable PostgreSQL (the bench's own embedded server, migrated, with a finished
history loaded), each statement its own transaction, prepared; the backend's CPU is read from
/proc before and after. Cases:

- floors: `SELECT 1`, an advisory lock, a one-row HOT update, a one-row insert (each a commit);
- a job's four status commits (INSERT queued, then pending, running, succeeded) on
  `analysis_jobs` as the migrations leave it, with and without the change trigger (the
  NOTIFY), then again after dropping three indexes every non-HOT update writes
  (`newest_admitted`, `user_newest_admitted`, `user_newest_first`);
- an admit two ways: only the rows it must write, as plain prepared statements (the run
  reservation, its own commit; then one transaction of the lock, the reservation's delete, the
  job, the debit and the ledger entry), and the service's own two admit statements
  (`bench.driver.bare_admit`) on a pool of one connection.

It answers "is it the index entries, the NOTIFY or the commit itself?" and "how far is the admit
from the writes it cannot do without?" for docs/scaling.md §1.

    .venv/bin/python -m bench.probes.commit_cost [--rounds 3] [--calls 2000] [--out bench/results/history/commit-cost.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench import dbsetup
from bench.driver import TIMEOUTS, bare_admit
from bench.procs import Database
from queue_service.store import Store
from queue_service.store.pool import create_pool

_TICKS = os.sysconf("SC_CLK_TCK")
_DROPPABLE_INDEXES = ["analysis_jobs_newest_admitted", "analysis_jobs_user_newest_admitted", "analysis_jobs_user_newest_first"]

_FLOORS: dict[str, tuple[str, Callable[[int], tuple[Any, ...]]]] = {
    "SELECT 1": ("SELECT 1", lambda i: ()),
    "advisory lock": ("SELECT pg_advisory_xact_lock(%s)", lambda i: (i,)),
    "one-row HOT update": ("UPDATE commit_cost_rows SET v = v + 1 WHERE id = %s", lambda i: (i % 1000 + 1,)),
    "one-row insert": ("INSERT INTO commit_cost_log (v) VALUES (%s)", lambda i: (i,)),
}

_LIFECYCLE = [
    "INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price)"
    " VALUES (%(job_id)s, %(user_id)s, gen_random_uuid(), %(key)s, '\\x00', 'queued', nextval('analysis_jobs_queue_seq'), 1)",
    "UPDATE analysis_jobs SET status = 'pending', slot = 1, promote_time = clock_timestamp(), next_release_at = clock_timestamp()"
    " WHERE job_id = %(job_id)s",
    "UPDATE analysis_jobs SET status = 'running', start_time = clock_timestamp(), next_release_at = NULL,"
    " next_reconcile_at = clock_timestamp() + interval '1 minute' WHERE job_id = %(job_id)s",
    "UPDATE analysis_jobs SET status = 'succeeded', slot = NULL, next_reconcile_at = NULL, end_time = clock_timestamp()"
    " WHERE job_id = %(job_id)s",
]


# The rows an admit must write, nothing read back: the reservation is durable before the core
# hears of the run (its own commit), then the placement under the user's lock.
_ADMIT_RESERVATION = (
    "INSERT INTO run_reservations (run_id, user_id, cancel_after) VALUES (%(run_id)s, %(user_id)s, clock_timestamp() + interval '1 minute')"
)
_ADMIT_PLACEMENT = [
    "SELECT pg_advisory_xact_lock(%(lock_key)s)",
    "DELETE FROM run_reservations WHERE run_id = %(run_id)s",
    "INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price)"
    " VALUES (%(job_id)s, %(user_id)s, %(run_id)s, %(key)s, '\\x00', 'queued', nextval('analysis_jobs_queue_seq'), 1)",
    "UPDATE credit_accounts SET balance = balance - 1 WHERE user_id = %(user_id)s",
    "INSERT INTO credit_ledger (user_id, kind, amount, job_id, actor, reason)"
    " VALUES (%(user_id)s, 'charge', -1, %(job_id)s, 'commit-cost', 'admit')",
]
_ADMIT_USERS = 500


def _admit_user(i: int) -> str:
    return f"commit-cost-admit-{abs(i) % _ADMIT_USERS}"


def _admit_writes(conn: psycopg.Connection, i: int) -> None:
    params = {
        "run_id": uuid.uuid4(),
        "job_id": uuid.uuid4(),
        "user_id": _admit_user(i),
        "lock_key": abs(i) % _ADMIT_USERS,
        "key": f"writes-{i}-{uuid.uuid4().hex[:8]}",
    }
    conn.execute(_ADMIT_RESERVATION, params, prepare=True)
    with conn.transaction():
        for statement in _ADMIT_PLACEMENT:
            conn.execute(statement, params, prepare=True)


async def _service_admit_per_call_ms(dsn: str, calls: int) -> float:
    """Backend CPU per admit of the service's own statements, on a pool of one connection."""
    pool = create_pool(dsn, timeouts=TIMEOUTS, min_size=1, max_size=1, timeout=10)
    await pool.open(wait=True)
    try:
        store = Store(pool, database_url=dsn)
        async with pool.connection() as conn:
            pid = int((await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone())["pid"])  # type: ignore[index]
        tag = uuid.uuid4().hex[:8]
        for i in range(min(200, calls)):  # warm: prepared, caches filled
            await bare_admit(store, _admit_user(i), f"served-warm-{tag}-{i}")
        started = _backend_cpu_seconds(pid)
        for i in range(calls):
            await bare_admit(store, _admit_user(i), f"served-{tag}-{i}")
        return (_backend_cpu_seconds(pid) - started) / calls * 1000
    finally:
        await pool.close()


def _backend_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _per_call_ms(dsn: str, calls: int, run: Callable[[psycopg.Connection, int], None], *, without_trigger: bool = False) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if without_trigger:
            conn.execute("SET session_replication_role = replica")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        for i in range(min(200, calls)):  # warm: prepared, caches filled
            run(conn, -1 - i)
        started = _backend_cpu_seconds(pid)
        for i in range(calls):
            run(conn, i)
        return (_backend_cpu_seconds(pid) - started) / calls * 1000


def _lifecycle(tag: str) -> Callable[[psycopg.Connection, int], None]:
    def run(conn: psycopg.Connection, i: int) -> None:
        params = {"job_id": uuid.uuid4(), "user_id": f"commit-cost-{i % 500}", "key": f"{tag}-{i}-{uuid.uuid4().hex[:8]}"}
        for statement in _LIFECYCLE:
            conn.execute(statement, params, prepare=True)

    return run


def _floor(sql: str, args: Callable[[int], tuple[Any, ...]]) -> Callable[[psycopg.Connection, int], None]:
    def run(conn: psycopg.Connection, i: int) -> None:
        conn.execute(sql, args(abs(i)), prepare=True)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--history", type=int, default=200_000, help="finished jobs loaded first (index depth)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "history" / "commit-cost.json")
    args = parser.parse_args()

    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="commit-cost-") as workdir:
        db = Database(Path(workdir), durable=True)
        dsn = db.start()
        try:
            dbsetup.load_history(dsn, jobs=args.history, users=max(1, args.history // 20))
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE commit_cost_rows (id int PRIMARY KEY, v int)")
                conn.execute("INSERT INTO commit_cost_rows SELECT g, 0 FROM generate_series(1, 1000) AS g")
                conn.execute("CREATE TABLE commit_cost_log (id bigserial PRIMARY KEY, v int)")
            cases: list[tuple[str, Callable[[psycopg.Connection, int], None], bool]] = [
                (f"commit: {name}", _floor(sql, arg), False) for name, (sql, arg) in _FLOORS.items()
            ]
            cases += [
                ("job, 4 status commits: all indexes", _lifecycle("all"), False),
                ("job, 4 status commits: all indexes, no trigger", _lifecycle("all-quiet"), True),
                ("admit: only the rows it writes, 2 commits", _admit_writes, False),
            ]
            dbsetup.grant_credits(dsn, "commit-cost-admit-", _ADMIT_USERS, 10**9)
            served = "admit: the service's two statements"
            for round_ in range(args.rounds):
                for name, run, quiet in cases:
                    results.setdefault(name, []).append(round(_per_call_ms(dsn, args.calls, run, without_trigger=quiet), 4))
                    print(f"[{round_}] {name:50s} {results[name][-1]:.3f} ms backend CPU per call", flush=True)
                results.setdefault(served, []).append(round(asyncio.run(_service_admit_per_call_ms(dsn, args.calls)), 4))
                print(f"[{round_}] {served:50s} {results[served][-1]:.3f} ms backend CPU per call", flush=True)
            with psycopg.connect(dsn, autocommit=True) as conn:
                for index in _DROPPABLE_INDEXES:
                    conn.execute(f"DROP INDEX {index}")
            fewer = [
                ("job, 4 status commits: 3 indexes fewer", _lifecycle("fewer"), False),
                ("job, 4 status commits: 3 indexes fewer, no trigger", _lifecycle("fewer-quiet"), True),
            ]
            for round_ in range(args.rounds):
                for name, run, quiet in fewer:
                    results.setdefault(name, []).append(round(_per_call_ms(dsn, args.calls, run, without_trigger=quiet), 4))
                    print(f"[{round_}] {name:50s} {results[name][-1]:.3f} ms backend CPU per call", flush=True)
        finally:
            db.stop()

    summary = {name: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v} for name, v in results.items()}
    report = {
        "what": "backend CPU per call (ms), one connection, durable PostgreSQL, each call its own commit(s); bench/probes/commit_cost.py",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "history_jobs": args.history,
        "calls_per_round": args.calls,
        "dropped_indexes": _DROPPABLE_INDEXES,
        "figures": summary,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    for name, figure in summary.items():
        print(f"  {name:50s} {figure['median']:.3f} ms ({figure['min']:.3f}-{figure['max']:.3f})")


if __name__ == "__main__":
    main()
