"""What a caller of the browser listener (QUEUE_HTTP_ADDR) may hold, with or without a token.

Hypercorn parses HTTP/1.1 and HTTP/2 and runs our ASGI application, but it has no cap on
connections and no bound on how long a request body may take once its headers are in: a caller
that sends headers and then nothing holds a connection, a descriptor and a task forever, and
enough of them take every descriptor the replica has (the gRPC listener and the database pool
then cannot open theirs). So this module accepts the listener's connections itself and hands
each to Hypercorn's connection server, and wraps the application:

- Connections: at most `connection_cap()` at once, QUEUE_HTTP_MAX_CONNECTIONS (512) and never
  more than half of RLIMIT_NOFILE, so the other half stays for the gRPC listener, the database pool, the core
  and the process's files whatever the browser side does. At the cap the listener stops
  accepting; callers beyond it wait in the kernel's backlog, holding none of our descriptors.
- Time: headers within HEADERS_TIMEOUT_SECONDS of a connection opening or its previous request
  ending (Hypercorn's keep-alive timeout, which stops once a request's headers are in), a TLS
  handshake within TLS_HANDSHAKE_TIMEOUT_SECONDS, and the whole request body within
  QUEUE_HTTP_BODY_TIMEOUT_SECONDS (10) of its headers (`RequestLimits`); a request past it is answered
  DEADLINE_EXCEEDED (Connect) or 408, and its HTTP/1.1 connection is closed. While its body
  arrives a request holds no turn at the call gate (`web_road` takes it once the body is in). A
  response stream (WatchJobs) has no time limit once its request is in.
- HTTP/2: at most MAX_STREAMS_PER_CONNECTION requests open on one connection.
- The log: an accept that fails (EMFILE, ENFILE, ENOBUFS) and a request that fails outside
  every handler write at most one line per LOG_INTERVAL_SECONDS and kind, with the count since
  the last, never a traceback per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config as HypercornConfig
from hypercorn.utils import wrap_app

from queue_service import telemetry

log = logging.getLogger(__name__)

HEADERS_TIMEOUT_SECONDS = 5.0
TLS_HANDSHAKE_TIMEOUT_SECONDS = 10.0
MAX_STREAMS_PER_CONNECTION = 32
LOG_INTERVAL_SECONDS = 10.0
# Back-off after an accept failed for want of descriptors or memory, so a flood does not spin.
_ACCEPT_RETRY_SECONDS = 0.25

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def connection_cap(configured: int, descriptor_limit: int | None = None) -> int:
    """Browser connections open at once: `configured`, and at most half the process's descriptors."""
    if descriptor_limit is None:
        descriptor_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if descriptor_limit == resource.RLIM_INFINITY or descriptor_limit <= 0:
        return configured
    return max(1, min(configured, descriptor_limit // 2))


def configure(hypercorn: HypercornConfig) -> None:
    """Hypercorn's own bounds, as this module states them."""
    hypercorn.keep_alive_timeout = HEADERS_TIMEOUT_SECONDS
    hypercorn.ssl_handshake_timeout = TLS_HANDSHAKE_TIMEOUT_SECONDS
    hypercorn.h2_max_concurrent_streams = MAX_STREAMS_PER_CONNECTION
    # Hypercorn names itself in every response otherwise.
    hypercorn.include_server_header = False


class RateLimitedLog:
    """One line per `interval` seconds for a kind of event, with how many happened since."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL_SECONDS) -> None:
        self._log, self._interval = logger, interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += f" ({suppressed} more like it in the last {self._interval:.0f} s not logged)"
        self._log.warning(message, *args)


_quiet = RateLimitedLog(log)


class BodyTooSlow(ConnectError):
    """The request body did not arrive in time. A ConnectError, so the
    Connect application answers it as a status (and no traceback reaches the log)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(Code.DEADLINE_EXCEEDED, f"the request body did not arrive within {seconds:g} s")


class RequestLimits:
    """ASGI middleware in front of the browser endpoint's application.

    - Bounds the time from a request's headers to the end of its body. Only reads of the body
      are bounded; once it is complete, the application may wait on `receive` for a disconnect
      as long as its response streams.
    - Serves only the documented protocols: native gRPC (`application/grpc`, not gRPC-Web) is
      the gRPC listener's, with that listener's limits, and is refused here with 415.
    - Turns an exception that escapes the application (a request no handler took) into one
      rate-limited log line instead of a traceback.
    """

    def __init__(self, app: AsgiApp, body_seconds: float) -> None:
        self._app, self._seconds = app, body_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if _is_native_grpc(scope):
            telemetry.metrics.http_refusals.add(1, {"reason": "not_served"})
            await _plain_response(send, 415, b"native gRPC is served on the gRPC listener; this endpoint serves Connect and gRPC-Web\n")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._seconds
        body_done = False
        response_started = False

        async def receive_in_time() -> Mapping[str, Any]:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                telemetry.metrics.http_refusals.add(1, {"reason": "body_timeout"})
                raise BodyTooSlow(self._seconds) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def tracked_send(message: Mapping[str, Any]) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self._app(scope, receive_in_time, tracked_send)
        except BodyTooSlow as slow:
            if not response_started:
                await _plain_response(send, 408, f"{slow.message}\n".encode())
        except Exception as error:
            # Not a handler's error (those are statuses already): a request the protocol layer
            # could not take. Anyone can send these, so no traceback.
            telemetry.metrics.http_refusals.add(1, {"reason": "unhandled"})
            _quiet.warning(
                "unhandled",
                "browser request %s %.100r failed outside every handler: %s: %.200s",
                scope.get("method"),
                scope.get("path"),
                type(error).__name__,
                error,
            )
            if not response_started:
                await _plain_response(send, 400, b"bad request\n")


def _is_native_grpc(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media = bytes(value).split(b";")[0].strip().lower()
            return media == b"application/grpc" or media.startswith(b"application/grpc+")
    return False


async def _plain_response(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    with contextlib.suppress(Exception):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class BoundedListener:
    """Accepts the browser listener's connections, at most `cap` at once, and serves each with
    Hypercorn's connection server (what `hypercorn.asyncio.serve` does, plus the cap)."""

    def __init__(self, app: AsgiApp, config: HypercornConfig, listener: socket.socket, cap: int) -> None:
        self._app = wrap_app(cast(Any, app), config.wsgi_max_body_size, "asgi")
        self._config = config
        self._listener = listener
        self._listener.setblocking(False)
        self._slots = asyncio.Semaphore(cap)
        self._context = WorkerContext(None)
        self._connections: set[asyncio.Task[None]] = set()
        self._ssl: ssl.SSLContext | None = config.create_ssl_context() if config.ssl_enabled else None
        self.cap = cap

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._slots.acquire()
                try:
                    connection, _ = await loop.sock_accept(self._listener)
                except OSError as error:
                    self._slots.release()
                    telemetry.metrics.http_refusals.add(1, {"reason": "accept_failed"})
                    _quiet.warning("accept", "browser listener: accepting a connection failed: %s", error)
                    await asyncio.sleep(_ACCEPT_RETRY_SECONDS)
                    continue
                task = asyncio.create_task(self._serve_connection(connection), name="http-connection")
                self._connections.add(task)
                task.add_done_callback(self._connections.discard)
                # An accept that finds a connection waiting does not yield: without this a burst
                # of connections is taken in one turn of the loop the gRPC listener shares.
                await asyncio.sleep(0)
        finally:
            self._listener.close()

    async def _serve_connection(self, connection: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        telemetry.metrics.http_connections.add(1)
        try:
            reader = asyncio.StreamReader(loop=loop)
            protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
            try:
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol,
                    connection,
                    ssl=self._ssl,
                    ssl_handshake_timeout=self._config.ssl_handshake_timeout if self._ssl is not None else None,
                )
            except (OSError, TimeoutError):
                connection.close()
                return
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await TCPServer(self._app, loop, self._config, self._context, {}, reader, writer)
        finally:
            telemetry.metrics.http_connections.add(-1)
            self._slots.release()

    async def shut_down(self, grace: float) -> None:
        """Idle connections close at once, the others get `grace` seconds to finish."""
        await self._context.terminated.set()
        if self._connections:
            _, pending = await asyncio.wait(set(self._connections), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
