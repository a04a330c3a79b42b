"""The one road from a domain error to a gRPC status.

A `QueueError` becomes its code plus `google.rpc.ErrorInfo` (and `BadRequest` when it lists
field violations). Anything else is a bug: INTERNAL, logged with the trace id, never dressed up
as a plausible code.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace

from queue_service.errors import ERROR_DOMAIN, QueueError

log = logging.getLogger(__name__)


def status_for(error: QueueError) -> grpc.Status:
    details = []
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN, metadata=error.metadata)
    details.append(info)
    if error.field_violations:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=field, description=description)
                    for field, description in error.field_violations
                ]
            )
        )
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    proto = status_pb2.Status(code=error.code.value[0], message=error.message, details=packed)
    return rpc_status.to_status(proto)


def _internal_status(method: str) -> grpc.Status:
    trace_id = format(trace.get_current_span().get_span_context().trace_id, "032x")
    log.exception("unexpected error in %s", method, extra={"trace_id": trace_id})
    info = error_details_pb2.ErrorInfo(reason="INTERNAL", domain=ERROR_DOMAIN, metadata={"traceId": trace_id})
    holder = any_pb2.Any()
    holder.Pack(info)
    proto = status_pb2.Status(code=code_pb2.INTERNAL, message=f"internal error (trace {trace_id})", details=[holder])
    return rpc_status.to_status(proto)


Authorize = Callable[[str, grpc.aio.ServicerContext], Awaitable[None]]


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps domain errors raised by any handler to statuses with rich details.

    `authorize`, when given, runs first inside the same road, so UNAUTHENTICATED and
    PERMISSION_DENIED carry an ErrorInfo like every other error.
    """

    def __init__(self, authorize: Authorize | None = None) -> None:
        self._authorize = authorize

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, method, self._authorize))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, method, self._authorize))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=_wrap_unary(handler.stream_unary, method, self._authorize))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=_wrap_stream(handler.stream_stream, method, self._authorize))
        return handler


def _wrap_unary(behavior: Callable[..., Any], method: str, authorize: Authorize | None) -> Callable[..., Any]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if authorize is not None:
                await authorize(method, context)
            return await behavior(request, context)
        except QueueError as error:
            await context.abort_with_status(status_for(error))
        except (grpc.aio.AbortError, GeneratorExit):
            raise
        except Exception:
            await context.abort_with_status(_internal_status(method))

    return wrapped


def _wrap_stream(behavior: Callable[..., AsyncIterator[Any]], method: str, authorize: Authorize | None) -> Callable[..., Any]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            if authorize is not None:
                await authorize(method, context)
            async for message in behavior(request, context):
                yield message
        except QueueError as error:
            await context.abort_with_status(status_for(error))
        except (grpc.aio.AbortError, GeneratorExit):
            raise
        except Exception:
            await context.abort_with_status(_internal_status(method))

    return wrapped
