"""The docs a reader follows name things that exist: every repository path a doc cites (in
backticks or as a markdown link) is a file or folder of this repository, and every invariant a doc
cites (I1, I2, ...) is one that docs/design.md states."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The top-level folders whose paths a doc cites; a token that starts with one of them is a path.
_REPO_FOLDERS = ("queue_service", "docs", "tests", "bench", "deploy", "protos", "clients", "console", ".ci")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\s]+)`")
# Placeholders and globs name a family of files, not one: `NNNN_name.sql`, `<name>`, `*.json`.
_PLACEHOLDER = re.compile(r"[<>*…$]|NNNN|\.\.\.")
_BRACES = re.compile(r"\{([^{}]*)\}")
_INVARIANT = re.compile(r"\bI(\d{1,2})\b")
_INVARIANT_RANGE = re.compile(r"\bI(\d{1,2})\s*[-–]\s*I(\d{1,2})\b")
# "the invariants I1-I11" speaks of all of them, so it must end at the last one.
_ALL_INVARIANTS = re.compile(r"invariants,?\s*\(?I1\s*[-–]\s*I(\d{1,2})\b")
# The docs also name the service's rooms without the package: `store/locks.py` is queue_service/store/locks.py.
_ROOMS = ("engine/", "store/", "api/", "sql/", "cli/", "dev/")
_ROOM_ROOTS = ("queue_service", "queue_service/store")


def cited_docs() -> list[Path]:
    """The docs a reader is sent to: the README, CONTRIBUTING, docs/, the clients' and the bench's READMEs,
    and the bench's notebook beside its results."""
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "README.md"]
    docs += sorted((ROOT / "docs").rglob("*.md"))
    docs += sorted((ROOT / "clients").glob("*/README.md"))
    docs += sorted((ROOT / "bench" / "results" / "history").glob("*.md"))
    return [doc for doc in docs if doc.exists()]


def _expanded(path: str) -> list[str]:
    """`a-{1,2}.json` is two paths, a-1.json and a-2.json (as the shell spells them)."""
    brace = _BRACES.search(path)
    if not brace:
        return [path]
    return [spelled for choice in brace.group(1).split(",") for spelled in _expanded(path[: brace.start()] + choice + path[brace.end() :])]


def _repo_path(token: str) -> str | None:
    """The path a token names, if it looks like a repository path; None otherwise."""
    token = token.strip().rstrip(".,:;")
    token = re.sub(r"(:\d+(-\d+)?|#.*)$", "", token)  # a line number or an anchor
    if token.startswith("./"):
        token = token[2:]
    if not token.startswith((*(f"{folder}/" for folder in _REPO_FOLDERS), "../", *_ROOMS)):
        return None
    if _PLACEHOLDER.search(token) or "://" in token:
        return None
    return token


def missing_paths(doc: Path, text: str | None = None) -> list[str]:
    """The repository paths `doc` cites that do not exist, read from the repository's root or from the doc's folder."""
    text = doc.read_text() if text is None else text
    cited = [target for target in _LINK.findall(text) if not re.match(r"^[a-z]+:", target)]
    cited += _CODE.findall(text)
    missing = []
    for token in cited:
        path = _repo_path(token)
        if path is None:
            continue
        for spelled in _expanded(path):
            from_doc = (doc.parent / spelled).resolve()
            roots = [ROOT, *(ROOT / room_root for room_root in _ROOM_ROOTS)] if spelled.startswith(_ROOMS) else [ROOT]
            if not any((root / spelled).exists() for root in roots) and not (from_doc.is_relative_to(ROOT) and from_doc.exists()):
                missing.append(f"{doc.relative_to(ROOT)}: {token} -> {spelled} does not exist")
    return missing


def stated_invariants() -> set[int]:
    """The invariants docs/design.md states, each as a bullet `- **In** ...`."""
    design = (ROOT / "docs" / "design.md").read_text()
    return {int(number) for number in re.findall(r"^- \*\*I(\d{1,2})\*\*", design, flags=re.M)}


def unknown_invariants(doc: Path, text: str | None = None) -> list[str]:
    text = doc.read_text() if text is None else text
    stated = stated_invariants()
    cited = {int(number) for number in _INVARIANT.findall(text)}
    for first, last in _INVARIANT_RANGE.findall(text):
        cited.update(range(int(first), int(last) + 1))
    cited.update(-int(last) for last in _ALL_INVARIANTS.findall(text) if int(last) != max(stated))
    return [
        f"{doc.relative_to(ROOT)}: I{abs(number)}"
        + (" ends a range short of the last invariant" if number < 0 else " is not in docs/design.md")
        for number in sorted(cited - stated)
    ]


def test_every_cited_repository_path_exists() -> None:
    problems = [problem for doc in cited_docs() for problem in missing_paths(doc)]
    assert problems == []


def test_every_cited_invariant_is_stated_in_the_design() -> None:
    assert stated_invariants() == set(range(1, 15)), "docs/design.md states I1..I14"
    problems = [problem for doc in cited_docs() for problem in unknown_invariants(doc)]
    assert problems == []


def test_the_checks_catch_a_wrong_path_and_a_wrong_invariant() -> None:
    doc = ROOT / "docs" / "operations.md"
    assert missing_paths(doc, "see `queue_service/engine/no_such_room.py` and [x](../bench/nowhere.md)") == [
        "docs/operations.md: ../bench/nowhere.md -> ../bench/nowhere.md does not exist",
        "docs/operations.md: queue_service/engine/no_such_room.py -> queue_service/engine/no_such_room.py does not exist",
    ]
    assert missing_paths(doc, "`store/locks.py`, `sql/functions/queue_admit_job.sql`, [a](architecture.md)") == []
    assert len(missing_paths(doc, "`engine/no_such_room.py`")) == 1
    assert missing_paths(doc, "`bench/results/history/change-feed-{before,after}-{1,2}.json`") == []
    assert len(missing_paths(doc, "`bench/results/change-feed-{before,after}-1.json`")) == 2
    assert missing_paths(doc, "`queue_service/store/sql/migrations/NNNN_name.sql`, `deploy/<name>.yaml`, [d](design.md#9-invariants)") == []
    assert unknown_invariants(doc, "I1, I14, I1-I14, I1-I3 held") == []
    assert unknown_invariants(doc, "I15") == ["docs/operations.md: I15 is not in docs/design.md"]
    assert unknown_invariants(doc, "invariants I1–I11") == ["docs/operations.md: I11 ends a range short of the last invariant"]
