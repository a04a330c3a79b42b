"""The NOTIFY commit ceiling: commits per second of a trivial UPDATE on `analysis_jobs` with the
job table's trigger as the queue now has it (it appends a row to the job-change feed), with the
trigger's former body (a NOTIFY per change), and with no trigger at all (the floor).

    .venv/bin/python -m bench.probes.notify_ceiling [--seconds 5] [--repeats 3] [--clients 16 32]

A committing transaction that has called NOTIFY holds a cluster-wide lock from queueing its
notifications to the end of its commit (WAL flush included), so notifying commits cannot share a
WAL flush (group commit) and run one at a time. This measures what that cost, and what the feed
costs instead.

For each PostgreSQL (durable: fsync and synchronous_commit on, as in production; then with
fsync and synchronous_commit off), each client count and each repeat, three pgbench runs back to
back (same conditions, so their ratios are fair):

- `feed`: each client updates its own row's `last_error` (a new value each time, so the
  trigger `analysis_jobs_announce_update` fires; `last_error` is in no index, so the update is
  HOT and nothing else is costly); the trigger inserts one feed row per commit;
- `notify`: the same, with the trigger function replaced for the run by its body before the
  feed (`pg_notify` of the change's JSON), then restored;
- `no_notify`: the same statement in sessions with `session_replication_role = replica`, where
  ordinary triggers do not fire: no NOTIFY, no feed row, nothing else changes (the floor).

One listener (as every replica keeps one) LISTENs on the trigger's former channel and drains it
throughout; the run checks that it received one notification per committed `notify` update and
none otherwise, and that `feed` wrote one feed row per commit. pgbench is PostgreSQL's own (the
embedded server's), in prepared mode, one thread per client up to the machine's cores. The
machine's load average is recorded with each figure.

Prints a table and writes bench/results/history/notify-ceiling.json.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.probes.rounds import RESULTS, loadavg, new_report, scratch_database, write_report
from bench.procs import Database
from queue_service.dev.embedded_postgres import POSTGRES_BIN_PATH
from queue_service.store import JOB_CHANGES_CHANNEL

_ROW_KEY = "notify-ceiling-"
# Each client updates its own row (no row-lock waits), with a new last_error (the trigger fires).
_SCRIPT = f"UPDATE analysis_jobs SET last_error = md5(random()::text) WHERE job_id = md5('{_ROW_KEY}' || :client_id)::uuid;\n"


# The trigger function's body before the job-change feed (migration 0008), for the `notify` mode.
_NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION analysis_jobs_announce_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'analysis_job_changes',
        json_build_object(
            'user_id', NEW.user_id,
            'job_id', NEW.job_id,
            'status', NEW.status,
            'old_status', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
            'release_claimed', NEW.status = 'pending' AND NEW.release_attempts > 0
        )::text);
    RETURN NULL;
END;
$$"""
MODES = ("feed", "notify", "no_notify")


def seed_rows(dsn: str, rows: int) -> None:
    """One finished job per pgbench client (`client_id` 0..rows-1), inserted without triggers."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            """
            INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price, end_time)
            SELECT md5(%(key)s || i)::uuid, 'notify-ceiling-user-' || i, gen_random_uuid(), 'k' || i, '\\x00', 'succeeded',
                   nextval('analysis_jobs_queue_seq'), 0, clock_timestamp()
              FROM generate_series(0, %(rows)s - 1) AS i
            ON CONFLICT DO NOTHING
            """,
            {"key": _ROW_KEY, "rows": rows},
        )
        conn.execute("VACUUM ANALYZE analysis_jobs")


class Listener(threading.Thread):
    """A LISTEN connection that drains the job-change channel and counts what it hears."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(f"LISTEN {JOB_CHANGES_CHANNEL}")
        self.received = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            for _ in self.conn.notifies(timeout=0.2):
                self.received += 1

    def stop(self) -> None:
        self._stopping.set()
        self.join(5)
        self.conn.close()


def pgbench(dsn: str, script: Path, *, clients: int, seconds: float, suppress_notify: bool) -> dict[str, float]:
    env = dict(os.environ)
    if suppress_notify:
        env["PGOPTIONS"] = "-c session_replication_role=replica"
    args = [
        str(POSTGRES_BIN_PATH / "pgbench"),
        "--no-vacuum",
        "--protocol=prepared",
        f"--time={int(seconds)}",
        f"--client={clients}",
        f"--jobs={min(clients, os.cpu_count() or 1)}",
        f"--file={script}",
        dsn,
    ]
    completed = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"pgbench failed: {completed.stderr[-2000:]}")
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", completed.stdout)
    latency = re.search(r"latency average = ([\d.]+) ms", completed.stdout)
    processed = re.search(r"number of transactions actually processed: (\d+)", completed.stdout)
    if not (tps and latency and processed):
        raise RuntimeError(f"unexpected pgbench output:\n{completed.stdout[-2000:]}")
    return {"commits_per_s": float(tps[1]), "latency_ms": float(latency[1]), "commits": int(processed[1])}


def _feed_rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM analysis_job_feed").fetchone()
    return int(row[0]) if row else 0


def _trigger_function(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_get_functiondef('analysis_jobs_announce_change'::regproc)").fetchone()
    assert row is not None
    return str(row[0])


def _install(dsn: str, definition: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(definition.encode())


def measure(db: Database, *, clients: list[int], seconds: float, repeats: int, workdir: Path) -> dict[str, Any]:
    dsn = db.dsn
    seed_rows(dsn, max(clients))
    script = workdir / "update-last-error.sql"
    script.write_text(_SCRIPT)
    feed_function = _trigger_function(dsn)
    listener = Listener(dsn)
    listener.start()
    runs: list[dict[str, Any]] = []
    try:
        for repeat in range(repeats):
            for count in clients:
                for mode in MODES:
                    if mode == "notify":
                        _install(dsn, _NOTIFY_FUNCTION)
                    before, rows_before = listener.received, _feed_rows(dsn)
                    load = loadavg()
                    try:
                        result = pgbench(dsn, script, clients=count, seconds=seconds, suppress_notify=mode == "no_notify")
                    finally:
                        if mode == "notify":
                            _install(dsn, feed_function)
                    time.sleep(0.3)  # let the listener drain what was committed last
                    heard = listener.received - before
                    feed_rows = _feed_rows(dsn) - rows_before
                    expected = result["commits"] if mode == "notify" else 0
                    # pgbench counts the transactions it finished; a commit it did not wait out
                    # at the end may still have notified, hence the small tolerance.
                    if abs(heard - expected) > count:
                        raise RuntimeError(f"{mode}, {count} clients: {result['commits']} commits but {heard} notifications")
                    expected_rows = result["commits"] if mode == "feed" else 0
                    if abs(feed_rows - expected_rows) > count:
                        raise RuntimeError(f"{mode}, {count} clients: {result['commits']} commits but {feed_rows} feed rows")
                    runs.append(
                        {
                            "repeat": repeat,
                            "clients": count,
                            "mode": mode,
                            "loadavg": load,
                            "notifications": heard,
                            "feed_rows": feed_rows,
                            **result,
                        }
                    )
                    print(
                        f"  repeat {repeat} clients {count:2} {mode:9} {result['commits_per_s']:8.0f} commits/s  "
                        f"latency {result['latency_ms']:6.2f} ms  load {load[0]}",
                        flush=True,
                    )
    finally:
        listener.stop()
    summary = {}
    for count in clients:
        of = {mode: [r for r in runs if r["clients"] == count and r["mode"] == mode] for mode in MODES}
        row: dict[str, Any] = {}
        for mode in MODES:
            rates = [r["commits_per_s"] for r in of[mode]]
            row[f"{mode}_commits_per_s"] = {"median": round(statistics.median(rates)), "range": [round(min(rates)), round(max(rates))]}
        for mode in ("feed", "notify"):
            ratios = [a["commits_per_s"] / b["commits_per_s"] for a, b in zip(of[mode], of["no_notify"], strict=True)]
            row[f"{mode}_over_no_notify"] = {
                "median": round(statistics.median(ratios), 2),
                "range": [round(min(ratios), 2), round(max(ratios), 2)],
            }
        summary[str(count)] = row
    return {"runs": runs, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--durable-only", action="store_true", help="skip the fsync-off PostgreSQL")
    parser.add_argument("--out", type=Path, default=RESULTS / "notify-ceiling.json")
    args = parser.parse_args()
    report = new_report(seconds_per_run=args.seconds, repeats=args.repeats, statement=_SCRIPT.strip())
    for durable in (True,) if args.durable_only else (True, False):
        label = "durable" if durable else "fsync_off"
        with scratch_database(f"acurio-notify-{label}-", durable=durable) as (db, workdir):
            with psycopg.connect(db.dsn) as conn:
                settings = conn.execute(
                    "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings"
                    " WHERE name IN ('server_version', 'fsync', 'synchronous_commit', 'wal_sync_method', 'commit_delay')"
                ).fetchone()
            print(f"{label}: {settings[0] if settings else ''}", flush=True)
            report[label] = {
                "postgres_settings": settings[0] if settings else "",
                **measure(db, clients=args.clients, seconds=args.seconds, repeats=args.repeats, workdir=workdir),
            }
    print()
    print(
        f"{'':10} {'clients':>7} {'feed/s':>8} {'notify/s':>9} {'none/s':>8} {'feed/none':>10} {'notify/none':>12}   (median of {args.repeats})"
    )
    for label in ("durable", "fsync_off"):
        for count, row in report.get(label, {}).get("summary", {}).items():
            print(
                f"{label:10} {count:>7} {row['feed_commits_per_s']['median']:>8} {row['notify_commits_per_s']['median']:>9}"
                f" {row['no_notify_commits_per_s']['median']:>8} {row['feed_over_no_notify']['median']:>10}"
                f" {row['notify_over_no_notify']['median']:>12}   (ranges {row['feed_over_no_notify']['range']}, {row['notify_over_no_notify']['range']})"
            )
    print()
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
