"""The gRPC road every call takes: the gate, authorization, the caller's deadline as the call's
budget, and the mapping of domain errors to statuses (`status`)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc

from queue_service import audit, deadline
from queue_service.api.gate import CallGate
from queue_service.api.status import internal_status, status_for
from queue_service.errors import QueueError

log = logging.getLogger(__name__)


Authorize = Callable[[str, grpc.aio.ServicerContext], Awaitable[None]]


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps domain errors raised by any handler to statuses with rich details.

    The gate and `authorize`, when given, run first inside the same road, so SHUTTING_DOWN,
    UNAUTHENTICATED and PERMISSION_DENIED carry an ErrorInfo like every other error.
    """

    def __init__(self, authorize: Authorize | None = None, gate: CallGate | None = None) -> None:
        self._authorize = authorize
        self._gate = gate or CallGate()

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
            return handler._replace(unary_unary=self._wrap_unary(handler.unary_unary, method))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._wrap_stream(handler.unary_stream, method))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=self._wrap_unary(handler.stream_unary, method))
        if handler.stream_stream is not None:
            return handler._replace(stream_stream=self._wrap_stream(handler.stream_stream, method))
        return handler

    @asynccontextmanager
    async def _road(self, method: str, context: grpc.aio.ServicerContext, *, unary: bool) -> AsyncIterator[None]:
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
        except QueueError as error:
            await context.abort_with_status(status_for(error))
        except (grpc.aio.AbortError, GeneratorExit):
            raise
        except Exception:
            await context.abort_with_status(internal_status(method))
        finally:
            if entered:
                self._gate.exit(unary=unary)
            if time_remaining is not None and time.monotonic() - started > time_remaining:
                # The caller heard DEADLINE_EXCEEDED, not our answer: a sign of an overloaded replica.
                log.warning(
                    "%s answered after the caller's deadline (%.3fs left at the start, took %.3fs)",
                    method, time_remaining, time.monotonic() - started,
                )

    def _wrap_unary(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with self._road(method, context, unary=True):
                return await behavior(request, context)

        return wrapped

    def _wrap_stream(self, behavior: Callable[..., AsyncIterator[Any]], method: str) -> Callable[..., Any]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with self._road(method, context, unary=False):
                async for message in behavior(request, context):
                    yield message

        return wrapped
