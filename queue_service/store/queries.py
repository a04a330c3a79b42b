"""The named queries of `sql/queries/`, one file per concern (its README.md has the rules): every
runtime query of the service, by name, loaded once from every file of the folder. A block starts
with `-- name: <query_name>`; a line `-- include: <query_name>` stands for that query's text
(without its `;`), whichever file of the folder holds it.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from psycopg import sql

QUERIES_FOLDER = "sql/queries"

_BLOCK = re.compile(r"^-- name: (?P<name>\w+)\n(?P<body>.*?)(?=^-- name: |\Z)", re.MULTILINE | re.DOTALL)
_INCLUDE = re.compile(r"^-- include: (?P<name>\w+)$", re.MULTILINE)


def query_files() -> dict[str, str]:
    """The text of every file of the folder, by file name."""
    folder = resources.files("queue_service.store").joinpath(QUERIES_FOLDER)
    return {
        entry.name: entry.read_text() for entry in sorted(folder.iterdir(), key=lambda entry: entry.name) if entry.name.endswith(".sql")
    }


def query_names(text: str) -> list[str]:
    """The names of the blocks of one file, in its order."""
    return [match["name"] for match in _BLOCK.finditer(text)]


@cache
def queries() -> dict[str, str]:
    """The named queries, loaded once, without their leading description comments (so a span
    or a log of the statement starts with its verb). A name is unique across the folder."""
    bodies: dict[str, str] = {}
    for file_name, text in query_files().items():
        for match in _BLOCK.finditer(text):
            if match["name"] in bodies:
                raise ValueError(f"the query {match['name']!r} is named twice in {QUERIES_FOLDER} (again in {file_name})")
            bodies[match["name"]] = _without_leading_comments(match["body"])
    return {name: _INCLUDE.sub(lambda m: bodies[m["name"]].removesuffix(";"), body) for name, body in bodies.items()}


@cache
def statement(name: str) -> sql.SQL:
    # The files ship with the package: their text is as trusted as a literal in this module.
    return sql.SQL(queries()[name])


def _without_leading_comments(body: str) -> str:
    lines = body.strip().splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    return "\n".join(lines).strip()
