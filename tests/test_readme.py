"""The README stays true: every setting is in its configuration table, with its default."""

from __future__ import annotations

from pathlib import Path

from queue_service.config import SETTINGS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_documented_with_its_default() -> None:
    table = README.split("## Configuration", 1)[1].split("## Commands", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    missing = []
    for setting in SETTINGS.values():
        row = next((r for r in rows if f"`{setting.env}`" in r), None)
        if row is None:
            missing.append(f"{setting.env}: no row")
            continue
        default_cell = row.rsplit("|", 2)[-2]
        if setting.default and f"`{setting.default}`" not in default_cell:
            missing.append(f"{setting.env}: default {setting.default!r} not in {default_cell.strip()!r}")
    assert missing == []


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    command = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/pytest"
    assert command in README
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert command in ci
