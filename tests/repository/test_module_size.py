"""The store and the model stay in modules a reader takes in whole: none over 400 lines. A concern
that outgrows one gets a module of its own (`store/statements/`, `model/`, `store/sql/queries/`),
instead of every feature landing in the same three files."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "queue_service"
MAX_LINES = 400


def test_no_module_of_the_store_or_the_model_is_over_400_lines() -> None:
    modules = sorted(path for room in ("store", "model") for path in (PACKAGE / room).rglob("*.py"))
    assert len(modules) > 20, f"only {len(modules)} modules found: the scan is broken"
    too_long = {
        str(path.relative_to(PACKAGE.parent)): lines for path in modules if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert too_long == {}
