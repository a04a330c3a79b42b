"""What the server span of a refused or failed call records.

OpenTelemetry's gRPC server instrumentation wraps every call in a span and records any exception
that leaves the handler, with its stack trace, as a span event. A refusal leaves as grpc.aio's
AbortError, so every UNAUTHENTICATED or INVALID_ARGUMENT answer (calls anyone who reaches the
port can make) became two events holding a stack trace of our own code, while the span's
`rpc.grpc.status_code` still said 0 (OK): the instrumentation sees only `context.abort`, not the
`abort_with_status` we answer with.

So the interceptor records the outcome on the span itself (the status code and the reason as
attributes) and lets no exception out of the handler after aborting: grpc.aio supports a handler
that swallows its own abort (it re-raises it once the handler returns). Only a failure we did not
foresee (INTERNAL, UNKNOWN, DATA_LOSS) is recorded as an exception event, with the exception that
caused it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

ERROR_REASON_ATTRIBUTE = "queue.error.reason"
# The semantic conventions' attribute, which the instrumentation sets to 0 when the call starts.
STATUS_CODE_ATTRIBUTE = "rpc.grpc.status_code"

# Codes that say the server failed (OpenTelemetry's gRPC semantic conventions mark a server
# span as an error for these); every other code is the caller's affair and leaves the span's
# status unset.
_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
# Codes whose cause is a bug or a broken invariant: the span keeps the exception and its trace.
_UNEXPECTED = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS})


def record_outcome(code: grpc.StatusCode, reason: str, message: str, cause: BaseException | None = None) -> None:
    """Puts a call's final status on the current (server) span; a no-op without tracing."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute(STATUS_CODE_ATTRIBUTE, code.value[0])
    span.set_attribute(ERROR_REASON_ATTRIBUTE, reason)
    if code in _SERVER_FAULTS:
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {message}"))
    if cause is not None and code in _UNEXPECTED:
        span.record_exception(cause)


def aborts_stay_inside() -> contextlib.suppress:
    """Around a handler: its abort (AbortError) does not leave it. grpc.aio keeps the abort and
    raises it itself once the handler has returned, outside the instrumentation's span, so the
    status goes out as before and the span records no exception."""
    return contextlib.suppress(grpc.aio.AbortError)


def record_handler_abort(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    """A handler that aborted by itself (health's NOT_FOUND for an unknown service): its code on
    the span, and the abort kept inside the handler like ours."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        record_outcome(code, code.name, str(context.details() or ""))
