"""EXPLAIN (ANALYZE, BUFFERS) of the service's hot and sweeper statements on the history database,
and a check that each is index-driven (partial indexes over the rows in flight) rather than a
sequential scan of the history.

Each statement runs exactly as the store (`queue_service/store/statements/`) runs it (the named query
from `queue_service/store/sql/queries/`, bound parameters) inside a transaction that is rolled
back. Two details a plain EXPLAIN would miss:

- `analysis_jobs_free_slot` is a SQL function: its body is planned separately, so auto_explain
  (log_nested_statements, sent to this session as NOTICEs) captures the nested plans too;
- the service's connections prepare a statement after 5 executions (psycopg's
  prepare_threshold), after which PostgreSQL may switch to a generic plan; each statement is
  also run prepared under plan_cache_mode = force_generic_plan and that plan is checked too.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from bench.driver import FREE_ADMITS_PER_HOUR
from queue_service.model import JobInputsSearch, JobSearch
from queue_service.store.queries import queries
from queue_service.store.statements import job_search_statement

_SEQ_SCAN = re.compile(r"Seq Scan on (\w+)")
_INDEX = re.compile(r"(?:Index Only Scan|Index Scan|Bitmap Index Scan)(?: Backward)? (?:using|on) (\w+)")
_EXECUTION = re.compile(r"Execution Time: ([\d.]+) ms")
_BUFFERS = re.compile(r"Buffers: shared (?:hit=(\d+))?\s*(?:read=(\d+))?")
_HISTORY_TABLES = ("analysis_jobs", "credit_ledger")

_AUTO_EXPLAIN = [
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_buffers = on",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_level = notice",
]

# (named query, what it is for); the first seven are the brief's list.
STATEMENTS = [
    (
        "admit_job",
        "admit: INSERT deciding the status + debit + the view (one call, queue_admit_job_v2; an idle user, so the free-slot function runs)",
    ),
    ("end_job", "completion: end the running job, promote the next queued one, the views (one call, queue_end_job_viewed)"),
    ("claim_due_releases", "dispatcher: claim due PENDING jobs (FOR UPDATE SKIP LOCKED)"),
    ("users_needing_promotion", "sweeper: users with queued work and a free slot"),
    ("expired_pending_releases", "sweeper: releases past their window"),
    ("claim_due_reconciliations", "sweeper: RUNNING jobs whose completion is overdue"),
    ("list_job_views", "ListJobs: first page (10) of a user with history"),
    ("reserve_run_and_read_admit_state", "admit: the run reservation with the idempotency / queue length / balance read"),
    ("job_views_by_ids", "the view of one job (for every WatchJobs change)"),
    ("ledger_entries_of_user", "ListLedgerEntries: first page (20) of a user's audit trail"),
    (
        "mark_released",
        "release accepted: mark the jobs RUNNING, one statement for those accepted together (a queued job here: no row changes)",
    ),
    ("end_runs", "completions of several runs in one statement, each run's section as end_job's (one run here)"),
    ("search_job_views_by_source_doi", "SearchJobs by a source's DOI: first page (20) of the jobs citing it (about 10 in a million)"),
    (
        "search_job_views_by_title_words",
        "SearchJobs by title words: a thesis's whole title, as read out on the phone (the idle user's oldest job, months old)",
    ),
    ("search_job_views_by_document_uri", "SearchJobs by document uri prefix: first page (20) of the jobs under one user's folder"),
]


def search_by(**inputs: str) -> JobSearch:
    """A search across all users by what jobs judge (`JobInputsSearch`'s fields), nothing else set."""
    return JobSearch(
        user_id="", statuses=(), created_after=None, upper_time=None, upper_job_id=None, has_error=False, inputs=JobInputsSearch(**inputs)
    )


def _params(conn: psycopg.Connection, idle_user: str, busy_user: str) -> dict[str, tuple[dict[str, Any], Callable | None]]:
    running, running_run = (
        conn.execute("SELECT job_id, run_id FROM analysis_jobs WHERE user_id = %s AND status = 'running'", (busy_user,)).fetchone().values()
    )
    queued = conn.execute(
        "SELECT job_id FROM analysis_jobs WHERE user_id = %s AND status = 'queued' ORDER BY queue_seq LIMIT 1", (busy_user,)
    ).fetchone()["job_id"]

    end_running_job = {
        "job_id": running,
        "status": "succeeded",
        "from_statuses": ["pending", "running"],
        "last_error": "",
        "expected_attempts": None,
        "run_unsettled": False,
        "refund": False,
        "actor": "core:explain",
        "reason": "completion",
        "default_max_active": 1,
        "release_window_seconds": 1800.0,
        "release_lease_seconds": 15.0,
    }

    new_job = {
        "job_id": uuid.uuid4(),
        "user_id": idle_user,
        "run_id": uuid.uuid4(),
        "idempotency_key": f"explain-{uuid.uuid4()}",
        "request_digest": b"explain",
        "delta_of_job_id": None,
        "price": 1,
        "document_uri": "s3://theses/explain.pdf",
        "document_title": "Explained",
        "sources": Jsonb([{"doi": "10.1234/explain", "citation": "A study of queues"}]),
        "is_delta": False,
        "delta_held": False,
        "retry_of_job_id": None,
        "default_max_active": 1,
        "max_queued": 100,
        "max_running_deltas": 4,
        "release_window_seconds": 1800.0,
        "release_lease_seconds": 15.0,
        "reconcile_after_seconds": 900.0,
        "actor": "web:explain",
        "reason": "admit",
    }

    def reserve_the_run(c: psycopg.Connection) -> None:
        c.execute(
            queries()["reserve_run_and_read_admit_state"],
            {
                "run_id": new_job["run_id"],
                "user_id": idle_user,
                "idempotency_key": new_job["idempotency_key"],
                "delta_of_job_id": None,
                "grace_seconds": 60.0,
                "max_free_admits": FREE_ADMITS_PER_HOUR,
            },
        )

    def search(**inputs: str) -> dict[str, Any]:
        """A first SearchJobs page by one of the inputs, nothing else set, as the store binds it."""
        return job_search_statement(search_by(**inputs), limit=21)[1]

    oldest_title = conn.execute(
        "SELECT document_title FROM analysis_jobs WHERE user_id = %s ORDER BY create_time LIMIT 1", (idle_user,)
    ).fetchone()["document_title"]
    return {
        "search_job_views_by_source_doi": (search(source_doi="10.5555/p4242"), None),
        "search_job_views_by_title_words": (search(title_words=oldest_title), None),
        "search_job_views_by_document_uri": (search(document_uri_prefix=f"s3://theses/{idle_user}/"), None),
        "admit_job": (new_job, reserve_the_run),
        "end_job": (end_running_job, None),
        "claim_due_releases": ({"lease_seconds": 15.0, "batch_size": 64}, None),
        "users_needing_promotion": ({"default_max_active": 1, "batch_size": 500}, None),
        "expired_pending_releases": ({"batch_size": 500}, None),
        "claim_due_reconciliations": ({"recheck_seconds": 900.0, "cancel_recheck_seconds": 15.0, "batch_size": 500}, None),
        "list_job_views": ({"user_id": idle_user, "after_job_id": None, "before_seq": None, "statuses": [], "limit": 11}, None),
        "reserve_run_and_read_admit_state": (
            {
                "run_id": uuid.uuid4(),
                "user_id": idle_user,
                "idempotency_key": "explain-none",
                "delta_of_job_id": None,
                "grace_seconds": 60.0,
                "max_free_admits": FREE_ADMITS_PER_HOUR,
            },
            None,
        ),
        "job_views_by_ids": ({"job_ids": [queued]}, None),
        "ledger_entries_of_user": ({"user_id": idle_user, "job_id": None, "before_entry_id": None, "limit": 21}, None),
        "mark_released": ({"job_ids": [queued], "attempts": [1], "reconcile_after_seconds": 900.0}, None),
        "end_runs": (
            {
                "run_ids": [running_run],
                "statuses": ["succeeded"],
                "last_errors": [""],
                "refunds": [False],
                "actors": ["core:explain"],
                "reasons": ["completion"],
                "default_max_active": 1,
                "release_window_seconds": 1800.0,
                "release_lease_seconds": 15.0,
            },
            None,
        ),
    }


def _nested(notices: list[str], top_level_sql: str) -> list[str]:
    """auto_explain's plans of the statements run inside this one (function bodies)."""
    head = top_level_sql.strip()[:60]
    return [n for n in notices if "Query Text: EXPLAIN" not in n and head not in n]


def _run(
    conn: psycopg.Connection, sql: str, values: dict[str, Any], prelude: Callable | None, notices: list[str], *, prepare: bool = False
) -> list[dict]:
    """Runs one statement (after its prelude) in a transaction that is rolled back; `notices`
    then holds what auto_explain reported for this statement alone."""
    with conn.transaction(force_rollback=True):
        if prelude:
            prelude(conn)
        notices.clear()
        cursor = conn.execute(sql, values, prepare=prepare)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []


_QUERY_TEXT = re.compile(r"Query Text:(.*?)(?:Query Parameters:|\n[A-Z][a-zA-Z ]+ {2}\(cost)", re.DOTALL)


def _dedupe(plans: list[str]) -> list[str]:
    """One plan per distinct statement text (a function runs once per row), with its run count."""
    first: dict[str, str] = {}
    counts: dict[str, int] = {}
    for text in plans:
        match = _QUERY_TEXT.search(text)
        key = match.group(1).strip() if match else text
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, text)
    return [f"[this statement ran {counts[key]} time(s); first run shown]\n{text}" for key, text in first.items()]


def _nested_runs(nested: list[str]) -> int:
    return sum(int(m.group(1)) for m in (re.match(r"\[this statement ran (\d+)", n) for n in nested) if m)


def verdict(plan_text: str, partial_indexes: set[str]) -> dict[str, Any]:
    seq = sorted(set(_SEQ_SCAN.findall(plan_text)))
    indexes = sorted(set(_INDEX.findall(plan_text)))
    return {
        "index_driven": not any(table in _HISTORY_TABLES for table in seq),
        "seq_scans": seq,
        "indexes": indexes,
        "partial_indexes": [i for i in indexes if i in partial_indexes],
    }


def explain_all(dsn: str, out_path: Path, *, idle_user: str, busy_user: str, header: str) -> dict[str, Any]:
    notices: list[str] = []
    sections, results = [header], {}
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        for statement in _AUTO_EXPLAIN:
            conn.execute(statement)
        partial = {
            row["indexname"]
            for row in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'analysis_jobs' AND indexdef LIKE '%% WHERE %%'")
        }
        params = _params(conn, idle_user, busy_user)
        for name, purpose in STATEMENTS:
            sql = queries()[name]
            values, prelude = params[name]
            # 1) the plain EXPLAIN (ANALYZE, BUFFERS), auto_explain off so its timing is clean,
            #    run twice and the second kept (warm caches, as on a serving replica);
            conn.execute("SET auto_explain.log_min_duration = -1")
            for _ in range(2):
                plan = "\n".join(r["QUERY PLAN"] for r in _run(conn, "EXPLAIN (ANALYZE, BUFFERS) " + sql, values, prelude, notices))
            conn.execute("SET auto_explain.log_min_duration = 0")
            # 2) the same with auto_explain on, for the plans of the nested statements;
            _run(conn, "EXPLAIN (ANALYZE, BUFFERS) " + sql, values, prelude, notices)
            nested = _dedupe(_nested(notices, sql))
            # 3) prepared, forced generic: the plan a long-lived service connection may end up with.
            conn.execute("SET plan_cache_mode = force_generic_plan")
            _run(conn, sql, values, prelude, notices, prepare=True)
            conn.execute("RESET plan_cache_mode")
            generic = "\n\n".join(_dedupe(notices))

            custom_verdict = verdict(plan + "\n" + "\n".join(nested), partial)
            generic_verdict = verdict(generic, partial)
            execution = _EXECUTION.search(plan)
            buffers = _BUFFERS.search(plan)
            results[name] = {
                "purpose": purpose,
                **custom_verdict,
                "generic_plan_index_driven": generic_verdict["index_driven"],
                "generic_plan_seq_scans": generic_verdict["seq_scans"],
                "execution_ms": float(execution.group(1)) if execution else None,
                "top_buffers_hit": int(buffers.group(1) or 0) if buffers else None,
                "top_buffers_read": int(buffers.group(2) or 0) if buffers else None,
                "nested_statement_runs": _nested_runs(nested),
            }
            sections.append(_section(name, purpose, plan, nested, generic, results[name]))
    sections.insert(1, _summary(results))
    out_path.write_text("\n".join(sections))
    return results


def _summary(results: dict[str, Any]) -> str:
    lines = ["SUMMARY (index_driven: no sequential scan of analysis_jobs or credit_ledger)", ""]
    lines.append(f"{'statement':28} {'custom':8} {'generic':8} {'exec ms':>8}  partial indexes used / seq scans")
    for name, r in results.items():
        custom = "index" if r["index_driven"] else "SEQ"
        generic = "index" if r["generic_plan_index_driven"] else "SEQ"
        seq = f"  seq: {','.join(r['seq_scans'])}" if r["seq_scans"] else ""
        lines.append(f"{name:28} {custom:8} {generic:8} {r['execution_ms'] or 0:8.3f}  {', '.join(r['partial_indexes']) or '-'}{seq}")
    return "\n".join(lines) + "\n"


def _section(name: str, purpose: str, plan: str, nested: list[str], generic: str, result: dict[str, Any]) -> str:
    bar = "=" * 100
    parts = [bar, f"{name}: {purpose}", f"verdict: {result}", bar, "", "-- EXPLAIN (ANALYZE, BUFFERS), custom plan --", plan]
    for text in nested:
        parts += ["", "-- nested statement (auto_explain) --", text]
    parts += ["", "-- prepared, plan_cache_mode = force_generic_plan (auto_explain, nested statements included) --", generic, ""]
    return "\n".join(parts)
