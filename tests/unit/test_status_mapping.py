"""From domain errors to gRPC statuses: every error has a code, the table is the one the contract
documents, and a status carries ErrorInfo, RetryInfo and BadRequest as the error says."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

from queue_service import errors
from queue_service.api.road import status

ROOT = Path(__file__).resolve().parents[2]
QUEUE_PROTO = ROOT / "protos" / "acurio" / "queue" / "v1" / "queue_service.proto"

ERROR_CLASSES = [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, errors.QueueError)]


def details_of(proto: status_pb2.Status) -> dict[str, object]:
    found: dict[str, object] = {}
    for detail in proto.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo, error_details_pb2.BadRequest):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                assert kind.__name__ not in found, f"two {kind.__name__} details"
                found[kind.__name__] = message
    assert len(found) == len(proto.details), "a detail of an unexpected type"
    return found


def test_every_error_class_has_a_code_and_every_code_an_error_class() -> None:
    assert len(ERROR_CLASSES) > 20
    reasons = {cls.reason for cls in ERROR_CLASSES}
    assert reasons == set(status.CODE_OF_REASON)
    # One class per reason (the root type and Internal share INTERNAL).
    named = [cls.reason for cls in ERROR_CLASSES if cls is not errors.QueueError]
    assert len(named) == len(set(named))


def documented_reasons() -> dict[str, tuple[str, float | None]]:
    """reason -> (code, RetryInfo seconds) as the service comment in the contract lists them."""
    text = QUEUE_PROTO.read_text()
    block = text[: text.index("service AnalysisQueueService")]
    comment = "\n".join(line.removeprefix("//").strip() for line in block.splitlines() if line.startswith("//"))
    entries = re.split(r"\n- |; (?=[A-Z_]+ `)", comment)
    documented = {}
    for entry in entries:
        match = re.match(r"([A-Z_]+) `([A-Z_]+)`", entry)
        if match:
            delay = re.search(r"RetryInfo ([\d.]+) s", entry)
            documented[match.group(2)] = (match.group(1), float(delay.group(1)) if delay else None)
    return documented


@pytest.mark.parametrize("error_class", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_answers_the_code_and_retry_delay_the_contract_documents(error_class: type[errors.QueueError]) -> None:
    documented = documented_reasons()
    assert error_class.reason in documented, f"{error_class.reason} is not in the comment of {QUEUE_PROTO.name}"
    code, delay = documented[error_class.reason]
    error = error_class("message")
    assert status.code_for(error).name == code
    assert error.retry_delay_seconds == delay


def test_a_status_carries_the_code_message_and_error_info() -> None:
    error = errors.InsufficientCredits("balance 0 < price 1", metadata={"balance": "0", "required": "1"})
    proto = status.status_proto_for(error)
    assert proto.code == code_pb2.FAILED_PRECONDITION and proto.message == "balance 0 < price 1"
    details = details_of(proto)
    assert set(details) == {"ErrorInfo"}
    info = details["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "INSUFFICIENT_CREDITS",
        "queue.acurio.app",
        {"balance": "0", "required": "1"},
    )


@pytest.mark.parametrize(
    ("error", "millis"),
    [(errors.Conflict("lost a race"), 50), (errors.CoreUnavailable("no answer"), 1000), (errors.LockTimeout("busy"), 200)],
)
def test_a_retryable_error_carries_its_delay_as_retry_info(error: errors.QueueError, millis: int) -> None:
    retry = details_of(status.status_proto_for(error))["RetryInfo"]
    assert isinstance(retry, error_details_pb2.RetryInfo)
    assert retry.retry_delay.ToMilliseconds() == millis


def test_field_violations_become_a_bad_request_in_order() -> None:
    error = errors.InvalidRequest("invalid request: user_id, sources", field_violations=[("user_id", "required"), ("sources", "empty")])
    proto = status.status_proto_for(error)
    assert proto.code == code_pb2.INVALID_ARGUMENT
    bad = details_of(proto)["BadRequest"]
    assert isinstance(bad, error_details_pb2.BadRequest)
    assert [(v.field, v.description) for v in bad.field_violations] == [("user_id", "required"), ("sources", "empty")]
    assert "RetryInfo" not in details_of(proto)


def test_a_reason_missing_from_the_table_is_internal() -> None:
    class Unmapped(errors.QueueError):
        reason = "SOMETHING_NEW"

    error = Unmapped("a new error nobody mapped")
    assert status.code_for(error) is grpc.StatusCode.INTERNAL
    proto = status.status_proto_for(error)
    assert proto.code == code_pb2.INTERNAL
    info = details_of(proto)["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo) and info.reason == "SOMETHING_NEW"


def test_the_grpc_status_carries_the_same_details_in_its_trailer() -> None:
    error = errors.JobNotFound("no job 1", metadata={"jobId": "1"})
    answer = status.status_for(error)
    assert answer.code is grpc.StatusCode.NOT_FOUND and answer.details == "no job 1"
    trailer = dict(answer.trailing_metadata)["grpc-status-details-bin"]
    assert status_pb2.Status.FromString(trailer) == status.status_proto_for(error)


def test_an_unexpected_exception_is_internal_with_a_trace_id_and_nothing_of_the_exception() -> None:
    try:
        raise RuntimeError("secret detail of a bug")
    except RuntimeError:
        proto = status.internal_status_proto("/acurio.queue.v1.AnalysisQueueService/Admit")
    assert proto.code == code_pb2.INTERNAL
    assert "secret" not in proto.message
    info = details_of(proto)["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert info.reason == "INTERNAL" and re.fullmatch(r"[0-9a-f]{32}", info.metadata["traceId"])
    assert info.metadata["traceId"] in proto.message
