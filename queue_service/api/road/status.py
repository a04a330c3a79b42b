"""The table from a domain error's reason to its gRPC status code, and the status it becomes.

A `QueueError` becomes its code plus `google.rpc.ErrorInfo` (its reason, domain and metadata),
`RetryInfo` when it names a delay, `BadRequest` when it lists field violations, and
`QuotaFailure` when it names the quotas it exceeded. Anything else
is a bug: INTERNAL, logged with the trace id, never dressed up as a plausible code. gRPC (the
interceptor) and the browser endpoint (`web`) both answer through here, so both carry the same
details.
"""

from __future__ import annotations

import logging

import grpc
from google.protobuf import any_pb2, message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace

from queue_service.errors import ERROR_DOMAIN, QueueError

log = logging.getLogger(__name__)

# Reasons and their codes are the contract (docs/design.md, "Errors").
CODE_OF_REASON: dict[str, grpc.StatusCode] = {
    "INVALID_REQUEST": grpc.StatusCode.INVALID_ARGUMENT,
    "CORE_REJECTED": grpc.StatusCode.INVALID_ARGUMENT,
    "INSUFFICIENT_CREDITS": grpc.StatusCode.FAILED_PRECONDITION,
    "IDEMPOTENCY_KEY_REUSED": grpc.StatusCode.FAILED_PRECONDITION,
    "DELTA_BASE_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "DELTA_BASE_NOT_FINISHED": grpc.StatusCode.FAILED_PRECONDITION,
    "PROVIDER_BUDGET_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "USER_QUEUE_FULL": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "USER_DELTA_LIMIT": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "USER_FREE_WORK_LIMIT": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "CORE_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "CORE_AT_CAPACITY": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "JOB_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "JOB_NOT_PENDING": grpc.StatusCode.FAILED_PRECONDITION,
    "JOB_NOT_RETRYABLE": grpc.StatusCode.FAILED_PRECONDITION,
    "JOB_INPUTS_PRUNED": grpc.StatusCode.FAILED_PRECONDITION,
    "JOB_ALREADY_FINISHED": grpc.StatusCode.FAILED_PRECONDITION,
    "RUN_NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "RUN_NOT_YET_ADMITTED": grpc.StatusCode.UNAVAILABLE,
    "RUN_NOT_RELEASED": grpc.StatusCode.FAILED_PRECONDITION,
    "TOO_MANY_STREAMS": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "DATABASE_UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "LOCK_TIMEOUT": grpc.StatusCode.UNAVAILABLE,
    "OUTCOME_UNKNOWN": grpc.StatusCode.UNAVAILABLE,
    "CONFLICT": grpc.StatusCode.ABORTED,
    "SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    "REPLICA_BUSY": grpc.StatusCode.UNAVAILABLE,
    "UNAUTHENTICATED": grpc.StatusCode.UNAUTHENTICATED,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "USER_ASSERTION_INVALID": grpc.StatusCode.UNAUTHENTICATED,
    "USER_MISMATCH": grpc.StatusCode.PERMISSION_DENIED,
    "INTERNAL": grpc.StatusCode.INTERNAL,
}


def code_for(error: QueueError) -> grpc.StatusCode:
    """The status code of a domain error; a reason missing from the table is a bug: INTERNAL."""
    return CODE_OF_REASON.get(error.reason, grpc.StatusCode.INTERNAL)


def status_for(error: QueueError) -> grpc.Status:
    return rpc_status.to_status(status_proto_for(error))


def status_proto_for(error: QueueError) -> status_pb2.Status:
    """The google.rpc.Status of a domain error: its code, message, ErrorInfo and BadRequest
    (shared by gRPC and the browser endpoint, so both carry the same details)."""
    details: list[message.Message] = []
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata)
    details.append(info)
    if error.retry_delay_seconds is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromMilliseconds(round(error.retry_delay_seconds * 1000))
        details.append(retry)
    if error.field_violations:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=field, description=description)
                    for field, description in error.field_violations
                ]
            )
        )
    if error.quota_violations:
        details.append(
            error_details_pb2.QuotaFailure(
                violations=[
                    error_details_pb2.QuotaFailure.Violation(subject=subject, description=description)
                    for subject, description in error.quota_violations
                ]
            )
        )
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    return status_pb2.Status(code=code_for(error).value[0], message=error.message, details=packed)


def internal_status(method: str) -> grpc.Status:
    return rpc_status.to_status(internal_status_proto(method))


def internal_status_proto(method: str) -> status_pb2.Status:
    """INTERNAL for an unexpected exception (call from its `except`): logged with the trace id,
    which the caller gets too, and nothing else of the exception."""
    trace_id = format(trace.get_current_span().get_span_context().trace_id, "032x")
    log.exception("unexpected error in %s", method, extra={"trace_id": trace_id})
    info = error_details_pb2.ErrorInfo(reason="INTERNAL", domain=ERROR_DOMAIN, metadata={"traceId": trace_id})
    holder = any_pb2.Any()
    holder.Pack(info)
    return status_pb2.Status(code=code_pb2.INTERNAL, message=f"internal error (trace {trace_id})", details=[holder])
