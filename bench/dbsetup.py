"""Direct SQL set-up of the bench's data (credits, history, in-flight rows) and the polls the
scenarios wait on. Rows respect every constraint of `0001_queue_and_credits.sql`."""

from __future__ import annotations

import time
import uuid

import psycopg

from queue_service.config import SETTINGS


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True)


def grant_credits(dsn: str, user_prefix: str, users: int, amount: int) -> None:
    """A grant (ledger entry + balance) of `amount` for users `<prefix>0 .. <prefix>{users-1}`."""
    key = f"bench-grant-{uuid.uuid4().hex}"
    with connect(dsn) as conn:
        conn.execute(
            """
            WITH u AS (SELECT %(prefix)s || g AS user_id FROM generate_series(0, %(users)s - 1) AS g),
            entries AS (
                INSERT INTO credit_ledger (user_id, kind, amount, idempotency_key)
                SELECT user_id, 'grant', %(amount)s, %(key)s FROM u
            )
            INSERT INTO credit_accounts AS c (user_id, balance)
            SELECT user_id, %(amount)s FROM u
            ON CONFLICT (user_id) DO UPDATE SET balance = c.balance + EXCLUDED.balance
            """,
            {"prefix": user_prefix, "users": users, "amount": amount, "key": key},
        )


# The history's titles pair two of these words ("Queues and citations: thesis 7"): any two, in either
# order, name 1 job in 800. Each job cites 3 DOIs, kept as the job search keeps them (its sources themselves
# pruned long ago), and their titles' words, in `analysis_job_search_keys` as the trigger of
# migration 0029 writes them (it is off for the load): `10.5555/p<n>` (about 10 jobs of a million cite each), `10.5555/c<n>` (1 in 1000).
HISTORY_TITLE_WORDS = [
    *("queues citations fairness graphs retrieval provenance plagiarism bibliometrics scheduling networks").split(),
    *("semantics ontologies archives metadata libraries repositories peer review authorship impact").split(),
    *("indexing ranking clustering embeddings transformers corpora annotation evaluation reproducibility").split(),
    *("licensing openness preprints journals conferences funding mobility collaboration gender").split(),
    *("citation-context retractions").split(),
]
assert len(HISTORY_TITLE_WORDS) == 40


def _history_span_seconds() -> float:
    """How far back the loaded history goes: within the service's default job retention, as a
    store in service is (its pruner deletes what ends past it). A history older than that is a
    backlog the pruner deletes during the run, 10 000 jobs a pass: with 180 days against 30, five
    sixths of it went within minutes, and the autovacuum of the deletes landed in the scenarios
    after it (bench/results/history/2026-12-03-idle-and-completion-notebook.md)."""
    return float(SETTINGS["job_retention_seconds"].default) * 0.95


def load_history(
    dsn: str,
    *,
    jobs: int,
    users: int,
    user_prefix: str = "hist-u",
    span_seconds: float | None = None,
    ended_after_seconds: float = 360.0,
) -> float:
    """`jobs` finished jobs spread over `users` users and the time the job retention keeps
    (`_history_span_seconds`, or the last `span_seconds`), each charged once and ended
    `ended_after_seconds` after its admit, then VACUUM ANALYZE and a CHECKPOINT (what autovacuum
    and time would have done in production). Triggers are off for the load
    (session_replication_role = replica): history must not flood the change channel. Returns the
    seconds it took."""
    started = time.perf_counter()
    span = _history_span_seconds() if span_seconds is None else span_seconds
    with connect(dsn) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                """
                WITH history AS (
                INSERT INTO analysis_jobs (
                    job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot,
                    delta_of_job_id, price, release_attempts, last_error,
                    create_time, promote_time, start_time, end_time,
                    document_uri, document_title, source_count)
                SELECT gen_random_uuid(), %(prefix)s || (g %% %(users)s), gen_random_uuid(), 'history-' || g,
                       sha256(g::text::bytea),
                       CASE WHEN g %% 25 = 0 THEN 'failed' WHEN g %% 40 = 1 THEN 'canceled' ELSE 'succeeded' END,
                       nextval('analysis_jobs_queue_seq'), NULL, NULL, 1, 1,
                       CASE WHEN g %% 25 = 0 THEN 'the core reported a failure' ELSE '' END,
                       t.created, t.created + make_interval(secs => %(started_after)s),
                       t.created + make_interval(secs => %(started_after)s), t.created + make_interval(secs => %(ended_after)s),
                       's3://theses/' || %(prefix)s || (g %% %(users)s) || '/' || g || '.pdf',
                       d.title, 3
                  FROM generate_series(0, %(jobs)s - 1) AS g,
                       (SELECT %(title_words)s::text[] AS words) AS w,
                       LATERAL (SELECT initcap(w.words[1 + g %% 40]) || ' and ' || w.words[1 + (g / 40) %% 40] || ': thesis ' || g AS title) AS d,
                       LATERAL (SELECT now() - make_interval(secs => %(span)s) + (g * make_interval(secs => %(span)s)) / %(jobs)s
                                    AS created) AS t
                 ORDER BY g
                 RETURNING job_id, document_uri, document_title, substr(idempotency_key, 9)::bigint AS g)
                INSERT INTO analysis_job_search_keys (job_id, document_uri, source_dois, source_doi_buckets, title_words)
                SELECT job_id, document_uri, d.dois, queue_doi_search_buckets(d.dois), to_tsvector('simple', document_title)
                  FROM history,
                       LATERAL (SELECT ARRAY['10.5555/p' || (g %% 200000), '10.5555/p' || ((g * 7 + 3) %% 200000),
                                             '10.5555/c' || (g %% 1000)] AS dois) AS d
                """,
                {
                    "prefix": user_prefix,
                    "users": users,
                    "jobs": jobs,
                    "title_words": HISTORY_TITLE_WORDS,
                    "span": span,
                    "ended_after": ended_after_seconds,
                    "started_after": min(60.0, ended_after_seconds / 2),
                },
            )
            conn.execute(
                """
                INSERT INTO credit_ledger (user_id, kind, amount, job_id, create_time)
                SELECT user_id, 'charge', -price, job_id, create_time FROM analysis_jobs WHERE idempotency_key LIKE 'history-%%'
                """
            )
            conn.execute(
                """
                INSERT INTO credit_ledger (user_id, kind, amount, job_id, create_time)
                SELECT user_id, 'refund', price, job_id, end_time FROM analysis_jobs
                 WHERE idempotency_key LIKE 'history-%%' AND status IN ('failed', 'canceled')
                """
            )
            conn.execute(
                """
                INSERT INTO credit_accounts AS c (user_id, balance)
                SELECT %(prefix)s || g, 5 FROM generate_series(0, %(users)s - 1) AS g
                ON CONFLICT (user_id) DO NOTHING
                """,
                {"prefix": user_prefix, "users": users},
            )
        conn.execute("VACUUM ANALYZE analysis_jobs")
        conn.execute("VACUUM ANALYZE credit_ledger")
        conn.execute("VACUUM ANALYZE analysis_job_search_keys")
        conn.execute("VACUUM ANALYZE credit_accounts")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def add_in_flight(dsn: str, *, users: int, queued_per_user: int, user_prefix: str) -> int:
    """Per user: one RUNNING job holding slot 1 (reconciliation not due) and `queued_per_user`
    QUEUED jobs behind it, as admitted jobs would be. Returns the number of jobs in flight."""
    with connect(dsn) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                """
                INSERT INTO analysis_jobs (
                    job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot, price,
                    create_time, promote_time, start_time, next_reconcile_at)
                SELECT gen_random_uuid(), %(prefix)s || u, gen_random_uuid(), 'inflight-' || u || '-' || k,
                       sha256((u || '-' || k)::bytea),
                       CASE WHEN k = 0 THEN 'running' ELSE 'queued' END,
                       nextval('analysis_jobs_queue_seq'),
                       CASE WHEN k = 0 THEN 1 END, 1,
                       clock_timestamp(),
                       CASE WHEN k = 0 THEN clock_timestamp() END,
                       CASE WHEN k = 0 THEN clock_timestamp() END,
                       CASE WHEN k = 0 THEN clock_timestamp() + interval '1 day' END
                  FROM generate_series(0, %(users)s - 1) AS u, generate_series(0, %(queued)s) AS k
                 ORDER BY u, k
                """,
                {"prefix": user_prefix, "users": users, "queued": queued_per_user},
            )
        conn.execute("ANALYZE analysis_jobs")
    return users * (queued_per_user + 1)


def finish_in_flight(dsn: str) -> int:
    """Ends every job still in flight (so the next scenario starts from a known state)."""
    with connect(dsn) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            cur = conn.execute(
                "UPDATE analysis_jobs SET status = 'canceled', slot = NULL, end_time = clock_timestamp(),"
                " next_release_at = NULL, next_reconcile_at = NULL WHERE status IN ('queued', 'pending', 'running')"
            )
            return cur.rowcount


def _count_by_status(conn: psycopg.Connection, user_prefix: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT status, count(*) FROM analysis_jobs WHERE user_id LIKE %s GROUP BY status", (user_prefix + "%",), prepare=True
    ).fetchall()
    return dict(rows)


def wait_for(dsn: str, user_prefix: str, done, timeout: float, poll: float = 0.05) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Polls the status counts of the users with this prefix until `done(counts)` or timeout.

    One connection for all the polls, its statement prepared: the scenarios meter PostgreSQL's
    CPU while this runs, and a new connection per poll (a backend started, authenticated and
    warmed each time) once cost 0.6 ms of PostgreSQL CPU per job of the promotion burst."""
    deadline = time.monotonic() + timeout
    with connect(dsn) as conn:
        while True:
            counts = _count_by_status(conn, user_prefix)
            if done(counts) or time.monotonic() > deadline:
                return counts
            time.sleep(poll)


def vacuum_analyze(dsn: str) -> None:
    """What autovacuum does for a database in service: its planner statistics and each index's
    size. A database made a moment ago has none, and the planner then tells apart neither the
    small partial indexes from the large ones nor an index from a sequential scan."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) analysis_jobs")


def wal_position(dsn: str) -> str:
    """The server's current WAL write position (an LSN), for `wal_bytes_since`."""
    with connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    return str(row[0]) if row else "0/0"


def wal_bytes_since(dsn: str, position: str) -> int:
    """WAL bytes the whole server wrote since `position` (from `wal_position`)."""
    with connect(dsn) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint", (position,)).fetchone()
    return int(row[0]) if row else 0


def table_sizes(dsn: str) -> dict[str, int]:
    with connect(dsn) as conn:
        jobs = conn.execute("SELECT count(*) FROM analysis_jobs").fetchone()[0]
        users = conn.execute("SELECT count(DISTINCT user_id) FROM analysis_jobs").fetchone()[0]
        in_flight, busy_users = conn.execute(
            "SELECT count(*), count(DISTINCT user_id) FROM analysis_jobs WHERE status IN ('queued','pending','running')"
        ).fetchone()
    return {"jobs": jobs, "users": users, "in_flight": in_flight, "idle_users": users - busy_users}


def add_watched_user(dsn: str, user_id: str) -> str:
    """A user with one RUNNING job (so every WatchJobs stream opens with a snapshot message) and
    one finished job whose status the watch scenario flips. Returns the finished job's id."""
    with connect(dsn) as conn:
        conn.execute(
            """
            INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot, price,
                                       promote_time, start_time, next_reconcile_at)
            VALUES (gen_random_uuid(), %(user)s, gen_random_uuid(), 'watch-running', '\\x00', 'running',
                    nextval('analysis_jobs_queue_seq'), 1, 1, now(), now(), now() + interval '1 day')
            """,
            {"user": user_id},
        )
        row = conn.execute(
            """
            INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price,
                                       promote_time, start_time, end_time)
            VALUES (gen_random_uuid(), %(user)s, gen_random_uuid(), 'watch-finished', '\\x00', 'succeeded',
                    nextval('analysis_jobs_queue_seq'), 1, now(), now(), now())
            RETURNING job_id
            """,
            {"user": user_id},
        ).fetchone()
    return str(row[0])
