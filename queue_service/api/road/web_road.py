"""The browser endpoint's adapter to the road every call takes (`road`): Connect and gRPC-Web
calls, served by the `connectrpc` library, enter it from their headers, before their body is read,
and take their turn at the gate once the body is in.

The road is entered by a connectrpc metadata interceptor, whose `on_start` runs once the headers
are in and before the library reads or decodes the body, and left in its `on_end`, which receives
whatever the call ended with. So a caller without a valid token is refused before a byte of its
body is read, inflated or parsed; the caller's deadline (`Connect-Timeout-Ms`, or `grpc-timeout`
for gRPC-Web) is the call's budget from the start, reading and decoding included; and the call has
a server span, as the gRPC instrumentation gives a gRPC call, with the same status code and reason
attributes (`call_spans`). The gate's turn (`CallRoad.turn`) is taken by the endpoint function,
which connectrpc calls only once the whole body has been read (bounded in size by the method's
limit and in time by `web_limits`) and decoded: a body that never finishes holds no unary slot.

Each method is its own connectrpc application, whose body limit is the largest valid request of
that method (`request_limits`), and whose JSON codec refuses an overlong list before protobuf's
pure-Python parser builds it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import grpc
from connectrpc.code import Code
from connectrpc.compat import google_protobuf_binary_codec
from connectrpc.errors import ConnectError, ErrorDetail
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message, message_factory
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from google.rpc import error_details_pb2, status_pb2
from opentelemetry import propagate, trace
from protobuf.wkt import Any as AnyDetail

from queue_service import telemetry
from queue_service.api.access.user_assertions import USER_ASSERTION_HEADER
from queue_service.api.road.call_spans import STATUS_CODE_ATTRIBUTE, record_outcome
from queue_service.api.road.request_limits import check_repeated, largest_json_bytes
from queue_service.api.road.road import CallRoad
from queue_service.api.road.status import status_proto_for
from queue_service.errors import QueueError

if TYPE_CHECKING:
    # The two endpoint kinds we build; connectrpc's public `Endpoint` is their common base, but
    # the application is typed to take their union (connectrpc._server_async.Endpoint).
    from connectrpc._server_shared import EndpointServerStream, EndpointUnary

_Message = TypeVar("_Message", bound=message.Message)

PACKAGE = "acurio.queue.v1"
# Same bound as the gRPC listener's (server.MAX_MESSAGE_BYTES): no method reads more.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class _HttpCallContext:
    """What `Authorizer.identify` and the assertion check read from a gRPC context, taken from an
    HTTP request's headers (client certificates are a gRPC-listener feature)."""

    def __init__(self, ctx: RequestContext[Any, Any]) -> None:
        self._metadata = tuple(
            (key, value) for key, value in ctx.request_headers.allitems() if key in ("authorization", USER_ASSERTION_HEADER)
        )

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def connect_error(status: status_pb2.Status) -> ConnectError:
    """The Connect error of a google.rpc.Status, with its details (ErrorInfo, BadRequest …)."""
    details = [ErrorDetail(AnyDetail(type_url=d.type_url, value=d.value)) for d in status.details]
    return ConnectError(_CONNECT_CODE_OF[status.code], status.message, details)


# The two vocabularies agree on every code but the spelling of one: gRPC's CANCELLED.
GRPC_CODE_OF = {code: grpc.StatusCode["CANCELLED" if code is Code.CANCELED else code.name] for code in Code}
_CONNECT_CODE_OF = {grpc_code.value[0]: code for code, grpc_code in GRPC_CODE_OF.items()}


def _reason(error: ConnectError) -> str:
    """The ErrorInfo reason a Connect error carries (ours do), else its code's name."""
    for detail in error.details:
        if detail.type_name == "google.rpc.ErrorInfo":
            return error_details_pb2.ErrorInfo.FromString(detail.message_bytes).reason
    return error.code.name


class _ConnectTransport:
    """How the road answers on the browser endpoint: a ConnectError, which connectrpc writes in the
    caller's protocol. The library's own refusals (a body too large, malformed JSON, the deadline
    passing while the body is read) pass, their code recorded on the span."""

    own_errors: tuple[type[Exception], ...] = (ConnectError,)

    def record_own(self, error: Exception) -> None:
        if isinstance(error, ConnectError):
            record_outcome(GRPC_CODE_OF[error.code], _reason(error), error.message)

    async def refuse(self, status: status_pb2.Status) -> NoReturn:
        raise connect_error(status)


_TRANSPORT = _ConnectTransport()


class _RoadInterceptor:
    """A connectrpc metadata interceptor: enters the road (and the call's server span) from the
    headers, before the body is read, and leaves it with the call's outcome."""

    def __init__(self, road: CallRoad) -> None:
        self._road = road

    async def on_start(self, ctx: RequestContext[Any, Any]) -> AsyncExitStack:
        method = f"/{ctx.method.service_name}/{ctx.method.name}"
        timeout_ms = ctx.timeout_ms
        stack = AsyncExitStack()
        try:
            stack.enter_context(
                trace.use_span(_server_span(method, ctx), end_on_exit=True, record_exception=False, set_status_on_exception=False)
            )
            await stack.enter_async_context(
                self._road.call(
                    method,
                    _HttpCallContext(ctx),
                    None if timeout_ms is None else timeout_ms / 1000,
                    _TRANSPORT,
                )
            )
        except BaseException as refused:
            await stack.__aexit__(type(refused), refused, refused.__traceback__)
            raise
        return stack

    async def on_end(self, stack: AsyncExitStack, ctx: RequestContext[Any, Any], error: Exception | None) -> None:
        # The road maps a domain error to the ConnectError raised from here, which connectrpc
        # answers instead of `error`.
        if error is None:
            await stack.aclose()
        else:
            await stack.__aexit__(type(error), error, error.__traceback__)


def _server_span(method: str, ctx: RequestContext[Any, Any]) -> trace.Span:
    """The call's server span, a child of the caller's trace when it sends `traceparent`."""
    parent = propagate.extract(dict(ctx.request_headers.allitems()))
    service, _, name = method[1:].partition("/")
    return telemetry.tracer.start_span(
        method,
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={"rpc.system": "connect_rpc", "rpc.service": service, "rpc.method": name, STATUS_CODE_ATTRIBUTE: 0},
    )


class _BoundedJsonCodec:
    """Proto JSON, with lists longer than validation allows refused before protobuf parses them
    (`request_limits.check_repeated`); unknown fields are ignored, as connectrpc's codec does."""

    def name(self) -> str:
        return "json"

    def encode(self, value: message.Message) -> bytes:
        return json_format.MessageToJson(value).encode()

    def decode(self, data: bytes | bytearray, message_class: type[_Message]) -> _Message:
        decoded = message_class()
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"the request body is not JSON: {exc}") from None
        try:
            check_repeated(cast(Descriptor, message_class.DESCRIPTOR), parsed)
        except QueueError as error:
            raise connect_error(status_proto_for(error)) from None
        json_format.ParseDict(parsed, decoded, ignore_unknown_fields=True)
        return decoded


class _MethodApplication(ConnectASGIApplication[Mapping[str, Any]]):
    """One method of the contract as a Connect application (so each has its own body limit)."""

    @property
    def path(self) -> str:
        return "/"


def connect_applications(servicers: Mapping[str, Any], road: CallRoad) -> dict[str, _MethodApplication]:
    """A Connect/gRPC-Web application per method of every servicer, by URL path; each calls the
    servicer instance the gRPC server uses, through `road`."""
    applications: dict[str, _MethodApplication] = {}
    interceptor = _RoadInterceptor(road)
    codecs = [google_protobuf_binary_codec(), _BoundedJsonCodec()]
    for service_name, servicer in servicers.items():
        service = descriptor_pool.Default().FindServiceByName(f"{PACKAGE}.{service_name}")
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            endpoint = _endpoint(path, method, getattr(servicer, method.name), road)
            applications[path] = _MethodApplication(
                service=servicers,
                endpoints=lambda _servicers, path=path, endpoint=endpoint: {path: endpoint},  # type: ignore[misc]
                interceptors=[interceptor],
                codecs=codecs,
                read_max_bytes=min(MAX_MESSAGE_BYTES, largest_json_bytes(method.input_type)),
            )
    return applications


def _endpoint(
    path: str, method: MethodDescriptor, handler: Callable[..., Any], road: CallRoad
) -> EndpointUnary[Any, Any] | EndpointServerStream[Any, Any]:
    info = MethodInfo(
        name=method.name,
        service_name=method.containing_service.full_name,
        input=message_factory.GetMessageClass(method.input_type),
        output=message_factory.GetMessageClass(method.output_type),
        idempotency_level=_idempotency(method),
        stream_type=StreamType.SERVER_STREAM if method.server_streaming else StreamType.UNARY,
    )
    if method.server_streaming:
        return Endpoint.server_stream(info, _stream(path, handler, road))
    return Endpoint.unary(info, _unary(path, handler, road))


# The road is entered before the body is read (`_RoadInterceptor`); what remains for the endpoint,
# which runs once the body is in, are the gate's turn, the checks that need the request, and the
# servicer.
def _unary(method: str, handler: Callable[..., Awaitable[Any]], road: CallRoad) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, ctx: RequestContext[Any, Any]) -> Any:
        async with road.turn(method, _peer(ctx), unary=True):
            road.check(method, request, _HttpCallContext(ctx))
            return await handler(request, None)

    return call


def _stream(method: str, handler: Callable[..., AsyncIterator[Any]], road: CallRoad) -> Callable[..., AsyncIterator[Any]]:
    async def call(request: Any, ctx: RequestContext[Any, Any]) -> AsyncIterator[Any]:
        async with road.turn(method, _peer(ctx), unary=False):
            credentials = _HttpCallContext(ctx)
            road.check(method, request, credentials)
            async for response in road.while_authorized(method, request, credentials, handler(request, None)):
                yield response

    return call


def _peer(ctx: RequestContext[Any, Any]) -> str:
    """The caller's connection, as gRPC spells a peer (`CallRoad.turn`'s key without authentication)."""
    return f"http:{ctx.client_address or 'unknown'}"


def _idempotency(method: MethodDescriptor) -> IdempotencyLevel:
    options = descriptor_pb2.MethodOptions()
    options.ParseFromString(method.GetOptions().SerializeToString())
    if options.idempotency_level == descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS:
        return IdempotencyLevel.NO_SIDE_EFFECTS
    if options.idempotency_level == descriptor_pb2.MethodOptions.IDEMPOTENT:
        return IdempotencyLevel.IDEMPOTENT
    return IdempotencyLevel.UNKNOWN
