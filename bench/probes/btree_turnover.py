"""Does a B-tree index keyed by a rising time stay bounded while the jobs turn over at a constant count,
declared newest first (DESC) and ascending?

A scratch PostgreSQL (not durable: this measures sizes, not commits). Two tables of the same rows,
each with the time-keyed indexes the jobs table had before migration 0042, one table's DESC and the
other's ascending: (create_time, id) over every row and (end_time) over the ended ones. The rows
live as a job's do: admitted (rising create_time), started a step later and ended two steps
later (each a non-HOT update, as the job's are, since an indexed column changes), deleted once
`--window` newer ones exist. `--turnovers` times the window is replaced `--step` rows at a time,
a plain VACUUM after each step (as autovacuum would run). Prints and writes each index's bytes and
leaf density (`pgstatindex`) at each turnover. The figures behind docs/scaling.md §12.3.

    .venv/bin/python -m bench.probes.btree_turnover [--window 20000] [--step 2000] [--turnovers 8] [--out FILE]
"""

from __future__ import annotations

import psycopg

from bench.probes.rounds import new_report, scratch_database, turnover_arguments, turnover_steps, write_report

_DIRECTIONS = {"newest_first": "DESC", "ascending": "ASC"}
_PADDING = "x" * 300  # about a job row's width with its sources pruned


def _layouts() -> str:
    return "CREATE EXTENSION pgstattuple;\n" + "".join(
        f"""
CREATE TABLE jobs_{name} (id bigint PRIMARY KEY, create_time timestamptz NOT NULL, end_time timestamptz,
                          status text NOT NULL, padding text NOT NULL);
CREATE INDEX jobs_{name}_admitted ON jobs_{name} (create_time {order}, id {order});
CREATE INDEX jobs_{name}_ended ON jobs_{name} (end_time {order}) WHERE end_time IS NOT NULL;
"""
        for name, order in _DIRECTIONS.items()
    )


def _step(conn: psycopg.Connection, first_id: int, step: int, window: int) -> None:
    """One step of the jobs' life: `step` admitted, the previous step's started, the one before
    ended, the ones past the window deleted; then VACUUM. Times are ids in seconds, so rising."""
    last_id = first_id + step - 1
    for name in _DIRECTIONS:
        table = f"jobs_{name}"
        conn.execute(
            f"INSERT INTO {table} SELECT n, 'epoch'::timestamptz + n * interval '1 second', NULL, 'queued', %s"  # noqa: S608
            " FROM generate_series(%s::bigint, %s::bigint) AS n",
            (_PADDING, first_id, last_id),
        )
        conn.execute(f"UPDATE {table} SET status = 'running' WHERE id BETWEEN %s AND %s", (first_id - step, first_id - 1))  # noqa: S608
        conn.execute(
            f"UPDATE {table} SET status = 'succeeded', end_time = 'epoch'::timestamptz + (id + 2 * %s) * interval '1 second'"  # noqa: S608
            " WHERE id BETWEEN %s AND %s",
            (step, first_id - 2 * step, first_id - step - 1),
        )
        conn.execute(f"DELETE FROM {table} WHERE id <= %s", (last_id - window,))  # noqa: S608
        conn.execute(f"VACUUM {table}")


def _sizes(conn: psycopg.Connection) -> dict[str, float]:
    figures: dict[str, float] = {}
    for name in _DIRECTIONS:
        for index in (f"jobs_{name}_admitted", f"jobs_{name}_ended"):
            row = conn.execute("SELECT index_size, avg_leaf_density FROM pgstatindex(%s)", (index,)).fetchone()
            assert row is not None
            figures[f"{index}_mb"] = round(row[0] / 2**20, 2)
            figures[f"{index}_leaf_density_pct"] = round(float(row[1]), 1)
    return figures


def measure(window: int, step: int, turnovers: int) -> list[dict[str, float]]:
    turns: list[dict[str, float]] = []
    with scratch_database("btree-turnover-", durable=False) as (db, _), psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(_layouts())
        next_id = 1
        for turnover in turnover_steps(window, step, turnovers):
            if turnover:  # not before the first step: the tables are empty
                turns.append({"turnover": turnover, **_sizes(conn)})
                print(turns[-1], flush=True)
            _step(conn, next_id, step, window)
            next_id += step
    return turns


def main() -> None:
    args = turnover_arguments(__doc__ or "", step=2_000, out_name="btree-turnover.json")
    report = new_report(probe="btree_turnover", window=args.window, step=args.step, turnovers=args.turnovers)
    report["turnovers"] = measure(args.window, args.step, args.turnovers)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
