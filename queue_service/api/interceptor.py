"""The one road from a domain error to a gRPC status.

A `QueueError` becomes its code plus `google.rpc.ErrorInfo` (and `BadRequest` when it lists
field violations). Anything else is a bug: INTERNAL, logged with the trace id, never dressed up
as a plausible code.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace

from queue_service import deadline
from queue_service.errors import ERROR_DOMAIN, QueueError, ReplicaBusy, ShuttingDown

log = logging.getLogger(__name__)


def status_for(error: QueueError) -> grpc.Status:
    return rpc_status.to_status(status_proto_for(error))


def status_proto_for(error: QueueError) -> status_pb2.Status:
    """The google.rpc.Status of a domain error: its code, message, ErrorInfo and BadRequest
    (shared by gRPC and the browser endpoint, so both carry the same details)."""
    details = []
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
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    return status_pb2.Status(code=error.code.value[0], message=error.message, details=packed)


def _internal_status(method: str) -> grpc.Status:
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


Authorize = Callable[[str, grpc.aio.ServicerContext], Awaitable[None]]

_ALWAYS_OPEN = "/grpc.health.v1.Health/"


class CallGate:
    """Counts calls in flight; refuses new ones with UNAVAILABLE once closed for a drain; lets at
    most `max_unary` unary calls work at once, the others waiting their turn in order.

    Refusing in our own handler (rather than letting the server shut down under a call that is
    just arriving) gives late callers a clean UNAVAILABLE they can retry on another replica.

    The cap keeps an overloaded replica's event loop responsive: without it, every call shares
    the CPU with every other until all of them miss their deadlines. A waiting call costs nothing,
    and waits no longer than half of what is left of its deadline (else `max_wait`): then it hears
    REPLICA_BUSY, in time to retry on another replica. Streams have caps of their own. A drain waits
    for the waiting calls too: each is refused with SHUTTING_DOWN when its turn comes.
    """

    def __init__(self, max_unary: int = 1_000_000, max_wait: float = 5.0) -> None:
        self.in_flight = 0
        self._max_unary = max_unary
        self._max_wait = max_wait
        self._unary_slots = asyncio.Semaphore(max_unary)
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    async def enter(self, method: str, *, unary: bool = True) -> bool:
        """Admits the call (True: counted, call `exit`), or raises SHUTTING_DOWN / REPLICA_BUSY."""
        if method.startswith(_ALWAYS_OPEN):
            return False
        if self._closed:
            raise ShuttingDown("this replica is draining; retry on another replica")
        # Counted from here, so a drain also waits for calls waiting their turn.
        self.in_flight += 1
        self._idle.clear()
        if unary:
            try:
                await self._take_unary_slot()
            except BaseException:
                self._leave()
                raise
            if self._closed:
                self._unary_slots.release()
                self._leave()
                raise ShuttingDown("this replica is draining; retry on another replica")
        return True

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def _take_unary_slot(self) -> None:
        # At most half of what is left: a call refused then still has time to retry elsewhere, even
        # from a replica whose event loop is running late.
        if not await deadline.acquire(self._unary_slots, limit=self._max_wait, share=0.5):
            raise ReplicaBusy(
                f"this replica is working on {self._max_unary} calls (the maximum) and had no turn for this one "
                "within its deadline; retry, ideally on another replica",
                metadata={"maxConcurrentCalls": str(self._max_unary)},
            )

    def exit(self, *, unary: bool = True) -> None:
        if unary:
            self._unary_slots.release()
        self._leave()

    def close(self) -> None:
        self._closed = True

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


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
            # caller's deadline (see `deadline`).
            with deadline.call_budget(time_remaining):
                entered = await self._gate.enter(method, unary=unary)
                if self._authorize is not None:
                    await self._authorize(method, context)
                yield
        except QueueError as error:
            await context.abort_with_status(status_for(error))
        except (grpc.aio.AbortError, GeneratorExit):
            raise
        except Exception:
            await context.abort_with_status(_internal_status(method))
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
