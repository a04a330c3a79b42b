"""Every function of the service fits on a screen: none over 60 lines, counted by `ast` from its
`def` line to its last line (docstring included). A longer one is split into named steps, so a reader
follows what it does from the names before reading how. The generated `_gen` modules are exempt."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "queue_service"
MAX_LINES = 60


def _functions(path: Path) -> list[tuple[int, str, int]]:
    """(line, name, length) of every function and method of the file, nested ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
    ]


def test_no_function_of_the_service_is_over_60_lines() -> None:
    modules = sorted(path for path in PACKAGE.rglob("*.py") if "_gen" not in path.relative_to(PACKAGE).parts)
    assert len(modules) > 50, f"only {len(modules)} modules found: the scan is broken"
    too_long = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {name} {length}"
        for path in modules
        for line, name, length in _functions(path)
        if length > MAX_LINES
    ]
    assert not too_long, f"functions over {MAX_LINES} lines (split them into named steps):\n" + "\n".join(too_long)


SQL_FUNCTIONS = PACKAGE / "store" / "sql" / "functions"
_CREATE = re.compile(r"^CREATE OR REPLACE FUNCTION public\.(?P<name>\w+)\(", re.MULTILINE)
# One statement each, the admit's and the adoption's: a job enters the user's queue, is charged and
# consumes its reservation in one INSERT with its CTEs, under the user's lock (docs/design.md,
# "Admission"). Split, the one statement would become several round trips inside the function,
# and the admit is the path every click takes.
ONE_STATEMENT_FUNCTIONS = {"queue_admit_job_v2", "queue_adopt_run_v2"}


def _sql_functions(path: Path) -> list[tuple[int, str, int]]:
    """(line, name, length) of every function of a function file, from its CREATE to its body's end."""
    text = path.read_text()
    found = []
    for create in _CREATE.finditer(text):
        end = text.index("\n$function$;", create.end())
        first = text.count("\n", 0, create.start()) + 1
        found.append((first, create.group("name"), text.count("\n", create.start(), end) + 2))
    return found


def test_no_sql_function_is_over_60_lines_but_the_one_statement_admit_and_adoption() -> None:
    files = sorted(SQL_FUNCTIONS.glob("*.sql"))
    assert len(files) > 30, f"only {len(files)} function files found: the scan is broken"
    lengths = {
        name: (f"{path.relative_to(PACKAGE.parent)}:{line}", length) for path in files for line, name, length in _sql_functions(path)
    }
    too_long = [
        f"{where} {name} {length}"
        for name, (where, length) in lengths.items()
        if length > MAX_LINES and name not in ONE_STATEMENT_FUNCTIONS
    ]
    assert not too_long, f"SQL functions over {MAX_LINES} lines (split them into named steps):\n" + "\n".join(too_long)
    # The exception stays true: each named function exists and still needs it.
    assert {name for name in ONE_STATEMENT_FUNCTIONS if lengths.get(name, ("", 0))[1] > MAX_LINES} == ONE_STATEMENT_FUNCTIONS
