"""One vocabulary of reasons: the table from reason to status code (`api/road/status.py`) is the
source; every other place that lists reasons (the domain errors, the contract's comment in
`queue_service.proto`, the error table of docs/design.md, the TypeScript client's `QUEUE_REASONS`)
must list the same reasons with the same codes. A reason added in one place and forgotten in
another fails here with its name."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from queue_service import errors
from queue_service.api.road.status import CODE_OF_REASON

ROOT = Path(__file__).resolve().parents[2]
REASON = r"`([A-Z][A-Z_]+)`"
CODE = r"(OK|CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED)"


def _codes() -> dict[str, str]:
    return {reason: code.name for reason, code in CODE_OF_REASON.items()}


def test_every_domain_error_has_a_code() -> None:
    raised = {
        cls.reason
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.QueueError) and cls is not errors.QueueError and "reason" in vars(cls)
    }
    assert raised, "no domain errors found: the scan is broken"
    assert sorted(raised - set(CODE_OF_REASON)) == [], "errors.py raises reasons the status table does not know"
    assert sorted(set(CODE_OF_REASON) - raised) == [], "the status table knows reasons no domain error carries"


def test_the_contract_comment_lists_every_reason_with_its_code() -> None:
    text = (ROOT / "protos/acurio/queue/v1/queue_service.proto").read_text()
    # The service comment before `service AnalysisQueueService` is the catalogue of reasons.
    catalogue = text.split("service AnalysisQueueService", 1)[0]
    listed: dict[str, str] = {}
    for line in catalogue.splitlines():
        match = re.match(rf"^//\s+-\s+{CODE}\s+{REASON}", line)
        if match:
            listed[match.group(2)] = match.group(1)
        # "NOT_FOUND `RUN_NOT_FOUND` (`runId`); FAILED_PRECONDITION `RUN_NOT_RELEASED`": a second pair on one line
        for code, reason in re.findall(rf";\s+{CODE}\s+{REASON}", line):
            listed[reason] = code
    assert listed, "no reason found in the proto comment: the scan is broken"
    assert listed == _codes()


def test_the_design_error_table_lists_every_reason_with_its_code() -> None:
    text = (ROOT / "docs/design.md").read_text()
    listed: dict[str, str] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not re.search(REASON, cells[2]):
            continue
        codes = [code.strip() for code in cells[1].split("/")]
        reasons = re.findall(REASON, cells[2])
        if len(codes) == 1:
            codes = codes * len(reasons)
        assert len(codes) == len(reasons), f"design.md row pairs codes and reasons unevenly: {line}"
        listed.update(zip(reasons, codes, strict=True))
    missing = sorted(set(CODE_OF_REASON) - set(listed) - {"INTERNAL"})
    assert missing == [], "docs/design.md's error table lacks these reasons"
    assert {reason: code for reason, code in listed.items() if reason in CODE_OF_REASON} == {
        reason: code for reason, code in _codes().items() if reason in listed
    }
    assert sorted(set(listed) - set(CODE_OF_REASON)) == [], "docs/design.md names reasons the service never sends"


def test_the_typescript_client_knows_every_reason() -> None:
    text = (ROOT / "clients/typescript/src/reasons.ts").read_text()
    block = re.search(r"QUEUE_REASONS = \[(.*?)\] as const", text, re.S)
    assert block, "QUEUE_REASONS not found in reasons.ts"
    listed = re.findall(r'"([A-Z_]+)"', block.group(1))
    assert len(listed) == len(set(listed)), "QUEUE_REASONS lists a reason twice"
    assert sorted(set(CODE_OF_REASON) - set(listed)) == [], "reasons.ts lacks reasons the service sends"
    assert sorted(set(listed) - set(CODE_OF_REASON)) == [], "reasons.ts names reasons the service never sends"
