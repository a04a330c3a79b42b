"""Every function of the service fits on a screen: none over 60 lines, counted by `ast` from its
`def` line to its last line (docstring included). A longer one is split into named steps, so a reader
follows what it does from the names before reading how. The generated `_gen` modules are exempt."""

from __future__ import annotations

import ast
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
