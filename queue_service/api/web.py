"""The browser endpoint (QUEUE_HTTP_ADDR): the same services over the Connect protocol (and
gRPC-Web), plus the web console's static files, on one HTTP/1.1 and HTTP/2 listener.

Browsers cannot speak gRPC (they cannot read HTTP/2 trailers), so the `connectrpc` library
serves Connect and gRPC-Web as an ASGI application, run by Hypercorn on this replica's event
loop. Its endpoints call the very servicer instances the gRPC server uses, through the same road
as the gRPC interceptor: the gate (`gate`), the `Authorizer` (bearer tokens from the
`authorization` header, so the same roles apply; client certificates are a gRPC-listener
feature), and the same mapping of domain errors to a status with ErrorInfo and BadRequest
details. WatchJobs and WatchOverview stream over HTTP/1.1.

The console (`console_assets/`, built from `console/` and committed) is served at `/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mimetypes
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any

from connectrpc.code import Code
from connectrpc.compat import google_protobuf_codecs
from connectrpc.errors import ConnectError, ErrorDetail
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.rpc import status_pb2
from hypercorn.config import Config as HypercornConfig
from protobuf.wkt import Any as AnyDetail

from queue_service import audit
from queue_service.api.auth import Authorizer
from queue_service.api.interceptor import CheckRequest
from queue_service.api.stream_credentials import while_authorized
from queue_service.api.user_assertions import USER_ASSERTION_HEADER
from queue_service.api import web_limits
from queue_service.config import Config
from queue_service.api.gate import CallGate
from queue_service.api.status import internal_status_proto, status_proto_for
from queue_service.errors import QueueError

if TYPE_CHECKING:
    # The two endpoint kinds we build; connectrpc's public `Endpoint` is their common base, but
    # the application is typed to take their union (connectrpc._server_async.Endpoint).
    from connectrpc._server_shared import EndpointServerStream, EndpointUnary

log = logging.getLogger(__name__)

# Same bound as the gRPC listener's (server.MAX_MESSAGE_BYTES).
_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_CONSOLE_FOLDER = "console_assets"
_PACKAGE = "acurio.queue.v1"
# The console talks only to its own origin; nothing is inlined or fetched from elsewhere.
_SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


class _HttpCallContext:
    """What `Authorizer.identify` reads from a gRPC context, taken from an HTTP request."""

    def __init__(self, ctx: RequestContext[Any, Any]) -> None:
        self._metadata = tuple(
            (key, value) for key, value in ctx.request_headers.allitems() if key in ("authorization", USER_ASSERTION_HEADER)
        )

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}


def _connect_error(status: status_pb2.Status) -> ConnectError:
    details = [ErrorDetail(AnyDetail(type_url=d.type_url, value=d.value)) for d in status.details]
    return ConnectError(Code[_CODE_NAMES[status.code]], status.message, details)


_CODE_NAMES = {
    1: "CANCELED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class _QueueConnectApplication(ConnectASGIApplication[Mapping[str, Any]]):
    """Every service of the contract on one Connect application (endpoints are keyed by path,
    so one application serves them all)."""

    @property
    def path(self) -> str:
        return "/"


class _HypercornConfig(HypercornConfig):
    """Keeps the TLS context Hypercorn makes once at start, so a reload can load a new
    certificate into it."""

    ssl_context: ssl.SSLContext | None = None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        self.ssl_context = super().create_ssl_context()
        return self.ssl_context


class WebEndpoint:
    """Serves Connect/gRPC-Web and the console on `config.http_addr`; `start` returns the port."""

    def __init__(
        self, servicers: Mapping[str, Any], authorizer: Authorizer | None, gate: CallGate, config: Config, check_request: CheckRequest | None = None
    ) -> None:
        self._servicers = servicers
        self._authorize = authorizer.authorize if authorizer is not None else None
        self._check_request = check_request
        self._gate = gate
        self._config = config
        self._connect = _QueueConnectApplication(
            service=servicers,
            endpoints=self._endpoints,
            codecs=google_protobuf_codecs(),
            read_max_bytes=_MAX_MESSAGE_BYTES,
        )
        self._task: asyncio.Task[None] | None = None
        self._hypercorn: _HypercornConfig | None = None
        self._listener: web_limits.BoundedListener | None = None

    # -- the Connect side -----------------------------------------------------------------

    def _endpoints(self, servicers: Mapping[str, Any]) -> dict[str, EndpointUnary[Any, Any] | EndpointServerStream[Any, Any]]:
        endpoints: dict[str, EndpointUnary[Any, Any] | EndpointServerStream[Any, Any]] = {}
        for service_name, servicer in servicers.items():
            service = descriptor_pool.Default().FindServiceByName(f"{_PACKAGE}.{service_name}")
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                info = MethodInfo(
                    name=method.name,
                    service_name=service.full_name,
                    input=message_factory.GetMessageClass(method.input_type),
                    output=message_factory.GetMessageClass(method.output_type),
                    idempotency_level=_idempotency(method),
                    stream_type=StreamType.SERVER_STREAM if method.server_streaming else StreamType.UNARY,
                )
                handler = getattr(servicer, method.name)
                if method.server_streaming:
                    endpoints[path] = Endpoint.server_stream(info, self._stream(path, handler))
                else:
                    endpoints[path] = Endpoint.unary(info, self._unary(path, handler))
        return endpoints

    @asynccontextmanager
    async def _road(self, method: str, ctx: RequestContext[Any, Any], *, unary: bool) -> AsyncIterator[None]:
        """Gate, authorization and error mapping, as `ErrorInterceptor._road` does for gRPC."""
        entered = False
        try:
            with audit.acting_for_call():
                entered = await self._gate.enter(method, unary=unary)
                if self._authorize is not None:
                    await self._authorize(method, _HttpCallContext(ctx))
                yield
        except QueueError as error:
            raise _connect_error(status_proto_for(error)) from None
        except (ConnectError, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception:
            raise _connect_error(internal_status_proto(method)) from None
        finally:
            if entered:
                self._gate.exit(unary=unary)

    def _check(self, method: str, request: Any, ctx: RequestContext[Any, Any]) -> None:
        """The checks that need the request (per-user assertions), as the gRPC interceptor runs them."""
        if self._check_request is not None:
            self._check_request(method, request, _HttpCallContext(ctx))

    async def _recheck(self, method: str, request: Any, ctx: RequestContext[Any, Any]) -> None:
        """An open stream's credentials, checked again as at its opening (`stream_credentials`)."""
        if self._authorize is not None:
            await self._authorize(method, _HttpCallContext(ctx))
        self._check(method, request, ctx)

    def _unary(self, method: str, handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def call(request: Any, ctx: RequestContext[Any, Any]) -> Any:
            async with self._road(method, ctx, unary=True):
                self._check(method, request, ctx)
                return await handler(request, None)

        return call

    def _stream(self, method: str, handler: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def call(request: Any, ctx: RequestContext[Any, Any]) -> AsyncIterator[Any]:
            async with self._road(method, ctx, unary=False):
                self._check(method, request, ctx)
                messages = handler(request, None)
                if self._authorize is not None:
                    messages = while_authorized(method, messages, lambda: self._recheck(method, request, ctx))
                async for message in messages:
                    yield message

        return call

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Mapping[str, Any], receive: Callable[..., Awaitable[Mapping[str, Any]]], send: Callable[..., Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"].startswith(f"/{_PACKAGE}."):
            await self._connect(scope, receive, send)
            return
        await self._static(scope, send)

    async def _static(self, scope: Mapping[str, Any], send: Callable[..., Awaitable[None]]) -> None:
        path = scope["path"]
        name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/assets/") if path.startswith("/assets/") else ""
        body = _asset(name) if name and "/" not in name and not name.startswith(".") else None
        if scope["method"] not in ("GET", "HEAD") or body is None:
            await _respond(send, 404, b"text/plain; charset=utf-8", b"not found\n")
            return
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if content_type.startswith("text/") or content_type == "application/javascript":
            content_type += "; charset=utf-8"
        await _respond(send, 200, content_type.encode(), b"" if scope["method"] == "HEAD" else body)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> int:
        host, _, port = self._config.http_addr.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, int(port)))
        except OSError as exc:
            listener.close()
            raise OSError(f"could not listen on QUEUE_HTTP_ADDR={self._config.http_addr}: {exc.strerror}") from None
        listener.listen(128)
        # Bound here so a port of 0 is known at once; the bounded listener accepts on it (and closes it).
        bound: int = listener.getsockname()[1]
        hypercorn = _HypercornConfig()
        hypercorn.accesslog = None
        hypercorn.errorlog = logging.getLogger("hypercorn.error")
        hypercorn.graceful_timeout = 1.0
        web_limits.configure(hypercorn)
        if self._config.tls_cert_file:
            hypercorn.certfile, hypercorn.keyfile = self._config.tls_cert_file, self._config.tls_key_file
        self._hypercorn = hypercorn
        self._listener = web_limits.BoundedListener(
            web_limits.RequestLimits(self, self._config.http_body_timeout_seconds), hypercorn, listener,
            web_limits.connection_cap(self._config.http_max_connections),
        )
        self._task = asyncio.create_task(self._listener.serve(), name="http-endpoint")
        log.info(
            "web console and Connect endpoint on %s (port %d), at most %d connections at once",
            self._config.http_addr, bound, self._listener.cap,
        )
        return bound

    def reload_certificate(self) -> None:
        """Loads the listener's certificate and key again into the TLS context Hypercorn serves
        with: handshakes from now on present the new certificate (a credentials reload)."""
        context = self._hypercorn.ssl_context if self._hypercorn is not None else None
        if context is not None:
            context.load_cert_chain(self._config.tls_cert_file, self._config.tls_key_file)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._listener is not None:
            await self._listener.shut_down(grace=1.0)


def _idempotency(method: Any) -> IdempotencyLevel:
    options = descriptor_pb2.MethodOptions()
    options.ParseFromString(method.GetOptions().SerializeToString())
    if options.idempotency_level == descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS:
        return IdempotencyLevel.NO_SIDE_EFFECTS
    if options.idempotency_level == descriptor_pb2.MethodOptions.IDEMPOTENT:
        return IdempotencyLevel.IDEMPOTENT
    return IdempotencyLevel.UNKNOWN


def _asset(name: str) -> bytes | None:
    try:
        return resources.files("queue_service").joinpath(_CONSOLE_FOLDER, name).read_bytes()
    # ValueError: a NUL in the path, which no file name holds.
    except (FileNotFoundError, ModuleNotFoundError, IsADirectoryError, NotADirectoryError, ValueError):
        return None


async def _respond(send: Callable[..., Awaitable[None]], status: int, content_type: bytes, body: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *_SECURITY_HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
