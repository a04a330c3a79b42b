"""Every table of roles in the docs says what queue_service/api/access/auth.py lets each role call.

A row of such a table starts with the role in backticks (`` | `operator` | ``) and ends with the
methods, written as people read them: `Service.Method`; a service followed by `:` or `(` and the
methods it lists; a bare service name for all of its methods; a bare method name where only one
service has that method. Other words are prose ("any user's job") and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2,
    credits_service_pb2,
    operator_service_pb2,
    queue_service_pb2,
)
from queue_service.api.access.auth import ROLE_METHODS

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ROLE_ROW = re.compile(r"^\|\s*`(\w+)`[^|]*\|.*\|\s*$")
NAME = re.compile(r"\b([A-Z][A-Za-z]+)(?:\.([A-Z][A-Za-z]+))?`?\s*([:(]?)")


def service_methods() -> dict[str, list[str]]:
    """Each service's short name and its methods' paths, from the contract itself."""
    services: dict[str, list[str]] = {}
    for module in (queue_service_pb2, operator_service_pb2, credits_service_pb2, core_callback_service_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            services[service.name] = [f"/{service.full_name}/{m.name}" for m in service.methods]
    return services


SERVICES = service_methods()


def methods_named(cell: str, where: str) -> frozenset[str]:
    paths: set[str] = set()
    for service_or_method, method, opens_list in NAME.findall(cell):
        if service_or_method in SERVICES:
            service = SERVICES[service_or_method]
            if method:
                path = next((p for p in service if p.endswith("/" + method)), None)
                assert path, f"{where}: {service_or_method} has no method {method}"
                paths.add(path)
            elif not opens_list:  # the whole service
                paths.update(service)
            continue
        owners = [p for service in SERVICES.values() for p in service if p.endswith("/" + service_or_method)]
        assert len(owners) <= 1, f"{where}: {service_or_method} is a method of several services; name it as Service.Method"
        paths.update(owners)
    return frozenset(paths)


def role_rows() -> list[tuple[str, str, str]]:
    """(where, role, the row's last cell) of every row that starts with a role."""
    rows = []
    for document in DOCUMENTS:
        for number, line in enumerate(document.read_text().splitlines(), start=1):
            match = ROLE_ROW.match(line)
            if match and match.group(1) in ROLE_METHODS:
                cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
                rows.append((f"{document.relative_to(ROOT)}:{number}", match.group(1), cells[-1]))
    return rows


def test_the_docs_have_role_tables() -> None:
    found = {where.split(":")[0] for where, _, _ in role_rows()}
    assert {"docs/security.md", "docs/operations.md"} <= found


@pytest.mark.parametrize(("where", "role", "cell"), role_rows(), ids=lambda value: str(value)[:40])
def test_each_role_row_names_exactly_the_methods_the_role_may_call(where: str, role: str, cell: str) -> None:
    written = methods_named(cell, where)
    allowed = ROLE_METHODS[role]
    assert written == allowed, (
        f"{where}: the `{role}` row says {cell!r}; it leaves out {sorted(allowed - written)} and adds {sorted(written - allowed)}"
    )


def test_the_reading_of_a_row_follows_how_people_write_it() -> None:
    assert methods_named("`CreditsService` (GrantCredits, GetBalance), Promote", "example") == {
        "/acurio.queue.v1.CreditsService/GrantCredits",
        "/acurio.queue.v1.CreditsService/GetBalance",
        "/acurio.queue.v1.AnalysisQueueService/Promote",
    }
    assert methods_named("`CoreCallbackService.CompleteRun`", "example") == {"/acurio.queue.v1.CoreCallbackService/CompleteRun"}
    assert methods_named("`OperatorService`, CancelJob (any user's job)", "example") == {
        *SERVICES["OperatorService"],
        "/acurio.queue.v1.AnalysisQueueService/CancelJob",
    }
