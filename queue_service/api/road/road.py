"""The one road every call takes into the servicers, whichever listener it came in on.

The gRPC listener (`interceptor`) and the browser endpoint (`web_road`, for Connect and gRPC-Web)
only adapt their transport to it: what the caller's credentials are, how much of its deadline is
left, how a refusal is answered, when the request is in. Everything else is written here once,
in this order:

1. the caller's deadline becomes the call's budget (`deadline`), so every wait inside the call
   gives up, with the reason of the wait, before the caller does;
2. the call is marked as its caller's work (`audit`);
3. authorization from the credentials alone (`auth`), before the gate, so a caller without a
   valid token neither waits for nor takes a slot of those who have one (and, on the browser
   endpoint, is refused before its body is read);
4. the gate (`gate`), entered with `turn` once the request has been read (gRPC reads it before
   the handler runs; the browser endpoint after step 3): the drain, the replica's turns and the
   caller's share of them (unary calls, streams, WatchOverview streams; each request of a
   bidirectional stream, server reflection's, in a unary turn of its own: `each_in_a_turn`). A request whose body is slow to arrive takes no slot
   while it arrives, and one caller cannot take every slot: its share is keyed by the caller
   authorization identified (`<role>:<name>`; with authentication off only the replica's cap applies);
5. the checks that need the request message (`check`: the per-user assertions);
6. domain errors become a status with ErrorInfo and BadRequest details (`status`), recorded on the
   call's server span as a status code and a reason, not a stack trace (`call_spans`);
7. an answer later than the caller's deadline is logged: the caller heard DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from google.rpc import status_pb2

from queue_service import audit, deadline
from queue_service.api.access.auth import CallCredentialsSource
from queue_service.api.access.stream_credentials import while_authorized
from queue_service.api.road.call_spans import record_outcome
from queue_service.api.road.gate import CallGate, EachInATurn
from queue_service.api.road.status import code_for, internal_status_proto, status_proto_for
from queue_service.errors import QueueError

log = logging.getLogger(__name__)

Authorize = Callable[[str, CallCredentialsSource], Awaitable[None]]
# A check that needs the request message (authorization runs before it is read): the per-user
# assertions of `user_assertions`. Raises a QueueError to refuse the call.
CheckRequest = Callable[[str, Any, CallCredentialsSource], None]


_Message = TypeVar("_Message")


class Transport(Protocol):
    """What the road needs from the listener a call came in on."""

    # Errors the transport answers by itself (a handler's own abort, the library's refusal of a
    # malformed request): they pass the road unchanged, their outcome recorded by `record_own`.
    own_errors: tuple[type[Exception], ...]

    def record_own(self, error: Exception) -> None: ...

    async def refuse(self, status: status_pb2.Status) -> NoReturn:
        """Answers the call with `status` (raises the transport's way of doing so)."""
        ...


class CallRoad:
    """Budget, actor, authorization, gate, request checks, error mapping, span outcome and the
    late-answer log around one call (see the module docstring for why in this order): a transport
    runs the call in `call`, and in it, once the request is in, `turn` around the checks and the
    handler."""

    def __init__(self, authorize: Authorize | None = None, gate: CallGate | None = None, check_request: CheckRequest | None = None) -> None:
        self._authorize = authorize
        self._gate = gate or CallGate()
        self._check_request = check_request

    @asynccontextmanager
    async def call(
        self, method: str, credentials: CallCredentialsSource, time_remaining: float | None, transport: Transport
    ) -> AsyncIterator[None]:
        """The road around one call, unary or streaming; the request is read and the handler runs
        (in `turn`) in the block."""
        started = time.monotonic()
        deadline.loop_lag.note_call()
        try:
            with deadline.call_budget(time_remaining), audit.acting_for_call():
                if self._authorize is not None:
                    await self._authorize(method, credentials)
                yield
        except QueueError as error:
            record_outcome(code_for(error), error.reason, error.message, error)
            await transport.refuse(status_proto_for(error))
        except transport.own_errors as error:
            transport.record_own(error)
            raise
        except GeneratorExit:
            raise
        except Exception as unexpected:
            status = internal_status_proto(method)
            record_outcome(grpc.StatusCode.INTERNAL, "INTERNAL", status.message, unexpected)
            await transport.refuse(status)
        finally:
            took = time.monotonic() - started
            if time_remaining is not None and took > time_remaining:
                # The caller heard DEADLINE_EXCEEDED, not our answer: a sign of an overloaded replica.
                log.warning("%s answered after the caller's deadline (%.3fs left at the start, took %.3fs)", method, time_remaining, took)

    def turn(self, method: str, peer: str, *, unary: bool) -> AbstractAsyncContextManager[None]:
        """The call's turn at the gate (step 4), taken inside `call` once its request is in and held
        for the block; `peer` names the caller's connection, its key when no caller was identified."""
        return _Turn(self._gate, method, peer, unary)

    def each_in_a_turn(self, requests: AsyncIterator[_Message], peer: str) -> EachInATurn[_Message]:
        """A bidirectional stream's requests (server reflection's), each worked on in a unary turn of
        its caller's share (`CallGate.each_in_a_turn`); call inside `turn`."""
        return self._gate.each_in_a_turn(requests, _gate_key(peer))

    def check(self, method: str, request: Any, credentials: CallCredentialsSource) -> None:
        """The checks that need the request message; call inside `call`, before the handler."""
        if self._check_request is not None:
            self._check_request(method, request, credentials)

    def while_authorized(
        self, method: str, request: Any, credentials: CallCredentialsSource, messages: AsyncIterator[_Message]
    ) -> AsyncIterator[_Message]:
        """A stream's messages for as long as its credentials hold (`stream_credentials`): the
        checks of its opening run again while it is open, and the first that fails ends it."""
        if self._authorize is None:
            return messages

        async def recheck() -> None:
            if self._authorize is not None:
                await self._authorize(method, credentials)
            self.check(method, request, credentials)

        return while_authorized(method, messages, recheck)


class _Turn:
    """`CallRoad.turn`'s block: a class, not a generator, as every call enters one."""

    __slots__ = ("_gate", "_method", "_peer", "_unary", "_turn")

    def __init__(self, gate: CallGate, method: str, peer: str, unary: bool) -> None:
        self._gate, self._method, self._peer, self._unary = gate, method, peer, unary

    async def __aenter__(self) -> None:
        self._turn = await self._gate.enter(self._method, unary=self._unary, caller=_gate_key(self._peer))

    async def __aexit__(self, *exc_info: object) -> None:
        if self._turn is not None:
            self._turn.leave()


def _gate_key(peer: str) -> str:
    """Whose share of the gate a call takes: the caller authorization identified; "" (the replica's
    cap alone) with authentication off, where no caller can be told apart: a connection is not one
    (a flooding client opens more, and a trusted web backend's one channel would be throttled),
    nor is a host (behind a proxy, or on a loopback `dev` replica, every caller comes from one)."""
    del peer  # kept in the signature: the transport's name for the connection, should a key need it
    actor = audit.current_caller()
    if actor is None or actor == audit.ANONYMOUS:
        return ""
    return actor
