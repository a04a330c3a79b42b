"""Where PostgreSQL's time goes, statement by statement (`--statement-stats`).

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

SERVER_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.max": "5000",
    "compute_query_id": "on",
}

_TOP = 15


def install(dsn: str) -> None:
    """The view lives in the database it is created in and reports every database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def per_operation(dsn: str, database: str, ops: int) -> list[dict[str, Any]]:
    """The statements of `database` since the last reset, most execution time first, each per
    operation of the measured run (an admit, a completed job)."""
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
            (database, _TOP),
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
