"""What the admit's run reservation costs PostgreSQL with and without the live key (docs/scaling.md §15.2).

Migration 0033 gave the reservation its admit's key, a partial unique index on it and the insert's
`ON CONFLICT`, so that concurrent repeats of one admit make one run at the core. This probe
measures the reservation's insert alone, as sql/queries/admit.sql writes it but without the
admit's state read, from `--sessions` sessions at once, each reservation consumed (deleted) two
admits later as the locked admit does, on a fresh, migrated, durable PostgreSQL:

- `key, ON CONFLICT`: the statement now;
- `key, plain insert`: the key and its index, without `ON CONFLICT` (no speculative insertion);
- `no key, no key index`: the round's start (the index dropped for its turn).

The forms take turns within a round. Printed: PostgreSQL's CPU (every process of the server, the
exited ones included) per reservation and its consumption, each round's and the median.

    .venv/bin/python -m bench.probes.reservation_insert [--sessions 16] [--reservations 16000] [--rounds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path

import psycopg

from bench.measure import CLOCK_TICKS, own_cpu_ticks, process_tree, reaped_children_cpu_ticks
from bench.probes.rounds import new_report, print_and_write_forms, scratch_database

_RESERVE = """INSERT INTO run_reservations (run_id, user_id, cancel_after, timeline_id{key_column})
    SELECT %(run_id)s, %(user_id)s, clock_timestamp() + make_interval(secs => 30.0), queue_current_timeline(){key_value}
     WHERE NOT EXISTS (SELECT 1 FROM analysis_jobs WHERE user_id = %(user_id)s AND idempotency_key = %(key)s){conflict}
    RETURNING run_id"""
_WITH_KEY = {"key_column": ", idempotency_key", "key_value": ", %(key)s"}
_NO_KEY = {"key_column": "", "key_value": ""}
_ON_CONFLICT = "\n        ON CONFLICT (user_id, idempotency_key) WHERE NOT canceling DO NOTHING"
# (form, statement, whether the live key's index exists)
FORMS = (
    ("key, ON CONFLICT", _RESERVE.format(**_WITH_KEY, conflict=_ON_CONFLICT), True),
    ("key, plain insert", _RESERVE.format(**_WITH_KEY, conflict=""), True),
    ("no key, no key index", _RESERVE.format(**_NO_KEY, conflict=""), False),
)
_KEY_INDEX = (
    "CREATE UNIQUE INDEX IF NOT EXISTS run_reservations_one_live_per_key ON run_reservations (user_id, idempotency_key) WHERE NOT canceling"
)
_CONSUMED_AFTER = 2


def _postgres_cpu_ticks(postmaster: int) -> int:
    return sum(own_cpu_ticks(pid) for pid in process_tree(postmaster)) + reaped_children_cpu_ticks(postmaster)


async def _session(dsn: str, statement: str, reservations: int, session: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        live: list[uuid.UUID] = []
        for i in range(reservations):
            run_id = uuid.uuid4()
            params = {"run_id": run_id, "user_id": f"u{(session * 7919 + i) % 1000}", "key": f"k-{run_id.hex}"}
            await conn.execute(statement, params)
            live.append(run_id)
            if len(live) > _CONSUMED_AFTER:
                await conn.execute("DELETE FROM run_reservations WHERE run_id = %s", (live.pop(0),))
        for run_id in live:
            await conn.execute("DELETE FROM run_reservations WHERE run_id = %s", (run_id,))


async def _load(dsn: str, statement: str, sessions: int, each: int) -> None:
    await asyncio.gather(*(_session(dsn, statement, each, session) for session in range(sessions)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.reservation_insert", description=__doc__)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--reservations", type=int, default=16_000, help="per form and round, over all sessions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    report = new_report(what="reservation insert forms", sessions=args.sessions, reservations=args.reservations, rounds=args.rounds)
    each = args.reservations // args.sessions
    per_reservation: dict[str, list[float]] = {form: [] for form, _, _ in FORMS}
    with scratch_database("reservation-insert-") as (db, _):
        for number in range(1, args.rounds + 1):
            for form, statement, key_index in FORMS:
                with psycopg.connect(db.dsn, autocommit=True) as conn:
                    conn.execute("DELETE FROM run_reservations")
                    conn.execute("VACUUM run_reservations")
                    conn.execute(_KEY_INDEX if key_index else "DROP INDEX IF EXISTS run_reservations_one_live_per_key")
                before = _postgres_cpu_ticks(db.pid)
                asyncio.run(_load(db.dsn, statement, args.sessions, each))
                ms = (_postgres_cpu_ticks(db.pid) - before) / CLOCK_TICKS * 1000 / (each * args.sessions)
                per_reservation[form].append(ms)
                print(f"round {number}: {form:22} {ms:.4f} ms", flush=True)
    print_and_write_forms(
        per_reservation,
        report,
        args.out,
        heading=f"PostgreSQL CPU per reservation and its consumption, {args.sessions} sessions, ms: median (every round)",
        key="postgres_cpu_ms_per_reservation",
        digits=4,
    )


if __name__ == "__main__":
    main()
