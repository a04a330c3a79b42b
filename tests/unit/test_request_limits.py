"""The browser endpoint's body limits (`api/road/request_limits.py`): every request field has one, and
the longest valid request fits under its method's bound however JSON spells it."""

from __future__ import annotations

import json

import pytest
from google.protobuf import descriptor_pool, json_format

from queue_service._gen.acurio.queue.v1 import (  # noqa: F401 (registers every service's descriptors)
    core_callback_service_pb2,
    credits_service_pb2,
    job_pb2,
    operator_service_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2 as queue_pb2,
)
from queue_service.api.road.request_limits import check_repeated, largest_json_bytes
from queue_service.api.servicers import validation
from queue_service.errors import InvalidRequest

SERVICES = ("AnalysisQueueService", "CoreCallbackService", "CreditsService", "OperatorService")


def test_every_request_of_the_contract_has_a_bound() -> None:
    for name in SERVICES:
        for method in descriptor_pool.Default().FindServiceByName(f"acurio.queue.v1.{name}").methods:
            assert 0 < largest_json_bytes(method.input_type) < 64 * 1024 * 1024, method.full_name


def test_the_longest_valid_get_job_fits_even_with_every_character_escaped() -> None:
    request = queue_pb2.GetJobRequest(job_id="1" * validation.MAX_UUID_CHARS, user_id="\U0001f600" * validation.MAX_ID_CHARS)
    escaped = json.dumps(json_format.MessageToDict(request), indent=8, ensure_ascii=True).encode()
    assert len(escaped) <= largest_json_bytes(queue_pb2.GetJobRequest.DESCRIPTOR)


def test_the_longest_valid_list_jobs_fits() -> None:
    request = queue_pb2.ListJobsRequest(
        user_id="u" * validation.MAX_ID_CHARS,
        page_size=validation.MAX_PAGE_SIZE,
        page_token="t" * 300,
        statuses=[job_pb2.JOB_STATUS_SUCCEEDED] * 16,
    )
    text = json.dumps(json_format.MessageToDict(request), indent=2).encode()
    assert len(text) <= largest_json_bytes(queue_pb2.ListJobsRequest.DESCRIPTOR)


def test_lists_longer_than_validation_allows_are_named() -> None:
    check_repeated(queue_pb2.AdmitRequest.DESCRIPTOR, {"sources": [{"doi": "10.1/a"}] * validation.MAX_SOURCES})
    with pytest.raises(InvalidRequest) as raised:
        check_repeated(queue_pb2.AdmitRequest.DESCRIPTOR, {"sources": [{}] * (validation.MAX_SOURCES + 1)})
    assert raised.value.field_violations == [("sources", "sources lists 1001 entries; at most 1000 are allowed")]
    with pytest.raises(InvalidRequest):
        check_repeated(queue_pb2.ListJobsRequest.DESCRIPTOR, {"statuses": ["JOB_STATUS_QUEUED"] * 17})


def test_every_connect_code_maps_to_a_grpc_code_and_back() -> None:
    """A client that disconnects ends its call CANCELED (gRPC spells it CANCELLED): the road
    records it like any other code."""
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError
    from google.rpc import status_pb2

    from queue_service.api.road.web_road import GRPC_CODE_OF, _ConnectTransport, connect_error

    for code in Code:
        _ConnectTransport().record_own(ConnectError(code, "x"))
        assert connect_error(status_pb2.Status(code=GRPC_CODE_OF[code].value[0], message="x")).code is code
