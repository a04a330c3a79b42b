"""Does an index of the jobs' DOIs stay bounded while the jobs turn over at a constant count?

A scratch PostgreSQL (not durable: this measures sizes, not commits). Three layouts of the same
keys, side by side: a GIN index over the DOIs themselves (the search keys' index before migration
0041), a GIN index over each DOI's bucket (`queue_doi_search_buckets`, after it), and a B-tree
side table of (DOI, job). `--window` rows of 3-40 DOIs each, nearly all new (as a thesis's sources
are), then `--turnovers` times the window replaced `--step` rows at a time: the oldest deleted,
the newest inserted, a plain VACUUM after each step (as autovacuum would run). Prints and writes
each layout's bytes at each turnover and the insert time per layout, and one search by DOI over
the buckets. The figures behind docs/scaling.md §12.1.

    .venv/bin/python -m bench.probes.gin_turnover [--window 20000] [--step 5000] [--turnovers 8] [--out FILE]
"""

from __future__ import annotations

import random
import time

import psycopg

from bench.probes.rounds import new_report, scratch_database, turnover_arguments, turnover_steps, write_report

_WORDS = "citation analysis thesis method data study review model theory network learning graph system".split()
_LAYOUTS = """
CREATE TABLE by_doi (id bigint PRIMARY KEY, dois text[] NOT NULL);
CREATE INDEX by_doi_gin ON by_doi USING gin (dois);
CREATE TABLE by_bucket (id bigint PRIMARY KEY, dois text[] NOT NULL, buckets integer[] NOT NULL);
CREATE INDEX by_bucket_gin ON by_bucket USING gin (buckets);
CREATE TABLE side (doi text COLLATE "C" NOT NULL, id bigint NOT NULL, PRIMARY KEY (doi, id));
CREATE INDEX side_id ON side (id);
"""
_INSERTS = {
    "by_doi": "INSERT INTO by_doi VALUES (%s, %s)",
    "by_bucket": "INSERT INTO by_bucket SELECT %s, d, queue_doi_search_buckets(d) FROM (SELECT %s::text[] AS d) AS q",
    "side": "INSERT INTO side SELECT DISTINCT unnest(%s::text[]), %s",
}
_INDEXES = {"by_doi": ["by_doi_gin"], "by_bucket": ["by_bucket_gin"], "side": ["side_pkey", "side_id"]}


def _new_rows(rng: random.Random, first_id: int, count: int) -> list[tuple[int, list[str]]]:
    return [
        (first_id + n, [f"10.{rng.randint(1000, 9998)}/{rng.choice(_WORDS)}.{rng.randint(1, 10**6)}" for _ in range(rng.randint(3, 40))])
        for n in range(count)
    ]


def _step(conn: psycopg.Connection, rows: list[tuple[int, list[str]]], keep_from: int, insert_seconds: dict[str, float]) -> None:
    for layout, statement in _INSERTS.items():
        started = time.perf_counter()
        with conn.cursor() as cur:
            cur.executemany(statement, [(d, i) if layout == "side" else (i, d) for i, d in rows])
        insert_seconds[layout] += time.perf_counter() - started
    for table in _INSERTS:
        conn.execute(f"DELETE FROM {table} WHERE id < %s", (keep_from,))  # noqa: S608 (the probe's own names)
        conn.execute(f"VACUUM {table}")


def _sizes(conn: psycopg.Connection) -> dict[str, float]:
    mb = {}
    for layout, indexes in _INDEXES.items():
        heap = conn.execute("SELECT pg_relation_size(%s)", (layout,)).fetchone()
        mb[f"{layout}_heap_mb"] = round(heap[0] / 2**20, 2) if heap else 0.0
        for index in indexes:
            row = conn.execute("SELECT pg_relation_size(%s)", (index,)).fetchone()
            mb[f"{index}_mb"] = round(row[0] / 2**20, 2) if row else 0.0
    return mb


def measure(window: int, step: int, turnovers: int) -> dict[str, object]:
    rng = random.Random(1)
    insert_seconds = dict.fromkeys(_INSERTS, 0.0)
    turns: list[dict[str, float]] = []
    with scratch_database("gin-turnover-", durable=False) as (db, _), psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(_LAYOUTS)
        next_id = 1
        _step(conn, _new_rows(rng, next_id, window), 0, insert_seconds)
        next_id += window
        for turnover in turnover_steps(window, step, turnovers):
            if turnover is not None:
                turns.append({"turnover": turnover, **_sizes(conn)})
                print(turns[-1], flush=True)
            _step(conn, _new_rows(rng, next_id, step), next_id + step - window, insert_seconds)
            next_id += step
        doi = conn.execute("SELECT dois[1] FROM by_bucket ORDER BY id DESC LIMIT 1").fetchone()
        assert doi is not None
        started = time.perf_counter()
        found = conn.execute(
            "SELECT count(*) FROM by_bucket WHERE buckets @> queue_doi_search_buckets(ARRAY[%s]) AND dois @> ARRAY[%s]", (doi[0], doi[0])
        ).fetchone()
        search_ms = (time.perf_counter() - started) * 1000
    return {
        "turnovers": turns,
        "insert_seconds": {k: round(v, 2) for k, v in insert_seconds.items()},
        "search_by_bucket": {"ms": round(search_ms, 2), "found": found[0] if found else 0},
    }


def main() -> None:
    args = turnover_arguments(__doc__ or "", step=5_000, out_name="gin-turnover.json")
    report = new_report(probe="gin_turnover", window=args.window, step=args.step, turnovers=args.turnovers)
    report.update(measure(args.window, args.step, args.turnovers))
    write_report(report, args.out)


if __name__ == "__main__":
    main()
