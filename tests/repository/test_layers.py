"""The layers of `queue_service` (docs/architecture.md), enforced on the imports of every module.

Each room may import only the rooms listed for it; the database driver only in the store, gRPC
only at the edges. A module that breaks a rule fails this test with the line that does it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "queue_service"

FOUNDATION = {"model", "errors", "config", "deadline", "background", "telemetry", "audit"}

# Room -> the rooms of the package it may import (a room is a top-level module or subpackage).
ALLOWED: dict[str, set[str]] = {
    "model": set(),
    "errors": set(),
    "deadline": set(),
    "background": set(),
    "config": set(),
    "telemetry": set(),
    "audit": set(),
    "store": FOUNDATION,
    "core_client": FOUNDATION | {"_gen"},
    "engine": FOUNDATION | {"store", "core_client"},
    "api": FOUNDATION | {"engine", "_gen"},
    "dev": FOUNDATION | {"_gen"},
    "server": FOUNDATION | {"store", "core_client", "engine", "api", "_gen"},
    "cli": FOUNDATION | {"store", "engine", "api", "server", "dev", "_gen"},
}

# Third-party libraries that belong to one layer: the driver to the store, gRPC to the edges.
LIBRARY_ROOMS: dict[str, set[str]] = {
    "psycopg": {"store", "config", "telemetry", "cli"},  # config parses a DSN; telemetry instruments; cli explains start failures
    "psycopg_pool": {"store", "cli"},
    "grpc": {"api", "core_client", "server", "cli", "dev", "telemetry"},
    "google.rpc": {"api", "core_client", "dev"},
    "jwt": {"api"},  # per-user assertions are verified at the edge
}


def _room(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(("queue_service", *path.relative_to(PACKAGE).parts[: -node.level]))
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            if module == "queue_service":
                found.extend((node.lineno, f"queue_service.{alias.name}") for alias in node.names)
    return found


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_gen" not in p.relative_to(PACKAGE).parts)


def violations() -> list[str]:
    found = []
    for path in _sources():
        room = _room(path)
        if room == "__init__":
            continue
        allowed = ALLOWED.get(room)
        where = path.relative_to(PACKAGE.parent)
        if allowed is None:
            found.append(f"{where}: room {room!r} has no rules in this test (add it to ALLOWED and docs/architecture.md)")
            continue
        for line, module in _imports(path):
            parts = module.split(".")
            if parts[0] == "queue_service" and len(parts) > 1:
                target = parts[1]
                if target != room and target not in allowed:
                    found.append(f"{where}:{line}: {room} may not import {module}")
            for library, rooms in LIBRARY_ROOMS.items():
                if (module == library or module.startswith(library + ".")) and room not in rooms:
                    found.append(f"{where}:{line}: {room} may not import {module} (only {sorted(rooms)})")
    return found


def test_every_module_keeps_to_its_layer() -> None:
    assert violations() == []


def test_no_servicer_reaches_the_store() -> None:
    """Stated on its own: the gRPC edge talks to the engine, never to the database."""
    api = [path for path in _sources() if _room(path) == "api"]
    assert api, "the edge moved; update this test"
    for path in api:
        assert not [m for _, m in _imports(path) if m.startswith(("queue_service.store", "psycopg"))], path


# Inside the engine: the loops depend on what they ask for (a Protocol each), not on the rooms
# that answer, and the lifecycle core depends on none of the rooms around it.
ENGINE_MODULES_KEPT_APART: dict[str, set[str]] = {
    "dispatcher": {"engine", "admission", "completions", "releases", "recovery", "sweeper"},
    "sweeper": {"engine", "admission", "completions", "releases", "recovery", "dispatcher"},
    "engine": {"admission", "completions", "releases", "recovery", "dispatcher", "sweeper", "core_reconciliation"},
    # The background tasks serve every room and know none of them.
    "tasks": {"engine", "admission", "completions", "releases", "recovery", "dispatcher", "sweeper", "watch", "job_reads"},
    # The ports are what the rooms ask for: they know no room that asks or answers.
    "ports": {"engine", "admission", "completions", "releases", "recovery", "dispatcher", "sweeper", "core_reconciliation", "tasks"},
    # The rooms stand side by side above the lifecycle core: each asks the core and the others
    # through the ports it was built with (`Lifecycle`, `Endings`, `ReservedRuns`, `ExpiredReleases`).
    "admission": {"engine", "completions", "releases", "recovery", "dispatcher", "sweeper", "core_reconciliation"},
    "completions": {"engine", "admission", "releases", "recovery", "dispatcher", "sweeper", "core_reconciliation"},
    "releases": {"engine", "admission", "completions", "recovery", "dispatcher", "sweeper", "core_reconciliation"},
    "recovery": {"engine", "admission", "completions", "releases", "dispatcher", "sweeper", "core_reconciliation"},
    # The shared parts are below every room and loop: the rooms are built with them.
    "parts": {"engine", "admission", "completions", "releases", "recovery", "dispatcher", "sweeper", "core_reconciliation"},
    # The durable backoff is a formula: it knows no room.
    "backoff": {"engine", "admission", "completions", "releases", "recovery", "dispatcher", "sweeper", "core_reconciliation", "tasks"},
}


def test_the_engine_loops_and_core_keep_apart() -> None:
    found = []
    for module, forbidden in ENGINE_MODULES_KEPT_APART.items():
        path = PACKAGE / "engine" / f"{module}.py"
        for line, imported in _imports(path):
            parts = imported.split(".")
            if parts[:2] == ["queue_service", "engine"] and (len(parts) == 2 or parts[2] in forbidden):
                found.append(f"engine/{module}.py:{line}: imports {imported}")
    assert found == []


def test_the_edge_enters_the_engine_by_its_front() -> None:
    """`api/` imports what `engine/__init__.py` exports, never an engine module by its path."""
    found = []
    for path in _sources():
        if _room(path) != "api":
            continue
        for line, imported in _imports(path):
            if imported.startswith("queue_service.engine."):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports {imported}")
    assert found == []


# Inside the edge (api/__init__.py) the groups import one way: a listener enters the road, the
# road reaches access (who the caller is) and the servicers' adapters, access checks requests with
# the servicers' validation, and the servicers know no other group (they answer the same whichever
# transport brought the call, whoever authorized it). Each group may import only the groups after it.
API_GROUP_ORDER = ("listeners", "road", "access", "servicers")
API_GROUPS = set(API_GROUP_ORDER)
API_GROUPS_KEPT_APART: dict[str, set[str]] = {group: set(API_GROUP_ORDER[: API_GROUP_ORDER.index(group)]) for group in API_GROUP_ORDER}


def api_group_violations() -> list[str]:
    found = []
    for path in _sources():
        parts = path.relative_to(PACKAGE).parts
        if parts[0] != "api":
            continue
        if len(parts) < 3 or parts[1] not in API_GROUPS:
            if parts != ("api", "__init__.py"):
                found.append(f"{path.relative_to(PACKAGE.parent)}: in no group of api/ (add it to API_GROUPS and docs/architecture.md)")
            continue
        forbidden = API_GROUPS_KEPT_APART[parts[1]]
        for line, imported in _imports(path):
            names = imported.split(".")
            if names[:2] == ["queue_service", "api"] and len(names) > 2 and names[2] in forbidden:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {parts[1]} may not import {imported}")
    return found


def test_the_edge_groups_keep_apart() -> None:
    assert api_group_violations() == []


def test_the_group_scan_catches_a_servicer_that_knows_the_road(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    servicers = tmp_path / "queue_service" / "api" / "servicers"
    servicers.mkdir(parents=True)
    (servicers / "bad.py").write_text("from queue_service.api.road.road import CallRoad\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", tmp_path / "queue_service")
    assert api_group_violations() == ["queue_service/api/servicers/bad.py:1: servicers may not import queue_service.api.road.road"]


def test_the_edge_groups_import_one_way() -> None:
    """No two groups of the edge import each other: each pair has one direction."""
    assert API_GROUPS_KEPT_APART == {
        "listeners": set(),
        "road": {"listeners"},
        "access": {"listeners", "road"},
        "servicers": {"listeners", "road", "access"},
    }


def test_the_group_scan_catches_a_servicer_that_knows_access(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    servicers = tmp_path / "queue_service" / "api" / "servicers"
    servicers.mkdir(parents=True)
    (servicers / "bad.py").write_text("from queue_service.api.access.auth import Caller\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", tmp_path / "queue_service")
    assert api_group_violations() == ["queue_service/api/servicers/bad.py:1: servicers may not import queue_service.api.access.auth"]


@pytest.mark.parametrize(
    ("room", "source", "expected"),
    [
        ("api", "from queue_service.store import Store\n", "api may not import queue_service.store"),
        ("engine", "import grpc\n", "engine may not import grpc"),
        ("model", "from queue_service import errors\n", "model may not import queue_service.errors"),
        ("engine", "from queue_service.api import convert\n", "engine may not import queue_service.api"),
    ],
)
def test_the_scan_catches_a_broken_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: str, source: str, expected: str) -> None:
    package = tmp_path / "queue_service"
    (package / room).mkdir(parents=True) if room in ("api", "engine") else package.mkdir(parents=True)
    target = package / room / "bad.py" if room in ("api", "engine") else package / f"{room}.py"
    target.write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", package)
    assert any(expected in line for line in violations())
