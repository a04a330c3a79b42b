"""`queue_service/store/sql/schema.sql` is the schema the migrations produce.

Two checks (see `schema_tool`): on any server, schema.sql applied to an empty database dumps
exactly like a migrated one; on the major the file was dumped on (the embedded PostgreSQL of the
README's test command), the migrated dump is the file's text. A failure prints the diff and the
command that regenerates the file.
"""

from __future__ import annotations

import asyncio
import re

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


# Every function, trigger and view has one file in sql/functions/ (migrations.function_files).

_DEFINED = re.compile(
    r"^(?:CREATE OR REPLACE FUNCTION public\.(?P<function>\w+)\(|CREATE OR REPLACE VIEW public\.(?P<view>\w+) AS"
    r"|CREATE TRIGGER (?P<trigger>\w+) )",
    re.MULTILINE,
)


def _defined_in_files() -> dict[tuple[str, str], set[str]]:
    """(kind, object name) -> the files that define it."""
    found: dict[tuple[str, str], set[str]] = {}
    for file in migrations.function_files():
        for match in _DEFINED.finditer(file.sql):
            kind = match.lastgroup or ""
            found.setdefault((kind, match[kind]), set()).add(file.name)
    return found


def _in_catalog(dsn: str) -> set[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            """
            SELECT DISTINCT 'function', p.proname FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
            UNION SELECT 'view', c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'v'
            UNION SELECT 'trigger', t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                   WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
            """
        ).fetchall()
    return {(kind, name) for kind, name in rows}


def test_every_function_trigger_and_view_has_exactly_one_file_and_every_file_its_objects(postgres: PostgresServer) -> None:
    defined = _defined_in_files()
    assert {key: files for key, files in defined.items() if len(files) > 1} == {}, "an object defined in two files"
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        asyncio.run(migrations.migrate(dsn))
        catalog = _in_catalog(dsn)
    assert sorted(catalog - set(defined)) == [], "objects without a file in queue_service/store/sql/functions/"
    assert sorted(set(defined) - catalog) == [], "files defining objects the migrated database lacks"
    for file in migrations.function_files():
        names = {name for _, name in (key for key, files in defined.items() if file.name in files)}
        assert file.name in names, f"functions/{file.name}.sql defines no object of its own name"


def test_a_file_comes_after_the_files_it_requires() -> None:
    order = [file.name for file in migrations.function_files()]
    for file in migrations.function_files():
        assert file.requires == tuple(name for name in file.requires if order.index(name) < order.index(file.name))
    assert "analysis_job_views" in migrations.function_files()[order.index("queue_admit_job")].requires
    circle = {
        "a": migrations.FunctionFile("a", "-- requires: b\n"),
        "b": migrations.FunctionFile("b", "-- requires: a\n"),
    }
    with pytest.raises(migrations.MigrationError, match="circle: a -> b -> a"):
        migrations._in_dependency_order(circle)


def _free_slot_body(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'analysis_jobs_free_slot'").fetchone()
    assert row is not None
    return str(row[0])


def _pending(dsn: str) -> list[str]:
    async def read() -> list[str]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            return await migrations.pending_migrations(conn)

    return asyncio.run(read())


def test_a_changed_file_is_applied_on_the_next_migrate_and_an_unchanged_one_is_not(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = migrations.function_files()
    original = next(file for file in files if file.name == "analysis_jobs_free_slot")
    changed = migrations.FunctionFile(original.name, original.sql.replace("     LIMIT 1\n", "     LIMIT 1 -- changed\n"))
    assert changed.sql != original.sql
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        first = asyncio.run(migrations.migrate_all(dsn))
        assert first.function_files == [file.name for file in files]
        assert _pending(dsn) == []
        assert asyncio.run(migrations.migrate_all(dsn)) == migrations.Applied([], [])

        monkeypatch.setattr(migrations, "function_files", lambda: [changed if f is original else f for f in files])
        assert _pending(dsn) == ["functions/analysis_jobs_free_slot.sql"]
        assert asyncio.run(migrations.migrate_all(dsn)) == migrations.Applied([], ["analysis_jobs_free_slot"])
        assert "-- changed" in _free_slot_body(dsn)
        assert _pending(dsn) == []
        assert asyncio.run(migrations.migrate_all(dsn)) == migrations.Applied([], [])

        # Back to the earlier text: not pending for a replica that brings it (the deploy it
        # overlaps), and applied again by a migrate, as a revert.
        monkeypatch.setattr(migrations, "function_files", lambda: files)
        assert _pending(dsn) == []
        assert asyncio.run(migrations.migrate_all(dsn)) == migrations.Applied([], ["analysis_jobs_free_slot"])
        assert "-- changed" not in _free_slot_body(dsn)


def test_a_replica_behind_the_database_applies_none_of_its_files(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    files = migrations.function_files()
    older = [migrations.FunctionFile(f.name, f.sql + "-- older\n") if f.name == "queue_end_job" else f for f in files]
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        asyncio.run(migrations.migrate(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO queue_schema_migrations (version, name, checksum) VALUES (9999, 'newer', 'x')")
        monkeypatch.setattr(migrations, "function_files", lambda: older)
        assert _pending(dsn) == []
        assert asyncio.run(migrations.migrate_all(dsn)) == migrations.Applied([], [])


def test_two_replicas_migrating_at_once_apply_everything_once(postgres: PostgresServer) -> None:
    async def both(dsn: str) -> list[migrations.Applied]:
        return list(await asyncio.gather(migrations.migrate_all(dsn), migrations.migrate_all(dsn)))

    every_version = [m.version for m in migrations.available_migrations()]
    every_file = [f.name for f in migrations.function_files()]
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        results = asyncio.run(both(dsn))
        assert sorted(results, key=lambda applied: len(applied.versions)) == [
            migrations.Applied([], []),
            migrations.Applied(every_version, every_file),
        ]
        assert asyncio.run(both(dsn)) == [migrations.Applied([], []), migrations.Applied([], [])]
        with psycopg.connect(dsn) as conn:
            recorded = conn.execute("SELECT name, count(*) FROM queue_schema_functions GROUP BY name ORDER BY name").fetchall()
        assert recorded == [(name, 1) for name in sorted(every_file)]
        assert _pending(dsn) == []
