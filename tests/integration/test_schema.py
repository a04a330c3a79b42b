"""`queue_service/store/sql/schema.sql` is the schema the migrations produce.

Two checks (see `schema_tool`): on any server, schema.sql applied to an empty database dumps
exactly like a migrated one; on the major the file was dumped on (the embedded PostgreSQL of the
README's test command), the migrated dump is the file's text. A failure prints the diff and the
command that regenerates the file.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg.rows import dict_row

from queue_service.store import migrations
from tests.harness import PostgresServer
from tests.integration import schema_tool

SCHEMA_TEXT = schema_tool.SCHEMA_FILE.read_text()
STALE = f"\nschema.sql and the migrations disagree; after a new migration run `{schema_tool.REGENERATE}`"


def server_major(postgres: PostgresServer) -> int:
    with psycopg.connect(postgres.admin_dsn) as conn:
        return schema_tool.server_major(conn)


def test_schema_sql_applied_and_the_migrations_applied_are_the_same_schema(postgres: PostgresServer) -> None:
    migrated = schema_tool.migrated_schema(postgres.admin_dsn)
    applied = schema_tool.applied_schema(postgres.admin_dsn, SCHEMA_TEXT)
    difference = schema_tool.diff(applied, migrated, expected_name="schema.sql applied", actual_name="the migrations applied")
    assert not difference, difference + STALE


def test_schema_sql_is_the_dump_of_the_migrations(postgres: PostgresServer) -> None:
    recorded = schema_tool.dumped_on(SCHEMA_TEXT)
    assert recorded is not None, "schema.sql lacks its '-- Dumped on PostgreSQL N.' line" + STALE
    if server_major(postgres) != recorded:
        # Another major deparses some expressions differently; the test above compares there.
        pytest.skip(f"schema.sql was dumped on PostgreSQL {recorded}; this server deparses as another major")
    migrated = schema_tool.migrated_schema(postgres.admin_dsn)
    difference = schema_tool.diff(
        SCHEMA_TEXT, migrated, expected_name="queue_service/store/sql/schema.sql", actual_name="the migrations' dump"
    )
    assert not difference, difference + STALE


def test_the_final_definitions_are_the_ones_in_the_file() -> None:
    """0002 and 0003 each replace 0001's analysis_jobs_free_slot, 0006 the job view: the file
    holds each once, in its last form."""
    assert SCHEMA_TEXT.count("FUNCTION public.analysis_jobs_free_slot(") == 1
    assert "holders AS" in SCHEMA_TEXT and "run_settle_due_at IS NOT NULL" in SCHEMA_TEXT  # 0003's
    assert SCHEMA_TEXT.count("CREATE VIEW public.analysis_job_views") == 1
    assert "COALESCE(( SELECT true" in SCHEMA_TEXT and "EXISTS ( SELECT 1" not in SCHEMA_TEXT  # 0006's


def test_a_schema_that_drifts_from_the_migrations_shows_in_the_diff(postgres: PostgresServer) -> None:
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        asyncio.run(migrations.migrate(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE analysis_jobs ADD COLUMN priority integer DEFAULT 0 NOT NULL")
            conn.execute("CREATE INDEX analysis_jobs_by_priority ON analysis_jobs (priority)")
            conn.execute("ALTER TABLE credit_ledger DROP CONSTRAINT credit_ledger_sign")
            conn.execute(
                "CREATE OR REPLACE FUNCTION analysis_jobs_free_slot(p_user_id text, p_default_max_active integer) "
                "RETURNS integer LANGUAGE sql STABLE AS $$ SELECT 1 $$"
            )
        with psycopg.connect(dsn, row_factory=dict_row) as conn:
            drifted = schema_tool.render(conn)
    applied = schema_tool.applied_schema(postgres.admin_dsn, SCHEMA_TEXT)
    difference = schema_tool.diff(applied, drifted, expected_name="schema.sql applied", actual_name="drifted")
    added = {line for line in difference.splitlines() if line.startswith("+") and not line.startswith("+++")}
    removed = {line for line in difference.splitlines() if line.startswith("-") and not line.startswith("---")}
    assert any("priority" in line and "integer DEFAULT 0 NOT NULL" in line for line in added)
    assert any(line.startswith("+CREATE INDEX analysis_jobs_by_priority ON public.analysis_jobs") for line in added)
    assert any("CONSTRAINT credit_ledger_sign CHECK" in line for line in removed)
    assert "+AS $function$ SELECT 1 $function$;" in added


def test_an_object_the_dump_cannot_render_is_refused_by_name(postgres: PostgresServer) -> None:
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE DOMAIN positive_amount AS bigint CHECK (VALUE > 0)")
        with psycopg.connect(dsn, row_factory=dict_row) as conn, pytest.raises(NotImplementedError, match="positive_amount"):
            schema_tool.dump(conn)
