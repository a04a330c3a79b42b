"""What one grant of the fleet's capacity costs PostgreSQL as the jobs waiting for it grow.

A fresh embedded PostgreSQL (not durable: this measures the statement, not the commit), migrated;
`--users` users with `--jobs` jobs each, one slot each, a capacity of `--capacity`: each user's
first job PENDING (waiting for capacity, by the migration's trigger), the others QUEUED. A first
grant fills the capacity; then, `--cycles` times: one granted job ends, its user's next job
becomes PENDING (and waits), and one grant is timed from the client (`queue_grant_capacity`, the
function the service calls under the capacity lock). It answers "does a grant's cost grow with
the number of jobs waiting?" for docs/scaling.md §10: run it on a tree before and after a change.

    .venv/bin/python -m bench.probes.capacity_grant [--users 200] [--capacity 20] [--out FILE]
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


def measure(users: int, jobs: int, capacity: int, cycles: int) -> dict[str, object]:
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
                rows = [
                    (uuid.uuid4(), f"u{user}", uuid.uuid4(), f"k{job}", "pending" if job == 0 else "queued", 1 if job == 0 else None)
                    for user in range(users)
                    for job in range(jobs)
                ]
                with conn.cursor() as cursor:
                    cursor.executemany(
                        """INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot, price)
                           VALUES (%s, %s, %s, %s, '\\x00', %s, nextval('analysis_jobs_queue_seq'), %s, 1)""",
                        rows,
                    )
                conn.execute("ANALYZE analysis_jobs")
                conn.execute("SELECT * FROM queue_grant_capacity(30, 1800, 1, %s)", (capacity,)).fetchall()
                seconds = []
                for _ in range(cycles):
                    ended = conn.execute(
                        "SELECT job_id, user_id FROM analysis_jobs WHERE status = 'pending' AND capacity_token IS NOT NULL ORDER BY random() LIMIT 1"
                    ).fetchone()
                    if ended is None:
                        break
                    conn.execute(
                        "UPDATE analysis_jobs SET status = 'succeeded', end_time = clock_timestamp() WHERE job_id = %s", (ended[0],)
                    )
                    conn.execute(
                        """UPDATE analysis_jobs SET status = 'pending', slot = 1
                            WHERE job_id = (SELECT job_id FROM analysis_jobs WHERE user_id = %s AND status = 'queued' ORDER BY queue_seq LIMIT 1)""",
                        (ended[1],),
                    )
                    waiting = conn.execute(
                        "SELECT count(*) FROM analysis_jobs WHERE status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL"
                    ).fetchone()[0]
                    started = time.perf_counter()
                    conn.execute("SELECT * FROM queue_grant_capacity(30, 1800, 1, 10)").fetchall()
                    seconds.append((time.perf_counter() - started, waiting))
        finally:
            database.stop()
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
    args = parser.parse_args()
    results = [measure(users, args.jobs, args.capacity, args.cycles) for users in args.users]
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
