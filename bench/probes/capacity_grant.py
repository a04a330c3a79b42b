"""What one grant of the fleet's capacity costs PostgreSQL as the jobs waiting for it grow.

A fresh embedded PostgreSQL (not durable: this measures the statement, not the commit), migrated;
`--users` users with `--jobs` jobs each, one slot each, a capacity of `--capacity`: each user's
first job PENDING (waiting for capacity, by the migration's trigger), the others QUEUED. A first
grant fills the capacity; then, `--cycles` times: one granted job ends, its user's next job
becomes PENDING (and waits), and one grant is timed from the client (`queue_grant_capacity`, the
function the service calls under the capacity lock). It answers "does a grant's cost grow with
the number of jobs waiting?" for docs/scaling.md §10: run it on a tree before and after a change.

    .venv/bin/python -m bench.probes.capacity_grant [--users 200] [--capacity 20] [--out FILE]
    .venv/bin/python -m bench.probes.capacity_grant --users 200 --cycles 300 --explain FILE

`--explain FILE`: after the cycles, one more grant runs with auto_explain (ANALYZE, BUFFERS,
nested statements: each statement of the grant's functions with its plan and the buffers it
read), written to FILE; the pauses table is left as a database in service has it, never analyzed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from queue_service.dev.embedded_postgres import EmbeddedPostgres
from queue_service.store import migrations

_AUTO_EXPLAIN = {"log_min_duration": "0", "log_nested_statements": "on", "log_analyze": "on", "log_buffers": "on", "log_timing": "off"}


def measure(users: int, jobs: int, capacity: int, cycles: int, explain: Path | None = None) -> dict[str, object]:
    marker = ""
    with tempfile.TemporaryDirectory(prefix="capacity-grant-") as folder:
        database = EmbeddedPostgres(Path(folder) / "pg", durable=False)
        database.start()
        try:
            asyncio.run(migrations.migrate(database.dsn()))
            with psycopg.connect(database.dsn(), autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO queue_capacity (capacity) VALUES (%s) ON CONFLICT (singleton) DO UPDATE SET capacity = EXCLUDED.capacity",
                    (capacity,),
                )
                # Every job queued, then each user's first promoted by the service's promotion:
                # under the capacity it waits for a grant (functions/queue_seat_on_entry.sql).
                rows = [(uuid.uuid4(), f"u{user}", uuid.uuid4(), f"k{job}", "queued", None) for user in range(users) for job in range(jobs)]
                with conn.cursor() as cursor:
                    cursor.executemany(
                        """INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot, price)
                           VALUES (%s, %s, %s, %s, '\\x00', %s, nextval('analysis_jobs_queue_seq'), %s, 1)""",
                        rows,
                    )
                    cursor.executemany("SELECT * FROM queue_promote_queued_jobs(%s, 1, 1800, 30)", [(f"u{user}",) for user in range(users)])
                conn.execute("ANALYZE analysis_jobs")
                conn.execute("SELECT * FROM queue_grant_capacity(30, 1800, 1, %s)", (capacity,)).fetchall()
                seconds = []

                def end_one_and_wait_her_next() -> bool:
                    ended = conn.execute(
                        "SELECT job_id, user_id FROM analysis_jobs WHERE status = 'pending' AND capacity_token IS NOT NULL ORDER BY random() LIMIT 1"
                    ).fetchone()
                    if ended is None:
                        return False
                    conn.execute(
                        "UPDATE analysis_jobs SET status = 'succeeded', end_time = clock_timestamp() WHERE job_id = %s", (ended[0],)
                    )
                    # Her next job is promoted into the freed slot (and waits for a grant), as the service does.
                    conn.execute("SELECT * FROM queue_promote_queued_jobs(%s, 1, 1800, 30)", (ended[1],)).fetchall()
                    return True

                for _ in range(cycles):
                    if not end_one_and_wait_her_next():
                        break
                    waiting = conn.execute(
                        "SELECT count(*) FROM analysis_jobs WHERE status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL"
                    ).fetchone()[0]
                    started = time.perf_counter()
                    conn.execute("SELECT * FROM queue_grant_capacity(30, 1800, 1, 10)").fetchall()
                    seconds.append((time.perf_counter() - started, waiting))
                if explain is not None and end_one_and_wait_her_next():  # capacity to grant
                    conn.execute("LOAD 'auto_explain'")
                    for name, value in _AUTO_EXPLAIN.items():
                        conn.execute(f"SET auto_explain.{name} = {value}")
                    marker = f"grant explained {uuid.uuid4()}"
                    conn.execute("SELECT %s", (marker,))
                    conn.execute("SELECT * FROM queue_grant_capacity(30, 1800, 1, 10)").fetchall()
                    conn.execute("SET auto_explain.log_min_duration = -1")
        finally:
            database.stop()
        if explain is not None and marker:
            server_log = (Path(folder) / "pg" / "server.log").read_text()
            explain.write_text(server_log[server_log.rfind(marker) :])
    ordered = sorted(s for s, _ in seconds)
    return {
        "users": users,
        "jobs_per_user": jobs,
        "capacity": capacity,
        "grants": len(ordered),
        "waiting_when_granting": {"min": min(w for _, w in seconds), "max": max(w for _, w in seconds)},
        "grant_ms": {"p50": round(ordered[len(ordered) // 2] * 1000, 3), "p90": round(ordered[int(len(ordered) * 0.9)] * 1000, 3)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.capacity_grant", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--capacity", type=int, default=20)
    parser.add_argument("--cycles", type=int, default=150)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--explain", type=Path, help="auto_explain of one more grant after the cycles (the last --users only)")
    args = parser.parse_args()
    results = [
        measure(users, args.jobs, args.capacity, args.cycles, args.explain if users == args.users[-1] else None) for users in args.users
    ]
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
