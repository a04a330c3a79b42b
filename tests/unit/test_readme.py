"""The README stays true: every setting is in its configuration tables, with its default; the CI
runs the README's test command; and every link or path in the Markdown resolves inside the
repository."""

from __future__ import annotations

import re
from pathlib import Path

from queue_service.config import DEV_SETTINGS, SETTINGS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


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
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci


def test_every_dev_setting_is_documented_with_its_default() -> None:
    table = README.split("`queue-service dev` reads these too", 1)[1].split("\n\n", 2)[1]
    missing = []
    for setting in DEV_SETTINGS.values():
        row = next((line for line in table.splitlines() if line.startswith(f"| `{setting.env}`")), None)
        if row is None:
            missing.append(f"{setting.env}: no row")
        elif setting.default and f"`{setting.default}`" not in row.rsplit("|", 2)[-2]:
            missing.append(f"{setting.env}: default {setting.default!r} not in {row!r}")
    assert missing == []


# -- the repository stands alone: every reference in its Markdown resolves inside it -------------

_SKIP_DIRS = {".git", ".venv", "node_modules", "target", ".state", ".pytest_cache", ".hypothesis", "build", "dist"}
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\s]+)`")
_TOP_LEVEL = tuple(f"{entry.name}/" for entry in ROOT.iterdir() if entry.name not in _SKIP_DIRS)
_MACHINE_PATH = re.compile(r"(?<![\w.])(/work/|/home/|/root/|/Users/|\.\./shared\b|\.\./reference\b)")


def _markdown_files() -> list[Path]:
    return sorted(
        path for path in ROOT.rglob("*.md") if not _SKIP_DIRS.intersection(path.relative_to(ROOT).parts)
    )


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    found = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return found


def _problem(source: Path, target: str) -> str | None:
    path_part, _, anchor = target.partition("#")
    resolved = (source.parent / path_part).resolve() if path_part else source
    try:
        resolved.relative_to(ROOT)
    except ValueError:
        return f"{target} points outside the repository"
    if not resolved.exists():
        return f"{target} does not exist"
    if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved.read_text()):
        return f"{target}: no heading with anchor #{anchor}"
    return None


def test_markdown_links_and_paths_resolve_inside_the_repository() -> None:
    problems = []
    for source in _markdown_files():
        text = source.read_text()
        where = source.relative_to(ROOT)
        for match in _MACHINE_PATH.finditer(text):
            problems.append(f"{where}: mentions {match.group(1)!r}, a path outside the repository")
        for target in _LINK.findall(text):
            if not re.match(r"^[a-z]+:", target):
                problem = _problem(source, target)
                if problem:
                    problems.append(f"{where}: link {problem}")
        for token in _CODE.findall(text):
            token = token.rstrip(".,:;")
            looks_like_path = token.startswith(("../", "./")) or (token.startswith(_TOP_LEVEL) and "/" in token)
            if not looks_like_path or re.search(r"[<>*…{}$]|NNNN", token):
                continue
            # Paths in backticks are written from the repository root, or from the file's folder.
            if (ROOT / token).exists() or _problem(source, token) is None:
                continue
            problems.append(f"{where}: `{token}` {_problem(source, token)}")
    assert problems == []


def test_the_reference_check_catches_a_path_outside_and_a_missing_file(tmp_path: Path) -> None:
    outside = ROOT / "docs" / "design.md"
    assert _problem(outside, "../../shared/design/queue-design.md") is not None
    assert _problem(outside, "missing.md") is not None
    assert _problem(outside, "operations.md") is None
    assert _problem(outside, "design.md#9-invariants") is None
    assert _problem(outside, "design.md#no-such-heading") is not None
    assert _MACHINE_PATH.search("see ../shared/design/queue-design.md")


def test_no_tracked_file_names_a_path_of_a_developers_machine() -> None:
    """The repository stands alone: no file points into a developer's machine or a folder
    beside the checkout (this file spells the patterns, so it is left out)."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if path == Path(__file__).resolve() or name.endswith((".lock", "-lock.json", ".png")) or not path.is_file():
            continue
        text = path.read_text(errors="ignore")
        offenders += [f"{name}: {match.group(0)}" for match in _MACHINE_PATH.finditer(text)]
    assert offenders == []
