"""The browser endpoint (Connect and gRPC-Web on QUEUE_HTTP_ADDR) takes the gRPC listener's road:
the caller's deadline is the call's budget, credentials are checked from the headers before the
body is read, bodies are bounded by the largest valid request, and a Host that is not one of the
endpoint's names is refused (DNS rebinding). Against real PostgreSQL and a live process."""

from __future__ import annotations

import asyncio
import base64
import gzip
import http.client
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2

from queue_service.dev.embedded_postgres import free_port
from tests.harness import error_info, new_user, role_tokens, write_auth_file

TOKENS = {"web": "browser-endpoint-web-token", "operator": "browser-endpoint-operator-token", "core": "browser-endpoint-core-token"}


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("auth") / "auth.json"
    write_auth_file(path, *role_tokens(TOKENS))
    return str(path)


def _post(port: int, path: str, body: bytes, headers: dict[str, str], timeout: float = 15) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _connect_headers(token: str | None = None, **extra: str) -> dict[str, str]:
    headers = {"content-type": "application/json", "connect-protocol-version": "1", **extra}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _reason(error: dict[str, Any]) -> str:
    for detail in error.get("details", []):
        if detail["type"] == "google.rpc.ErrorInfo":
            return error_details_pb2.ErrorInfo.FromString(base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))).reason
    return ""


async def test_a_connect_deadline_is_the_calls_budget_as_on_grpc(services, auth_file) -> None:
    """With a hung core, gRPC and Connect callers with a 2 s deadline both hear UNAVAILABLE
    CORE_UNAVAILABLE before their deadline, not a bare deadline_exceeded after the core's 5 s."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, http_addr="127.0.0.1:0", core_deadline_seconds=5.0)
    user, web = new_user(), (("authorization", f"Bearer {TOKENS['web']}"),)
    port = service.app.http_port
    grant = {"userId": user, "amount": 5, "idempotencyKey": "g"}
    status, _, _ = await asyncio.to_thread(
        _post, port, "/acurio.queue.v1.CreditsService/GrantCredits", json.dumps(grant).encode(), _connect_headers(TOKENS["operator"])
    )
    assert status == 200
    core.slow_seconds = 30  # every call to the core hangs
    try:
        from queue_service._gen.acurio.queue.v1 import job_pb2
        from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2

        request = queue_pb2.AdmitRequest(
            user_id=user,
            idempotency_key="over-grpc",
            document=job_pb2.Document(uri="s3://t/1.pdf"),
            sources=[job_pb2.Source(doi="10.1234/a")],
        )
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await service.stubs.queue.Admit(request, metadata=web, timeout=2)
        grpc_took = time.monotonic() - started
        assert error_info(raised.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE")

        admit = {"userId": user, "idempotencyKey": "over-connect", "document": {"uri": "s3://t/1.pdf"}, "sources": [{"doi": "10.1234/a"}]}
        started = time.monotonic()
        status, _, body = await asyncio.to_thread(
            _post,
            port,
            "/acurio.queue.v1.AnalysisQueueService/Admit",
            json.dumps(admit).encode(),
            _connect_headers(TOKENS["web"], **{"connect-timeout-ms": "2000"}),
        )
        connect_took = time.monotonic() - started
        error = json.loads(body)
        print(f"hung core, 2 s deadline: gRPC answered in {grpc_took:.3f}s, Connect in {connect_took:.3f}s (HTTP {status})")
        assert (status, error["code"], _reason(error)) == (503, "unavailable", "CORE_UNAVAILABLE"), error
        assert connect_took < 2.0

        # gRPC-Web's `grpc-timeout` is a budget too.
        web_request = queue_pb2.AdmitRequest()
        web_request.CopyFrom(request)
        web_request.idempotency_key = "over-grpc-web"
        frame = web_request.SerializeToString()
        started = time.monotonic()
        status, headers, body = await asyncio.to_thread(
            _post,
            port,
            "/acurio.queue.v1.AnalysisQueueService/Admit",
            b"\x00" + len(frame).to_bytes(4, "big") + frame,
            {"content-type": "application/grpc-web+proto", "grpc-timeout": "2000m", "authorization": f"Bearer {TOKENS['web']}"},
        )
        took = time.monotonic() - started
        # Trailers-only answers carry the status in the headers, others in a trailer frame (flag 0x80).
        trailers = body[5:].decode(errors="replace").lower().replace(" ", "") if body[:1] == b"\x80" else ""
        assert status == 200 and (headers.get("grpc-status") == "14" or "grpc-status:14" in trailers), (headers, body)
        assert took < 2.0
    finally:
        core.slow_seconds = 0


def _raw_request(port: int, head: bytes, *, timeout: float) -> bytes:
    """Sends only the request head (the body it announces never comes) and reads the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(head)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


async def test_a_caller_without_a_valid_token_is_refused_before_its_body_is_read(services, auth_file) -> None:
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, http_addr="127.0.0.1:0")
    port = service.app.http_port
    for token, stream in ((None, False), ("wrong-token", False), (None, True)):
        method = "WatchJobs" if stream else "ListJobs"
        content_type = "application/connect+json" if stream else "application/json"
        head = (
            f"POST /acurio.queue.v1.AnalysisQueueService/{method} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: {content_type}\r\nConnect-Protocol-Version: 1\r\nContent-Length: 1000\r\n"
            + (f"Authorization: Bearer {token}\r\n" if token else "")
            + "\r\n"
        ).encode()
        started = time.monotonic()
        try:
            answer = await asyncio.to_thread(_raw_request, port, head, timeout=3)
        except TimeoutError:
            pytest.fail(f"{method} without a valid token waited for its body (no answer in 3 s)")
        # A unary call hears 401; a stream's status comes in its end-of-stream message (HTTP 200).
        assert answer.split(b" ", 2)[1] == (b"200" if stream else b"401"), answer[:200]
        assert time.monotonic() - started < 1.0


# The flood runs in its own process, so its work does not share the measuring client's interpreter;
# it sends until its stdin closes or it has sent `limit` requests, and the test pauses it (SIGSTOP)
# for the idle windows.
_FLOOD = textwrap.dedent(
    """
    import os, socket, sys, threading, time
    os.nice(19)  # an attacker's own CPU is on another machine: here it yields to the replica's
    port, connections, limit, rate = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[5])
    body = open(sys.argv[4], "rb").read()
    request = (
        f"POST /acurio.queue.v1.AnalysisQueueService/ListJobs HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n"
        "Content-Type: application/json\\r\\nContent-Encoding: gzip\\r\\nConnect-Protocol-Version: 1\\r\\n"
        f"Content-Length: {len(body)}\\r\\n\\r\\n"
    ).encode() + body
    statuses, lock, stop = {}, threading.Lock(), threading.Event()
    def answer(connection, buffered):
        while b"\\r\\n\\r\\n" not in buffered:
            chunk = connection.recv(65536)
            if not chunk:
                raise ConnectionResetError("closed")
            buffered += chunk
        head, _, rest = buffered.partition(b"\\r\\n\\r\\n")
        lengths = [int(line.split(b":")[1]) for line in head.split(b"\\r\\n") if line.lower().startswith(b"content-length:")]
        if lengths:
            while len(rest) < lengths[0]:
                rest += connection.recv(65536)
            return head.split(b" ", 2)[1].decode(), rest[lengths[0]:]
        while b"\\r\\n0\\r\\n\\r\\n" not in b"\\r\\n" + rest:  # chunked: up to the last chunk
            chunk = connection.recv(65536)
            if not chunk:
                raise ConnectionResetError("closed")
            rest += chunk
        return head.split(b" ", 2)[1].decode(), (b"\\r\\n" + rest).split(b"\\r\\n0\\r\\n\\r\\n", 1)[1]
    def flood():
        connection, buffered = None, b""
        while not stop.wait(connections / rate):  # each connection sends its share of the rate
            with lock:
                if sum(statuses.values()) >= limit:
                    break
            try:
                if connection is None:  # one connection kept alive, as a browser's
                    connection, buffered = socket.create_connection(("127.0.0.1", port), timeout=10), b""
                connection.sendall(request)
                status, buffered = answer(connection, buffered)
            except OSError as exc:
                status, connection = type(exc).__name__, None
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
        if connection is not None:
            connection.close()
    threads = [threading.Thread(target=flood) for _ in range(connections)]
    [t.start() for t in threads]
    sys.stdin.read()
    stop.set()
    [t.join() for t in threads]
    print(" ".join(f"{k}={v}" for k, v in sorted(statuses.items())))
    """
)


async def _health_latencies(stubs: Any, count: int, within: float = 10.0) -> list[float]:
    """`count` Health.Check latencies in a row, or as many as `within` seconds allow."""
    latencies: list[float] = []
    end = time.perf_counter() + within
    while len(latencies) < count and time.perf_counter() < end:
        started = time.perf_counter()
        await stubs.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        latencies.append(time.perf_counter() - started)
    return latencies


def _p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


async def test_an_unauthenticated_flood_of_expensive_bodies_leaves_grpc_health_responsive(services, auth_file, tmp_path) -> None:
    """Gzip ListJobs bodies of 3.7 KiB that inflate to 1.9 million statuses (3.2 s of event loop
    each when decoded), sent without a token on 4 kept-alive connections at 25 a second (at most
    600, to 127.0.0.1): each is refused 401 from its headers, and gRPC Health.Check's p99 stays
    within 2x of idle. Twenty idle and twenty flooded windows alternate (the flood paused and resumed),
    so load from outside the test weighs on both alike; the figures are printed."""
    core = await services.core(callback_token=TOKENS["core"])
    http_port = free_port()
    replica = await services.start_process(core, QUEUE_AUTH_FILE=auth_file, QUEUE_HTTP_ADDR=f"127.0.0.1:{http_port}")
    body = gzip.compress(b'{"userId":"u","statuses":[' + b",".join([b"1"] * 1_900_000) + b"]}", 9)
    body_path = tmp_path / "list-jobs.json.gz"
    body_path.write_bytes(body)

    await _health_latencies(replica.stubs, 50)  # warm the channel
    idle: list[float] = []
    flooded: list[float] = []
    flood = subprocess.Popen(
        [sys.executable, "-c", _FLOOD, str(http_port), "4", "600", str(body_path), "25"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        await asyncio.sleep(0.5)  # the flood's interpreter has started and connected
        for _ in range(20):
            flood.send_signal(signal.SIGSTOP)
            await asyncio.sleep(0.2)  # the refusals in flight are answered
            idle += await _health_latencies(replica.stubs, 25)
            flood.send_signal(signal.SIGCONT)
            await asyncio.sleep(0.2)  # the flood is under way again
            flooded += await _health_latencies(replica.stubs, 25)
        output, _ = await asyncio.to_thread(flood.communicate, "", 30)
    finally:
        if flood.poll() is None:
            flood.send_signal(signal.SIGCONT)
            flood.kill()
    statuses = {status: int(count) for status, count in (item.split("=") for item in output.split())}
    idle_p99, flooded_p99 = _p99(idle), _p99(flooded)
    print(
        f"flood of {len(body)}-byte gzip bodies: answers {statuses}; Health.Check p99 over {len(idle)} calls idle "
        f"{idle_p99 * 1000:.2f} ms, over {len(flooded)} under the flood {flooded_p99 * 1000:.2f} ms (ratio {flooded_p99 / idle_p99:.2f})"
    )
    assert set(statuses) == {"401"} and statuses["401"] >= 50, statuses
    assert flooded_p99 <= 2 * idle_p99

    # With a token, the same body is refused for its size once inflated past ListJobs' largest
    # valid request, before it is parsed.
    status, _, answer = await asyncio.to_thread(
        _post,
        http_port,
        "/acurio.queue.v1.AnalysisQueueService/ListJobs",
        body,
        _connect_headers(TOKENS["web"], **{"content-encoding": "gzip"}),
    )
    error = json.loads(answer)
    assert (status, error["code"]) == (429, "resource_exhausted"), error
    assert "larger than configured max" in error["message"]


async def test_lists_longer_than_validation_allows_are_refused_before_parsing(services, auth_file) -> None:
    """An Admit under its method's byte limit but with 100 000 sources (validation allows 1000) is
    refused from the decoded JSON, before protobuf's pure-Python parser builds the message."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, http_addr="127.0.0.1:0")
    admit = {"userId": new_user(), "idempotencyKey": "k", "document": {"uri": "s3://t/1.pdf"}, "sources": [{"doi": "10.1/a"}] * 100_000}
    started = time.monotonic()
    status, _, answer = await asyncio.to_thread(
        _post,
        service.app.http_port,
        "/acurio.queue.v1.AnalysisQueueService/Admit",
        json.dumps(admit).encode(),
        _connect_headers(TOKENS["web"]),
    )
    print(f"Admit with 100 000 sources refused in {time.monotonic() - started:.3f}s")
    error = json.loads(answer)
    assert (status, error["code"], _reason(error)) == (400, "invalid_argument", "INVALID_REQUEST"), error
    assert error["message"] == "invalid request: sources"
    assert _violation(error) == ("sources", "sources lists 100000 entries; at most 1000 are allowed")


def _violation(error: dict[str, Any]) -> tuple[str, str]:
    for detail in error.get("details", []):
        if detail["type"] == "google.rpc.BadRequest":
            raw = base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
            violation = error_details_pb2.BadRequest.FromString(raw).field_violations[0]
            return violation.field, violation.description
    return "", ""


def _request(port: int, method: str, path: str, host: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body or None, headers={"Host": host, **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


async def test_a_host_that_is_not_one_of_the_endpoints_names_is_refused_421(services, auth_file) -> None:
    """DNS rebinding: a page on attacker.example re-pointed at the endpoint sends its own name as
    Host. It hears 421 before any handler runs; the endpoint's own names and the configured ones
    are served."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, http_addr="127.0.0.1:0", http_allowed_hosts=("console.example",))
    port, user = service.app.http_port, new_user()
    for host in (
        "attacker.example",
        f"attacker.example:{port}",
        f"127.0.0.1.attacker.example:{port}",
        "localhost.attacker.example",
        "[::2]",
        "console.example.attacker",
    ):
        status, body = await asyncio.to_thread(_request, port, "GET", "/", host)
        assert (status, body.startswith(b"misdirected request")) == (421, True), host
    grant = json.dumps({"userId": user, "amount": 5, "idempotencyKey": "g"}).encode()
    status, body = await asyncio.to_thread(
        _request,
        port,
        "POST",
        "/acurio.queue.v1.CreditsService/GrantCredits",
        "attacker.example",
        grant,
        _connect_headers(TOKENS["operator"]),
    )
    assert status == 421 and b"QUEUE_HTTP_ALLOWED_HOSTS" in body

    async def balance() -> int:
        status, body = await asyncio.to_thread(
            _request,
            port,
            "POST",
            "/acurio.queue.v1.CreditsService/GetBalance",
            f"127.0.0.1:{port}",
            json.dumps({"userId": user}).encode(),
            _connect_headers(TOKENS["operator"]),
        )
        assert status == 200, body
        return int(json.loads(body).get("balance", 0))

    assert await balance() == 0  # no handler ran

    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "console.example", "Console.Example:443"):
        status, body = await asyncio.to_thread(_request, port, "GET", "/", host)
        assert status == 200 and b"<title>" in body, host
    status, _ = await asyncio.to_thread(
        _request,
        port,
        "POST",
        "/acurio.queue.v1.CreditsService/GrantCredits",
        f"localhost:{port}",
        grant,
        _connect_headers(TOKENS["operator"]),
    )
    assert status == 200 and await balance() == 5


@pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="needs /usr/bin/chromium")
async def test_chromium_on_a_rebound_name_gets_421(services, auth_file, tmp_path) -> None:
    """Chromium resolving attacker.example to 127.0.0.1 (as a rebinding DNS server would make it)
    loads the 421 refusal, not the console; the same browser on 127.0.0.1 loads the console."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, http_addr="127.0.0.1:0")
    port = service.app.http_port

    def dump_dom(url: str) -> str:
        command = [
            "/usr/bin/chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--host-resolver-rules=MAP attacker.example 127.0.0.1",
            "--dump-dom",
            url,
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout

    rebound = await asyncio.to_thread(dump_dom, f"http://attacker.example:{port}/")
    assert "misdirected request" in rebound and "<title>" not in rebound, rebound[:500]
    own = await asyncio.to_thread(dump_dom, f"http://127.0.0.1:{port}/")
    assert "<title>" in own and "misdirected request" not in own, own[:500]


async def test_a_stream_the_browser_abandons_ends_quietly_and_frees_its_place(services, auth_file, caplog) -> None:
    """A tab closed mid-stream: connectrpc ends the call CANCELED; the road records it like any
    other outcome (no traceback in the log) and the gate counts the stream out."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, http_addr="127.0.0.1:0")
    port, request = service.app.http_port, json.dumps({"userId": new_user()}).encode()
    head = (
        (
            f"POST /acurio.queue.v1.AnalysisQueueService/WatchJobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nAuthorization: Bearer {TOKENS['web']}\r\n"
            f"Content-Length: {5 + len(request)}\r\n\r\n"
        ).encode()
        + b"\x00"
        + len(request).to_bytes(4, "big")
        + request
    )

    def open_and_abandon() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(head)
            return connection.recv(65536)  # the snapshot's end arrives; then the tab goes away

    with caplog.at_level(logging.ERROR):
        assert (await asyncio.to_thread(open_and_abandon)).startswith(b"HTTP/1.1 200")
        for _ in range(100):
            if service.app.gate.in_flight == 0:
                break
            await asyncio.sleep(0.05)
        assert service.app.gate.in_flight == 0
        await asyncio.sleep(0.2)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
