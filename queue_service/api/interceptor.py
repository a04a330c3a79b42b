"""The gRPC road every call takes: the gate, authorization, the caller's deadline as the call's
budget, and the mapping of domain errors to statuses (`status`)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar, cast

import grpc

from queue_service import audit, deadline
from queue_service.api.auth import CallCredentialsSource
from queue_service.api.call_spans import aborts_stay_inside, record_handler_abort, record_outcome
from queue_service.api.gate import CallGate
from queue_service.api.stream_credentials import while_authorized
from queue_service.api.status import internal_status, status_for
from queue_service.errors import QueueError

log = logging.getLogger(__name__)


Authorize = Callable[[str, grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class _MethodHandlerTuple(Protocol):
    """grpc builds every method handler as a namedtuple (`grpc.*_rpc_method_handler`); the type
    stubs declare only the abstract `grpc.RpcMethodHandler`, without the namedtuple's `_replace`."""

    def _replace(self, **behavior: Callable[..., Any]) -> grpc.RpcMethodHandler[Any, Any]: ...


def _with_behavior(handler: grpc.RpcMethodHandler[_Request, _Response], **behavior: Callable[..., Any]) -> grpc.RpcMethodHandler[_Request, _Response]:
    return cast(_MethodHandlerTuple, handler)._replace(**behavior)
# A check that needs the request message (authorization runs before it is read): the per-user
# assertions of `user_assertions`. Raises a QueueError to refuse the call.
CheckRequest = Callable[[str, Any, CallCredentialsSource], None]


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps domain errors raised by any handler to statuses with rich details.

    The gate and `authorize`, when given, run first inside the same road, so SHUTTING_DOWN,
    UNAUTHENTICATED and PERMISSION_DENIED carry an ErrorInfo like every other error;
    `check_request`, when given, runs on the request message before the handler does.
    """

    def __init__(self, authorize: Authorize | None = None, gate: CallGate | None = None, check_request: CheckRequest | None = None) -> None:
        self._authorize = authorize
        self._gate = gate or CallGate()
        self._check_request = check_request

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
            return _with_behavior(handler, stream_stream=self._wrap_stream(handler.stream_stream, method))
        return handler

    @asynccontextmanager
    async def _road(self, method: str, context: grpc.aio.ServicerContext[Any, Any], *, unary: bool) -> AsyncIterator[None]:
        """Gate, authorization and error mapping around one call, unary or streaming."""
        entered = False
        time_remaining = context.time_remaining()
        started = time.monotonic()
        try:
            # Every wait inside the call, its turn at the gate included, is bounded by the
            # caller's deadline (see `deadline`); credits it moves record its caller (`audit`).
            with deadline.call_budget(time_remaining), audit.acting_for_call():
                entered = await self._gate.enter(method, unary=unary)
                if self._authorize is not None:
                    await self._authorize(method, context)
                yield
        # The server span records a refusal's status and reason, not a stack trace (`call_spans`).
        except QueueError as error:
            status = status_for(error)
            record_outcome(status.code, error.reason, error.message, error)
            await context.abort_with_status(status)
        except grpc.aio.AbortError:
            record_handler_abort(context)
            raise
        except GeneratorExit:
            raise
        except Exception as unexpected:
            status = internal_status(method)
            record_outcome(status.code, "INTERNAL", status.details, unexpected)
            await context.abort_with_status(status)
        finally:
            if entered:
                self._gate.exit(unary=unary)
            if time_remaining is not None and time.monotonic() - started > time_remaining:
                # The caller heard DEADLINE_EXCEEDED, not our answer: a sign of an overloaded replica.
                log.warning(
                    "%s answered after the caller's deadline (%.3fs left at the start, took %.3fs)",
                    method, time_remaining, time.monotonic() - started,
                )

    # grpc.aio's behaviors are coroutines and async generators, but the stubs type a handler's
    # behaviors as the sync server's (returning a message or an Iterator): hence Callable[..., Any].
    def _wrap_unary(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with aborts_stay_inside():
                async with self._road(method, context, unary=True):
                    if self._check_request is not None:
                        self._check_request(method, request, context)
                    return await behavior(request, context)

        return wrapped

    def _wrap_stream(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            with aborts_stay_inside():
                async with self._road(method, context, unary=False):
                    if self._check_request is not None:
                        self._check_request(method, request, context)
                    messages = behavior(request, context)
                    if self._authorize is not None:
                        messages = while_authorized(method, messages, lambda: self._recheck(method, request, context))
                    async for message in messages:
                        yield message

        return wrapped

    async def _recheck(self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """An open stream's credentials, checked again as at its opening (`stream_credentials`)."""
        if self._authorize is not None:
            await self._authorize(method, context)
        if self._check_request is not None:
            self._check_request(method, request, context)
