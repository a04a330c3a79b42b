"""The browser listener's limits against a live `queue-service serve` process: callers without a
token who open connections and never finish their requests hold nothing for long, and the
gRPC listener keeps serving while they try. Traffic goes to 127.0.0.1 only, bounded in count
and time."""

from __future__ import annotations

import asyncio
import http.client
import socket
import statistics
import time

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
from grpc_health.v1 import health_pb2, health_pb2_grpc

from queue_service.api.listeners import web_limits
from queue_service.dev.embedded_postgres import free_port

DESCRIPTOR_LIMIT = 200  # the browser listener may then hold 100 connections
BODY_TIMEOUT_SECONDS = 1.5
SLOW_BODIES = 200  # as many as the process has descriptors, within cap + backlog


async def _serve_with_browser_listener(services, **env: str):
    core = await services.core()
    http_port = free_port()
    process = await services.start_process(
        core,
        descriptor_limit=DESCRIPTOR_LIMIT,
        QUEUE_HTTP_ADDR=f"127.0.0.1:{http_port}",
        QUEUE_HTTP_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT_SECONDS),
        **env,
    )
    return process, http_port


async def _health_latencies(health: health_pb2_grpc.HealthStub, count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        response = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
        latencies.append(time.perf_counter() - started)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
        await asyncio.sleep(0.02)
    return latencies


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


async def test_a_flood_of_unfinished_requests_is_closed_in_time_and_the_grpc_listener_keeps_serving(services) -> None:
    process, http_port = await _serve_with_browser_listener(services)
    idle = await _health_latencies(process.stubs.health, 40)
    log_lines_before = len(process.log().splitlines())

    slow_request = (
        b"POST /acurio.queue.v1.AnalysisQueueService/ListJobs HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: 4096\r\n\r\n{"
    )

    async def hold(request: bytes) -> float:
        """Opens a connection, sends `request` and then nothing; seconds until the server closes it."""
        reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
        opened = time.monotonic()
        if request:
            writer.write(request)
        try:
            while await reader.read(4096):
                pass
            return time.monotonic() - opened
        finally:
            writer.close()

    started = time.monotonic()
    holders = [asyncio.create_task(hold(slow_request)) for _ in range(SLOW_BODIES)]
    try:
        await _flooded(process, holders, idle, started)
    finally:
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    await _health_latencies(process.stubs.health, 5)
    log = process.log().splitlines()[log_lines_before:]
    assert not [line for line in log if "Traceback" in line or "Too many open files" in line]
    assert len(log) < 20, "\n".join(log[:40])


async def _flooded(process, holders: list[asyncio.Task[float]], idle: list[float], started: float) -> None:
    await asyncio.sleep(0.5)
    # While the flood holds every connection it may, gRPC answers, also on a new connection.
    during = await _health_latencies(process.stubs.health, 40)
    # (its own subchannel pool, or gRPC would reuse the first channel's connection)
    fresh = grpc.aio.insecure_channel(process.address, options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        during += await _health_latencies(health_pb2_grpc.HealthStub(fresh), 10)
    finally:
        await fresh.close()

    # Each unfinished request is closed within its timeout once accepted; the connections
    # beyond the cap wait their turn in the backlog: at most two rounds here.
    bound = 2 * BODY_TIMEOUT_SECONDS + 3
    held = await asyncio.wait_for(asyncio.gather(*holders), bound)
    total = time.monotonic() - started
    print(
        f"health p99 idle {_p99(idle) * 1000:.1f} ms, during the flood {_p99(during) * 1000:.1f} ms; "
        f"{len(held)} connections closed within {max(held):.1f} s (all within {total:.1f} s)"
    )
    assert max(held) < bound


async def test_one_http2_connection_may_open_only_a_few_streams(services) -> None:
    process, http_port = await _serve_with_browser_listener(services)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    with socket.create_connection(("127.0.0.1", http_port), timeout=5) as connection:
        connection.sendall(client.data_to_send())
        settings: dict[int, int] = {}
        deadline = time.monotonic() + 5
        while not settings and time.monotonic() < deadline:
            for event in client.receive_data(connection.recv(65536)):
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    settings = {code: change.new_value for code, change in event.changed_settings.items()}
    assert settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == web_limits.MAX_STREAMS_PER_CONNECTION


def test_the_connection_cap_leaves_half_the_descriptors_to_the_rest_of_the_replica() -> None:
    assert web_limits.connection_cap(512, descriptor_limit=200) == 100
    assert web_limits.connection_cap(512, descriptor_limit=1_048_576) == 512
    assert web_limits.connection_cap(50, descriptor_limit=1024) == 50


async def test_requests_no_handler_takes_are_refused_without_a_traceback(services) -> None:
    process, http_port = await _serve_with_browser_listener(services)
    log_lines_before = len(process.log().splitlines())

    def request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    for _ in range(5):
        assert (await asyncio.to_thread(request, "GET", "/assets/a%00b.js", {}))[0] == 404
        # native gRPC (trailers) over HTTP/1.1, without a token
        status, body = await asyncio.to_thread(
            request,
            "POST",
            "/acurio.queue.v1.AnalysisQueueService/ListJobs",
            {"content-type": "application/grpc"},
            b"\0\0\0\0\0",
        )
        assert status == 415 and b"gRPC listener" in body

    log = process.log().splitlines()[log_lines_before:]
    assert log == [], "\n".join(log[:40])
