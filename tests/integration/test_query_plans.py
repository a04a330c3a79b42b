"""What PostgreSQL plans for our hot path: a locked section's statements are planned once per
connection, not on every call (planning the job view read cost nine times its execution)."""

from __future__ import annotations

from tests.harness import S, new_user

_VIEW_READ = "%analysis_job_views WHERE job_id = ANY%"


async def test_a_locked_sections_view_read_runs_its_generic_plan_instead_of_being_planned_every_call(services) -> None:
    # One connection, so every admit's statements are prepared on the same session we then read.
    service = await services.start(pool_min_size=1, pool_max_size=1)
    stubs = service.stubs
    user = new_user()
    admits = 15
    await stubs.grant(user, admits)
    jobs = [await stubs.admit(user, f"click-{i}") for i in range(admits)]
    assert [j.status for j in jobs[1:]] == [S.JOB_STATUS_QUEUED] * (admits - 1)

    async with service.app.store.pool.connection() as conn:
        rows = await (
            await conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s", (_VIEW_READ,)
            )
        ).fetchall()
    # psycopg prepares a statement after its fifth run on a connection; from then on each admit's
    # view read must reuse the generic plan. PostgreSQL's default chose a fresh custom plan each time.
    assert len(rows) == 1, rows
    assert rows[0]["custom_plans"] == 0, rows
    assert rows[0]["generic_plans"] >= admits - 6, rows
