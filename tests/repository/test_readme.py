"""The README stays true: the settings reference is generated from the settings, the CI runs the
README's test command, and every link or path in the Markdown resolves inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

from queue_service.config import DEV_SETTINGS, SETTINGS
from tests.repository import files
from tests.repository.files import MACHINE_PATH

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    """docs/configuration.md is written from queue_service/config.py, so a meaning is written once;
    a setting added there and not regenerated here fails with the command that fixes it."""
    from queue_service.config import reference_markdown

    written = (ROOT / "docs" / "configuration.md").read_text()
    assert written == reference_markdown(), "docs/configuration.md is stale: python -m queue_service.config > docs/configuration.md"
    for setting in (*SETTINGS.values(), *DEV_SETTINGS.values()):
        assert f"| `{setting.env}` |" in written


def test_the_readme_is_a_front_door() -> None:
    """The README keeps what it is (the two commands, how it works, the map) and links the rest."""
    assert len(README.splitlines()) <= 140
    for linked in ("docs/configuration.md", "docs/operations.md", "docs/security.md", "deploy/README.md", "CONTRIBUTING.md"):
        assert f"]({linked}" in README, linked


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    command = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/pytest"
    assert command in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert command in ci


# -- the repository stands alone: every reference in its Markdown resolves inside it -------------

_SKIP_DIRS = {".git", ".venv", "node_modules", "target", ".state", ".pytest_cache", ".hypothesis", "build", "dist"}
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\s]+)`")
_TOP_LEVEL = tuple(f"{entry.name}/" for entry in ROOT.iterdir() if entry.name not in _SKIP_DIRS)


def _markdown_files() -> list[Path]:
    return sorted(path for path in ROOT.rglob("*.md") if not _SKIP_DIRS.intersection(path.relative_to(ROOT).parts))


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
        for match in MACHINE_PATH.finditer(text):
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
    assert MACHINE_PATH.search("see ../shared/design/queue-design.md")


def test_no_tracked_file_names_a_path_of_a_developers_machine() -> None:
    """The repository stands alone: no file points into a developer's machine or a folder
    beside the checkout (this file and the one that defines MACHINE_PATH spell the patterns, so
    they are left out)."""
    import subprocess

    spelling_the_patterns = {Path(__file__).resolve(), Path(files.__file__).resolve()}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if path in spelling_the_patterns or name.endswith((".lock", "-lock.json", ".png")) or not path.is_file():
            continue
        text = path.read_text(errors="ignore")
        offenders += [f"{name}: {match.group(0)}" for match in MACHINE_PATH.finditer(text)]
    assert offenders == []
