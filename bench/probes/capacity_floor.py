"""The capacity's floor: what a saturated capacity must cost PostgreSQL at least, measured.

Scenario 8 (`capacity_saturated`) compares the capacity's batch with `paced`, the same jobs at the
capacity's pace with no capacity at work. Whatever a capacity does, it must write each grant down
in PostgreSQL (every replica must see which runs are in use) and find the next in line. This
probe runs the `paced` batch again with only that added, by a trigger the probe installs in the
batch's database, and gives each batch's PostgreSQL CPU per job as a ratio to `paced` measured in
the same round. The trigger fires at the commit of each completion (a constraint trigger,
deferred), in the completion's own transaction, as the service's grant rides with a completion
when it can; it adds no commit:

- `floor_token_row`: the least any design writes: one HOT update of a row in a small table of
  tokens (the grant as a token's holder), found by its key;
- `floor_job_row`: the least a design writes that keeps the grant on the job row, as ours does:
  the completed user's next job (PENDING, promoted in the same transaction) found by its index
  and updated once more, changing its release due (an indexed column, so not a HOT update: every
  index the row is in gets an entry, the change trigger runs);
- `floor_contract`: `floor_job_row` plus what the contract adds to any grant: the change
  announced (a row in the change feed, as every change of a job's view is: the grant changes
  the job's release attempt and its waiting) and the user's turn recorded (the time of her last
  start, which I13's order reads), one upsert;
- `capacity`: the service's own capacity (scenario 8's batch);
- `capacity_without_decisions`: the same, with the grant's two decisions that change nothing in
  this batch replaced by their shortcut (every user has one slot, none is paused, none has a
  re-check): the walk to the next in line (in turn order, each candidate's runs in use counted,
  the lowest first) becomes the first waiting job in turn order, and the move of the granted
  user's other waiting jobs behind her new turn (she has none) does nothing. What the decisions
  cost; the batch's figures (`most_runs_at_once`, `most_passed_over`) show that nothing else
  changed. Not a design: in service those decisions are I13's.

Each batch also gives the server's WAL bytes per job while judging.

Rounds rotate the order of the batches; each batch has a fresh database and replica.

    .venv/bin/python -m bench.probes.capacity_floor [--rounds 3] [--batches NAME ...] [--out bench/results/history/capacity-floor.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.context import FULL, Context
from bench.probes.rounds import RESULTS, loadavg, median_ratio, new_report, rotated, scratch_database, write_medians
from bench.protoset import write_protoset
from bench.scenarios.capacity import saturated_batch

_FLOOR_TOKEN_ROW = """
CREATE TABLE bench_floor_tokens (token integer PRIMARY KEY, job_id uuid, granted_at timestamptz) WITH (fillfactor = 50);
INSERT INTO bench_floor_tokens (token) SELECT generate_series(0, 1023);
CREATE FUNCTION bench_floor_grant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE bench_floor_tokens SET job_id = NEW.job_id, granted_at = clock_timestamp()
     WHERE token = abs(hashtext(NEW.user_id)) % 1024;
    RETURN NULL;
END $$;
"""

_FLOOR_JOB_ROW = """
CREATE FUNCTION bench_floor_grant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE analysis_jobs SET next_release_at = next_release_at - interval '1 microsecond'
     WHERE user_id = NEW.user_id AND status = 'pending' AND delta_of_job_id IS NULL;
    RETURN NULL;
END $$;
"""

_FLOOR_CONTRACT = """
CREATE FUNCTION bench_floor_grant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_job analysis_jobs;
BEGIN
    UPDATE analysis_jobs SET next_release_at = next_release_at - interval '1 microsecond'
     WHERE user_id = NEW.user_id AND status = 'pending' AND delta_of_job_id IS NULL
    RETURNING * INTO v_job;
    IF FOUND THEN
        PERFORM analysis_jobs_announce(v_job, 'pending');
        INSERT INTO user_capacity_turns AS t (user_id, last_turn_at) VALUES (v_job.user_id, clock_timestamp())
        ON CONFLICT ON CONSTRAINT user_capacity_turns_pkey DO UPDATE SET last_turn_at = EXCLUDED.last_turn_at;
    END IF;
    RETURN NULL;
END $$;
"""

# Valid only in this batch's shape (see the module's docstring): semantics-breaking anywhere else.
_WITHOUT_DECISIONS = """
CREATE OR REPLACE FUNCTION public.queue_capacity_next_in_line() RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE v_job_id uuid;
BEGIN
    SELECT w.job_id INTO v_job_id FROM analysis_jobs w
     WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
     ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq LIMIT 1 FOR UPDATE SKIP LOCKED;
    RETURN v_job_id;
END $$;
CREATE OR REPLACE FUNCTION public.queue_seat_wait_behind_turn(p_user_id text, p_turn timestamp with time zone)
 RETURNS void LANGUAGE plpgsql AS $$ BEGIN END $$;
"""

_ON_COMPLETION = """
CREATE CONSTRAINT TRIGGER bench_floor_grant AFTER UPDATE OF status ON analysis_jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.status = 'succeeded' AND OLD.status IS DISTINCT FROM 'succeeded')
    EXECUTE FUNCTION bench_floor_grant();
"""

BATCHES = ("paced", "floor_token_row", "floor_job_row", "floor_contract", "capacity", "capacity_without_decisions")


def _hook(sql: str | None, seen: list[str]) -> Any:
    """Remembers the batch's database (for its row counts after the batch) and installs `sql`."""

    def before_judging(dsn: str) -> None:
        seen.append(dsn)
        if sql:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql)

    return before_judging


def _row_writes(dsn: str, jobs: int) -> dict[str, float]:
    """Row versions written per job in the whole batch (admission included), from the statistics the
    service's backends flushed when they exited: the check that a floor's trigger did its writes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname IN ('analysis_jobs', 'bench_floor_tokens', 'analysis_job_feed', 'user_capacity_turns')"
        ).fetchall()
    figures: dict[str, float] = {}
    for relname, inserts, updates, hot in rows:
        if relname in ("analysis_job_feed", "user_capacity_turns"):
            figures[f"{relname}_rows_written_per_job"] = round((inserts + updates) / jobs, 2)
        else:
            figures[f"{relname}_updates_per_job"] = round(updates / jobs, 2)
            figures[f"{relname}_hot_updates_per_job"] = round(hot / jobs, 2)
    return figures


def one_batch(ctx: Context, batch: str, round_index: int) -> dict[str, Any]:
    sizes = ctx.sizes
    name = f"floor_{batch}_{round_index}"
    paced_users, paced_queue = sizes.capacity, sizes.capacity_users * sizes.capacity_queue // sizes.capacity
    load = loadavg()
    seen: list[str] = []
    changes = {
        "floor_token_row": _FLOOR_TOKEN_ROW + _ON_COMPLETION,
        "floor_job_row": _FLOOR_JOB_ROW + _ON_COMPLETION,
        "floor_contract": _FLOOR_CONTRACT + _ON_COMPLETION,
        "capacity_without_decisions": _WITHOUT_DECISIONS,
    }
    hook = _hook(changes.get(batch), seen)
    if batch.startswith("capacity"):
        result = saturated_batch(ctx, name, users=sizes.capacity_users, capacity=sizes.capacity, before_judging=hook)
    else:
        result = saturated_batch(ctx, name, users=paced_users, capacity=0, queue=paced_queue, before_judging=hook)
    time.sleep(1.0)  # the exited backends' statistics reach the shared counters
    return {
        "batch": batch,
        "round": round_index,
        "loadavg": load,
        "jobs": result["ops"],
        "unattributed_cpu_cores": result.get("unattributed_cpu_cores"),
        "makespan_seconds": result["makespan_seconds"],
        "cpu_ms_per_job": result["cpu_ms_per_op"],
        "wal_bytes_per_job": result["wal_bytes_per_job"],
        "most_runs_at_once": result["most_runs_at_once"],
        "most_passed_over": result["most_passed_over"],
        **_row_writes(seen[0], result["ops"]),
        **{key: result[key] for key in ("statements", "postgres_cpu_ms_per_op_by_process") if key in result},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--batches", nargs="+", choices=BATCHES, default=list(BATCHES), help="the batches to run (`paced` always runs: the ratios' base)"
    )
    parser.add_argument(
        "--statement-stats",
        action="store_true",
        help="each batch's PostgreSQL time per statement per job (pg_stat_statements; costs a few per cent: judge the ratios on runs without it)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "capacity-floor.json")
    args = parser.parse_args()
    sizes = FULL
    report = new_report(
        rounds=args.rounds,
        capacity=sizes.capacity,
        capacity_users=sizes.capacity_users,
        jobs_per_batch=sizes.capacity_users * sizes.capacity_queue,
        judging_seconds=sizes.judging_seconds,
        postgres_durable=True,
        statement_stats=args.statement_stats,
    )
    runs: list[dict[str, Any]] = []
    with scratch_database("acurio-capacity-floor-", statement_stats=args.statement_stats) as (db, workdir):
        # Every statement of the grant is listed, down to the smallest (they are many and small).
        ctx = Context(db, workdir, sizes, write_protoset(workdir / "queue.protoset"), statements_top=80)
        batches = tuple(b for b in BATCHES if b == "paced" or b in args.batches)
        for round_index in range(args.rounds):
            for batch in rotated(batches, round_index):
                run = one_batch(ctx, batch, round_index)
                runs.append(run)
                cpu = run["cpu_ms_per_job"]
                print(
                    f"round {round_index} {batch:26} PostgreSQL {cpu.get('postgres', 0):.3f} ms/job  "
                    f"service {cpu.get('service', 0):.3f} ms/job  job row updates {run['analysis_jobs_updates_per_job']}/job  feed rows {run.get('analysis_job_feed_rows_written_per_job')}/job  WAL {run['wal_bytes_per_job']} B/job  makespan {run['makespan_seconds']:.1f} s  load {run['loadavg'][0]}",
                    flush=True,
                )

    by = {(r["round"], r["batch"]): r for r in runs}
    ratios: dict[str, dict[str, Any]] = {}
    for batch in batches[1:]:
        ratios[f"{batch}_postgres_cpu_per_job_over_paced"] = median_ratio(
            by, args.rounds, batch, "paced", lambda r: r["cpu_ms_per_job"]["postgres"]
        )
        ratios[f"{batch}_wal_bytes_per_job_over_paced"] = median_ratio(by, args.rounds, batch, "paced", lambda r: r["wal_bytes_per_job"])
    write_medians(report, runs, ratios, args.out, key="ratios", width=50)
    return 0


if __name__ == "__main__":
    sys.exit(main())
