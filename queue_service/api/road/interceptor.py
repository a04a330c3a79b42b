"""The gRPC listener's adapter to the road every call takes (`road`): it reads the caller's
credentials and deadline from the grpc.aio context and answers refusals with `abort_with_status`.
grpcio has read a request message before the handler runs, so the call takes its turn at the gate
at once. A bidirectional stream (server reflection; the contract has none) takes a stream's turn
and then a unary turn for each request it reads."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeVar, cast

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from queue_service.api.road.call_spans import aborts_stay_inside, record_handler_abort
from queue_service.api.road.road import CallRoad

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class _MethodHandlerTuple(Protocol):
    """grpc builds every method handler as a namedtuple (`grpc.*_rpc_method_handler`); the type
    stubs declare only the abstract `grpc.RpcMethodHandler`, without the namedtuple's `_replace`."""

    def _replace(self, **behavior: Callable[..., Any]) -> grpc.RpcMethodHandler[Any, Any]: ...


def _with_behavior(
    handler: grpc.RpcMethodHandler[_Request, _Response], **behavior: Callable[..., Any]
) -> grpc.RpcMethodHandler[_Request, _Response]:
    return cast(_MethodHandlerTuple, handler)._replace(**behavior)


class _GrpcTransport:
    """How the road answers on the gRPC listener: `abort_with_status`; a handler's own abort
    (health's NOT_FOUND for an unknown service) passes with its code recorded on the span."""

    own_errors: tuple[type[Exception], ...] = (grpc.aio.AbortError,)

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._context = context

    def record_own(self, error: Exception) -> None:
        record_handler_abort(self._context)

    async def refuse(self, status: status_pb2.Status) -> NoReturn:
        await self._context.abort_with_status(rpc_status.to_status(status))
        raise AssertionError("abort_with_status returned")  # it always raises AbortError


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Runs every gRPC call through the road (`road.CallRoad`, shared with the browser endpoint),
    so SHUTTING_DOWN, UNAUTHENTICATED and PERMISSION_DENIED carry an ErrorInfo like every other
    error and the request checks run on the request message before the handler does."""

    def __init__(self, road: CallRoad) -> None:
        self._road = road

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Request, _Response] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Request, _Response] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return _with_behavior(handler, unary_unary=self._wrap_unary(handler.unary_unary, method))
        if handler.unary_stream is not None:
            return _with_behavior(handler, unary_stream=self._wrap_stream(handler.unary_stream, method))
        if handler.stream_unary is not None:
            return _with_behavior(handler, stream_unary=self._wrap_unary(handler.stream_unary, method))
        if handler.stream_stream is not None:
            return _with_behavior(handler, stream_stream=self._wrap_stream(handler.stream_stream, method, requests_streamed=True))
        return handler

    # grpc.aio's behaviors are coroutines and async generators, but the stubs type a handler's
    # behaviors as the sync server's (returning a message or an Iterator): hence Callable[..., Any].
    def _wrap_unary(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with aborts_stay_inside():
                async with (
                    self._road.call(method, context, context.time_remaining(), _GrpcTransport(context)),
                    self._road.turn(method, context.peer(), unary=True),
                ):
                    self._road.check(method, request, context)
                    return await behavior(request, context)

        return wrapped

    def _wrap_stream(self, behavior: Callable[..., Any], method: str, *, requests_streamed: bool = False) -> Callable[..., Any]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            with aborts_stay_inside():
                async with (
                    self._road.call(method, context, context.time_remaining(), _GrpcTransport(context)),
                    self._road.turn(method, context.peer(), unary=False),
                ):
                    self._road.check(method, request, context)
                    if requests_streamed:
                        # Each request (server reflection's) is worked on in a unary turn, given
                        # back as its answer goes out: the stream's turn bounds only how many
                        # such streams a caller holds, not how much work they ask for.
                        requests = self._road.each_in_a_turn(request, context.peer())
                        try:
                            async for message in self._road.while_authorized(method, request, context, behavior(requests, context)):
                                requests.answered()
                                yield message
                        finally:
                            requests.answered()
                        return
                    async for message in self._road.while_authorized(method, request, context, behavior(request, context)):
                        yield message

        return wrapped
