"""A locked section is one statement: the lock first, then the section's call, which must see
what the previous holder of the lock committed and run its statements on generic plans
(PostgreSQL's default re-planned the job view read on every admit: nine times its execution)."""

from __future__ import annotations

import asyncio
import re
import uuid

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from queue_service import deadline
from queue_service.model import JobInputsSearch, JobSearch, PromotionLimits, RunReportToApply, Transition
from queue_service.store import locks
from queue_service.store.pool import Timeouts, create_pool
from queue_service.store.queries import queries
from queue_service.store.queries import statement as _statement
from queue_service.store.sections import _end_runs_params
from queue_service.store.statements import job_search_statement
from tests.harness import S, insert_jobs, new_user

# A section the way migration 0009's functions are written: VOLATILE PL/pgSQL, rows with a kind.
_PROBE_FUNCTION = """
CREATE OR REPLACE FUNCTION test_locked_section_probe(p_user_id text)
RETURNS TABLE (row_kind text, balance bigint, plan_cache_mode text, lock_timeout text)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT 'probe'::text,
                        (SELECT c.balance::bigint FROM credit_accounts c WHERE c.user_id = p_user_id),
                        current_setting('plan_cache_mode'), current_setting('lock_timeout');
END
$$"""
_PROBE = sql.SQL("SELECT * FROM test_locked_section_probe(%(probe_user_id)s)")


async def _probe(pool, user: str) -> dict:
    rows = await locks.locked_section(pool, user, _PROBE, {"probe_user_id": user})
    assert len(rows) == 1, rows
    return rows[0]


async def _waiting_for_a_lock(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as observer:
        for _ in range(500):
            cursor = await observer.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("the section never waited for the user's lock")


async def test_a_locked_section_runs_after_its_lock_and_sees_what_the_previous_holder_committed(database_url: str) -> None:
    user = new_user()
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(_PROBE_FUNCTION)
        admin.execute("INSERT INTO credit_accounts (user_id, balance) VALUES (%s, 1)", (user,))
    pool = create_pool(database_url, timeouts=Timeouts(5000, 10000), min_size=1, max_size=2, timeout=5)
    await pool.open(wait=True)
    try:
        async with await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row) as holder:
            await holder.execute(locks._TAKE_USER_QUEUE_LOCK, {"user_id": user})
            section = asyncio.create_task(_probe(pool, user))
            # Wait until its statement is seen waiting for the lock, then hold it 0.3 s more: it
            # waited at least that long, however late a loaded machine sent the statement.
            await _waiting_for_a_lock(database_url)
            await asyncio.sleep(0.3)
            assert not section.done()  # it waits for the lock
            await holder.execute("UPDATE credit_accounts SET balance = 7 WHERE user_id = %s", (user,))
            await holder.commit()
            probed = await asyncio.wait_for(section, 5)
        # Taken after the lock, not when the statement started: it sees the holder's commit.
        assert probed["balance"] == 7
        assert probed["waited_seconds"] >= 0.25
        # Set for the statement only, before the call: generic plans inside, the session's lock timeout.
        assert probed["plan_cache_mode"] == "force_generic_plan"
        assert probed["lock_timeout"] == "5s"
        async with pool.connection() as conn:
            after = await (await conn.execute("SELECT current_setting('plan_cache_mode') AS mode")).fetchone()
        assert after["mode"] == "auto"
    finally:
        await pool.close()


async def test_a_callers_deadline_shortens_the_lock_timeout_inside_the_section(database_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A fresh loop-lag monitor: the process's own keeps what earlier tests' servers saw (on a
    # starved core, lags of some 0.3 s, which rightly triple into the answer's reserve), and this
    # test is about the deadline's share, not the loop's lateness.
    monkeypatch.setattr(deadline, "loop_lag", deadline.LoopLag())
    user = new_user()
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(_PROBE_FUNCTION)
    pool = create_pool(database_url, timeouts=Timeouts(5000, 10000), min_size=1, max_size=1, timeout=5)
    await pool.open(wait=True)
    try:
        with deadline.call_budget(2.0):
            probed = await _probe(pool, user)
        shortened_ms = int(probed["lock_timeout"].removesuffix("ms"))
        assert 1000 <= shortened_ms < 2000, probed  # 90% of what is left, below the session's 5 s
    finally:
        await pool.close()


async def test_a_completion_finds_its_runs_user_and_waits_for_that_users_lock(service, database_url: str) -> None:  # type: ignore[no-untyped-def]
    """CompleteRun knows only the run: its one statement reads the run's user, locks that user's
    queue and ends the job under it, so it waits for whoever holds the lock and then sees what
    they committed (here: the queued job canceled, so nothing is promoted)."""
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 2)
    running = await stubs.admit(user)
    queued = await stubs.admit(user)
    await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
    async with await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row) as holder:
        await holder.execute(locks._TAKE_USER_QUEUE_LOCK, {"user_id": user})
        completion = asyncio.create_task(stubs.complete(running.run_id))
        await asyncio.sleep(0.3)
        assert not completion.done()  # it waits for the user's lock
        await holder.execute(
            "UPDATE analysis_jobs SET status = 'canceled', end_time = clock_timestamp() WHERE job_id = %s", (queued.job_id,)
        )
        await holder.commit()
        ended = await asyncio.wait_for(completion, 10)
    assert ended.status == S.JOB_STATUS_SUCCEEDED
    # Read after the holder's commit: the canceled job was not promoted into the freed slot.
    assert (await stubs.job(queued.job_id)).status == S.JOB_STATUS_CANCELED


async def test_batched_completions_and_release_marks_keep_their_generic_plans(database_url: str) -> None:
    """The statements that end a batch of runs and mark a burst of releases run once per batch,
    most batches of one at a steady pace. Prepared (the pool's connections prepare a statement
    after 5 executions), PostgreSQL settles on their generic plans instead of planning every call
    afresh: the arrays are read through subqueries, so a custom plan of a batch of one is not
    cheaper than the generic plan. Given the arrays as constants, every call was planned anew."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        insert_jobs(admin, [new_user() for _ in range(250)], status="succeeded")
    pool = create_pool(database_url, timeouts=Timeouts(5000, 10000), min_size=1, max_size=1, timeout=5)
    await pool.open(wait=True)
    try:
        limits = PromotionLimits(default_max_active=1, release_window_seconds=1800, release_lease_seconds=30)
        for batch in (1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 3, 1) * 2:
            reports = [
                RunReportToApply(
                    run_id=uuid.uuid4(), transition=Transition.completed(succeeded=True, refund=False, message=""), actor="core"
                )
                for _ in range(batch)
            ]
            rows = await locks.locked_sections_of_runs(
                pool, [r.run_id for r in reports], _statement("end_runs"), _end_runs_params(reports, limits)
            )
            assert {row["row_kind"] for row in rows} == {"unknown"}, rows
            async with pool.connection() as conn:
                releases = {"job_ids": [uuid.uuid4() for _ in range(batch)], "attempts": [1] * batch, "reconcile_after_seconds": 30.0}
                await conn.execute(_statement("mark_released"), releases)
        async with pool.connection() as conn:
            cursor = await conn.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
            plans = {
                ("end_runs" if "queue_end_run_viewed" in row["statement"] else "mark_released"): row for row in await cursor.fetchall()
            }
    finally:
        await pool.close()
    assert set(plans) == {"end_runs", "mark_released"}, plans
    for name, row in plans.items():
        # 24 calls: 5 unprepared, then PostgreSQL's 5 custom plans before it compares, then generic.
        assert (row["custom_plans"], row["generic_plans"]) == (5, 14), (name, row["statement"])


async def test_the_admits_reservation_keeps_its_generic_plan_after_its_tables_grow_and_are_analyzed(database_url: str) -> None:
    """The run's reservation with the admit's state is one prepared statement per connection,
    prepared while the tables are small and kept while they grow. Once they had grown and been
    analyzed, PostgreSQL planned it afresh on every call (its custom plans kept coming out cheaper
    on paper than the rebuilt generic plan): 1.4 ms of planning on every admit. The state is now
    read in `queue_admit_state`, on its generic plan, and the statement keeps its generic plan."""
    user = new_user()
    with psycopg.connect(database_url, autocommit=True) as admin:
        insert_jobs(admin, [user], status="succeeded", key="taken")
        admin.execute("ANALYZE analysis_jobs")
    pool = create_pool(database_url, timeouts=Timeouts(5000, 10000), min_size=1, max_size=1, timeout=5)
    await pool.open(wait=True)
    try:

        async def reserve(calls: int) -> None:
            async with pool.connection() as conn:
                for _ in range(calls):
                    # The key has a job: the statement reserves nothing, it only reads.
                    params = {
                        "run_id": uuid.uuid4(),
                        "user_id": user,
                        "idempotency_key": "taken",
                        "delta_of_job_id": None,
                        "grace_seconds": 30.0,
                        "max_free_admits": 20,
                    }
                    cursor = await conn.execute(_statement("reserve_run_and_read_admit_state"), params)
                    row = await cursor.fetchone()
                    assert row is not None and row["reserved"] is False and row["existing_job_id"] is not None, row

        async def plans() -> dict:
            async with pool.connection() as conn:
                cursor = await conn.execute(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE '%INSERT INTO run_reservations%'"
                )
                rows = await cursor.fetchall()
            assert len(rows) == 1, rows
            return rows[0]

        await reserve(20)
        assert (await plans())["custom_plans"] == 5
        # The history grows twenty-fold under the prepared statement, and autovacuum would analyze it.
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(
                "INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price)"
                " SELECT gen_random_uuid(), 'plan-grown-' || (n % 2000), gen_random_uuid(), 'grown-' || n, '\\x00', 'succeeded',"
                "        nextval('analysis_jobs_queue_seq'), 1"
                "   FROM generate_series(1, 20000) AS n"
            )
            admin.execute("ANALYZE analysis_jobs, credit_ledger, run_reservations")
        await reserve(40)
        after = await plans()
    finally:
        await pool.close()
    # 60 calls: 5 unprepared, PostgreSQL's 5 custom plans before it compares, then generic throughout.
    assert (after["custom_plans"], after["generic_plans"]) == (5, 50), after


def test_the_ledger_of_one_actor_is_read_off_its_index(database_url: str) -> None:
    """ListLedgerEntries by actor reads one page off `credit_ledger_actor_newest_first`: an
    operator's few old entries under many newer ones of another actor are not found by walking
    the whole ledger backwards."""
    run = uuid.uuid4().hex
    insert = (
        "INSERT INTO credit_ledger (user_id, kind, amount, idempotency_key, actor, reason)"
        " SELECT 'plan-user-' || (n %% 50), 'grant', 1, %s || n, %s, 'grant' FROM generate_series(1, %s) AS n"
    )
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(insert, (f"rare-{run}-", "operator:plan-rare", 30))
        conn.execute(insert, (f"bulk-{run}-", "system:plan-bulk", 20_000))
        conn.execute("ANALYZE credit_ledger")
        for params in (
            {"actor": "operator:plan-rare", "user_id": "", "before_entry_id": None, "limit": 21},
            {"actor": "operator:plan-rare", "user_id": "plan-user-7", "before_entry_id": None, "limit": 21},
        ):
            plan = conn.execute(sql.SQL("EXPLAIN (FORMAT TEXT) ") + _statement("ledger_entries_of_actor"), params).fetchall()
            text = "\n".join(row["QUERY PLAN"] for row in plan)
            assert "credit_ledger_actor_newest_first" in text, text
            assert "Seq Scan" not in text and "Sort" not in text, text


_SEARCHES_IN_INPUTS = {
    "search_job_views_by_source_doi": ("analysis_job_search_keys_by_source_doi_bucket", {"source_doi": "10.5555/p77"}),
    "search_job_views_by_title_words": ("analysis_job_search_keys_by_title_words", {"title_words": "topic3 TOPIC4"}),
    "search_job_views_by_document_uri": ("analysis_job_search_keys_by_document_uri", {"document_uri_prefix": "s3://plans/u7/"}),
}
_NAMED_PARAMETER = re.compile(r"%\((\w+)\)s")


def _explain(conn: psycopg.Connection, name: str, values: dict, *, generic: bool) -> str:
    """The plan of a named query with bound values: its custom plan, or the generic plan of the
    statement prepared as the service's connections prepare it (psycopg, server-side)."""
    text = queries()[name]
    if not generic:
        return "\n".join(row["QUERY PLAN"] for row in conn.execute("EXPLAIN " + text, values))
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        conn.execute(text, values, prepare=True)
        prepared = conn.execute(
            "SELECT name, cardinality(parameter_types) AS arguments FROM pg_prepared_statements ORDER BY prepare_time DESC LIMIT 1"
        ).fetchone()
        assert prepared is not None
        # The same values, in the order psycopg numbered them (each name once, as it first appears).
        order = list(dict.fromkeys(_NAMED_PARAMETER.findall(text)))
        assert len(order) == prepared["arguments"], (order, prepared)
        # EXECUTE's arguments are written as literals (a utility statement takes no bound values).
        arguments = sql.SQL(", ").join(sql.Literal(values[key]) for key in order)
        rows = conn.execute(sql.SQL("EXPLAIN EXECUTE {}({})").format(sql.Identifier(prepared["name"]), arguments))
        return "\n".join(row["QUERY PLAN"] for row in rows)
    finally:
        conn.execute("RESET plan_cache_mode")


def test_the_searches_in_job_inputs_read_their_own_indexes(database_url: str) -> None:
    """SearchJobs by a source's DOI, title words or a document uri prefix reads the index of
    migration 0029 that serves it, with bound values and as a prepared generic plan, never the
    whole table: at a million jobs a search costs its matches, not the history."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(
            """INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, price,
                                          create_time, end_time, document_uri, document_title, sources, source_count)
               SELECT gen_random_uuid(), 'plans-u' || (g % 500), gen_random_uuid(), 'plans-' || g, '\\x00', 'succeeded',
                      nextval('analysis_jobs_queue_seq'), 1, now() - g * interval '1 minute', now(),
                      's3://plans/u' || (g % 500) || '/' || g || '.pdf',
                      'Topic' || (g % 40) || ' and topic' || ((g / 40) % 40) || ': thesis ' || g,
                      jsonb_build_array(jsonb_build_object('doi', '10.5555/P' || (g % 10000), 'citation', 'c')), 1
                 FROM generate_series(1, 100000) AS g"""
        )
        conn.execute("ANALYZE analysis_jobs, analysis_job_search_keys")
        # Each search matches a few jobs of the 100000 (10 cite the DOI, 62 titles hold both words,
        # 200 uris are under the folder): reading them from the index beats walking the history.
        # (At 20000 the keys' table is small enough that the planner reads it whole for the words.)
        # The DOIs were kept lowercased at insert (the trigger of migration 0029).
        assert conn.execute("SELECT count(*) AS n FROM analysis_job_search_keys WHERE source_dois @> '{10.5555/p77}'").fetchone() == {
            "n": 10
        }
        for name, (index, inputs) in _SEARCHES_IN_INPUTS.items():
            # Bound as the store binds a SearchJobs page of 20 (and one to know of a next).
            search = JobSearch(
                user_id="",
                statuses=(),
                created_after=None,
                upper_time=None,
                upper_job_id=None,
                has_error=False,
                inputs=JobInputsSearch(**inputs),
            )
            shape, values = job_search_statement(search, limit=21)
            assert shape == name, (inputs, shape)
            for generic in (False, True):
                plan = _explain(conn, name, values, generic=generic)
                assert re.search(rf"Index (?:Only )?Scan(?: Backward)? (?:using|on) {index} ", plan), (name, generic, plan)
                assert "Seq Scan on analysis_jobs" not in plan, (name, generic, plan)


def test_no_index_is_declared_newest_first(database_url: str) -> None:
    """Every index is built ascending (migration 0042): a B-tree packs its rightmost page full when
    it splits and halves any other, so an index declared DESC on a rising key (a time, a
    sequence) leaves every page it splits half empty until all its entries are gone. The reads that want newest first
    scan the ascending index backwards (the ledger test above: its index, and no sort). Checked
    over the catalog, so an index a later migration adds is checked too."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        descending = conn.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND EXISTS (SELECT 1 FROM unnest(i.indoption::int2[]) AS o WHERE o & 1 = 1)"
            " ORDER BY 1"
        ).fetchall()
    assert descending == [], f"indexes declared DESC (build them ascending; newest first reads them backwards): {descending}"
