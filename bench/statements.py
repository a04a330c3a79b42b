"""Where PostgreSQL's time goes (`--statement-stats`): statement by statement, and CPU by process.

pg_stat_statements with `track = all` counts the statements inside our PL/pgSQL functions too,
so a locked section shows both as one call of its function (top level) and as the statements the
function ran (nested, `toplevel = false`). Their times overlap: add up either level, not both.

The figures are execution time, not CPU time; on this CPU-bound box the two are close, and the
ranking is what matters. The extension costs a few per cent, so the target figures come from runs
without it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from bench.measure import CLOCK_TICKS, own_cpu_ticks, process_tree, reaped_children_cpu_ticks

SERVER_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    # Planning is part of the cost: a statement re-planned on every call shows it here.
    "pg_stat_statements.track_planning": "on",
    "pg_stat_statements.max": "5000",
    "compute_query_id": "on",
}

TOP = 15


def install(dsn: str) -> None:
    """The view lives in the database it is created in and reports every database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def per_operation(dsn: str, database: str, ops: int, *, top: int = TOP) -> list[dict[str, Any]]:
    """The `top` statements of `database` since the last reset, most execution time first, each
    per operation of the measured run (an admit, a completed job)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT s.toplevel, s.calls, s.total_exec_time, s.total_plan_time, s.plans, s.rows,
                   s.shared_blks_hit + s.shared_blks_read, s.wal_records,
                   regexp_replace(s.query, '\\s+', ' ', 'g')
              FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = %s
             ORDER BY s.total_exec_time + s.total_plan_time DESC
             LIMIT %s
            """,
            (database, top),
        ).fetchall()
    return [
        {
            "level": "top" if toplevel else "nested",
            "calls_per_op": round(calls / ops, 3),
            "exec_ms_per_op": round(exec_ms / ops, 4),
            "plan_ms_per_op": round(plan_ms / ops, 4),
            "mean_exec_ms": round(exec_ms / calls, 4) if calls else None,
            "plans_per_call": round(plans / calls, 3) if calls else None,
            "rows_per_call": round(rows / calls, 2) if calls else None,
            "buffers_per_call": round(buffers / calls, 1) if calls else None,
            "wal_records_per_call": round(wal / calls, 2) if calls else None,
            "query": query[:160],
        }
        for toplevel, calls, exec_ms, plan_ms, plans, rows, buffers, wal, query in rows
    ]


def table(entries: list[dict[str, Any]]) -> list[str]:
    lines = [f"      {'level':6} {'calls/op':>8} {'exec ms/op':>10} {'plan ms/op':>10} {'mean ms':>8} {'bufs':>6} {'wal':>5}  query"]
    for e in entries:
        lines.append(
            f"      {e['level']:6} {e['calls_per_op']:>8} {e['exec_ms_per_op']:>10} {e['plan_ms_per_op']:>10} "
            f"{e['mean_exec_ms'] if e['mean_exec_ms'] is not None else '-':>8} "
            f"{e['buffers_per_call'] if e['buffers_per_call'] is not None else '-':>6} "
            f"{e['wal_records_per_call'] if e['wal_records_per_call'] is not None else '-':>5}  {e['query'][:90]}"
        )
    return lines


# -- CPU by process -----------------------------------------------------------------------------
#
# Statement execution is only part of PostgreSQL's CPU: parsing and binding, the protocol, the
# commit and its WAL, the NOTIFY delivery to each LISTEN connection, autovacuum and the
# checkpointer are not in pg_stat_statements. So PostgreSQL's processes are metered one by one,
# each labelled by pg_stat_activity.


def _labels(dsn: str, database: str) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid, backend_type, datname, query FROM pg_stat_activity WHERE pid <> pg_backend_pid()").fetchall()
    labels = {}
    for pid, backend_type, datname, query in rows:
        if backend_type != "client backend":
            labels[pid] = backend_type
        elif (query or "").lstrip().upper().startswith("LISTEN"):
            labels[pid] = "client: LISTEN connection"
        elif datname == database:
            labels[pid] = "client: service pool"
        else:
            labels[pid] = "client: other"
    return labels


class PostgresCpuByProcess:
    """CPU seconds of each kind of PostgreSQL process between `start` and `stop`. Processes that
    ended in between (closed connections, autovacuum workers) are counted as "exited" (their CPU
    lands in the postmaster's children's time when it reaps them)."""

    def __init__(self, dsn: str, database: str, postmaster_pid: int) -> None:
        self._dsn, self._database, self._postmaster = dsn, database, postmaster_pid
        self._before: dict[int, int] = {}
        self._labels: dict[int, str] = {}
        self._reaped_before = 0

    def _sample(self) -> dict[int, int]:
        return {pid: own_cpu_ticks(pid) for pid in process_tree(self._postmaster)}

    def start(self) -> PostgresCpuByProcess:
        self._labels = _labels(self._dsn, self._database)
        self._reaped_before = reaped_children_cpu_ticks(self._postmaster)
        self._before = self._sample()
        return self

    def stop(self) -> dict[str, float]:
        after = self._sample()
        reaped = reaped_children_cpu_ticks(self._postmaster) - self._reaped_before
        labels = {**self._labels, **_labels(self._dsn, self._database)}
        labels[self._postmaster] = "postmaster"
        seconds: dict[str, float] = {}
        for pid, ticks in after.items():
            label = labels.get(pid, "other")
            seconds[label] = seconds.get(label, 0.0) + (ticks - self._before.get(pid, 0)) / CLOCK_TICKS
        seconds["exited"] = reaped / CLOCK_TICKS
        return {label: round(value, 3) for label, value in sorted(seconds.items(), key=lambda item: -item[1]) if value > 0}
