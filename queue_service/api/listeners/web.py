"""The browser endpoint (QUEUE_HTTP_ADDR): the same services over the Connect protocol (and
gRPC-Web), plus the web console's static files, on one HTTP/1.1 and HTTP/2 listener.

Browsers cannot speak gRPC (they cannot read HTTP/2 trailers), so the `connectrpc` library
serves Connect and gRPC-Web as ASGI applications (`web_road`), run by Hypercorn on this replica's
event loop. They call the very servicer instances the gRPC server uses, through the same road
(`road`): budget, actor, authorization (bearer tokens from the `authorization` header, so the same
roles apply), the gate, the request checks and the mapping of domain errors to a status with
ErrorInfo and BadRequest details. WatchJobs and WatchOverview stream over HTTP/1.1.

The console (`console_assets/`, built from `console/` and committed) is served at `/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mimetypes
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

from hypercorn.config import Config as HypercornConfig

from queue_service import telemetry
from queue_service.api.listeners import web_limits
from queue_service.api.listeners.web_hosts import AllowedHosts, header
from queue_service.api.road.road import CallRoad
from queue_service.api.road.web_road import PACKAGE, connect_applications
from queue_service.config import Config

log = logging.getLogger(__name__)

_CONSOLE_FOLDER = "console_assets"
# The console talks only to its own origin; nothing is inlined or fetched from elsewhere.
_SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


_MISDIRECTED = (
    b"misdirected request: this endpoint answers only to its own names (the host of QUEUE_HTTP_ADDR, localhost, "
    b"127.0.0.1, ::1 and QUEUE_HTTP_ALLOWED_HOSTS); add the name you reach it by to QUEUE_HTTP_ALLOWED_HOSTS\n"
)


class _HypercornConfig(HypercornConfig):
    """Keeps the TLS context Hypercorn makes once at start, so a reload can load a new
    certificate into it."""

    ssl_context: ssl.SSLContext | None = None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        self.ssl_context = super().create_ssl_context()
        return self.ssl_context


class WebEndpoint:
    """Serves Connect/gRPC-Web and the console on `config.http_addr`; `start` returns the port."""

    def __init__(self, servicers: Mapping[str, Any], road: CallRoad, config: Config) -> None:
        self._config = config
        self._hosts = AllowedHosts(config.http_addr, config.http_allowed_hosts)
        self._connect = connect_applications(servicers, road)
        # Answers paths of the contract's package that name no method, in the caller's protocol.
        self._unknown_method = next(iter(self._connect.values()))
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._hypercorn: _HypercornConfig | None = None
        self._listener: web_limits.BoundedListener | None = None

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(
        self, scope: Mapping[str, Any], receive: Callable[..., Awaitable[Mapping[str, Any]]], send: Callable[..., Awaitable[None]]
    ) -> None:
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
        if not self._hosts.allows(header(scope["headers"], b"host")):
            # Not logged per request: a page can send these as fast as it likes.
            telemetry.metrics.http_misdirected.add(1)
            await _respond(send, 421, b"text/plain; charset=utf-8", _MISDIRECTED)
            return
        if scope["path"].startswith(f"/{PACKAGE}."):
            await self._connect.get(scope["path"], self._unknown_method)(scope, receive, send)
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
            web_limits.RequestLimits(self, self._config.http_body_timeout_seconds),
            hypercorn,
            listener,
            web_limits.connection_cap(self._config.http_max_connections),
        )
        self._task = asyncio.create_task(self._listener.serve(), name="http-endpoint")
        log.info(
            "web console and Connect endpoint on %s (port %d), at most %d connections at once",
            self._config.http_addr,
            bound,
            self._listener.cap,
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
