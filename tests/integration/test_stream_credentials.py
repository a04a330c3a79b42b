"""Open streams lose their credentials with the calls: a token revoked by a reload and a user
assertion past its expiry end their WatchJobs and WatchOverview streams, over gRPC and over the
browser endpoint, within the stated bound (api/access/stream_credentials.py)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import signal
import struct
import time
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2

from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.api.access.stream_credentials import RECHECK_SECONDS
from queue_service.dev.embedded_postgres import free_port
from tests.harness import error_info, new_user, token_entry, write_auth_file
from tests.integration.test_user_assertions import ISSUER, TOKENS, files, mint, web  # noqa: F401 (files: a fixture)

# Time to see an ended stream beyond the bound: the reload itself, a loaded machine.
SLACK_SECONDS = 3.0


def _connect_stream(port: int, method: str, message: dict[str, Any], headers: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """Opens a Connect server stream over HTTP/1.1 and reads it to its end: (when it ended, the end message)."""
    body = json.dumps(message).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            "POST",
            f"/acurio.queue.v1.{method}",
            body=struct.pack(">BI", 0, len(body)) + body,
            headers={"content-type": "application/connect+json", "connect-protocol-version": "1", **headers},
        )
        response = connection.getresponse()
        assert response.status == 200
        while True:
            flags, length = struct.unpack(">BI", response.read(5))
            payload = json.loads(response.read(length) or b"{}")
            if flags & 2:
                return time.monotonic(), payload
    finally:
        connection.close()


def _connect_reason(end: dict[str, Any]) -> tuple[str, str, dict[str, str]]:
    error = end["error"]
    for detail in error.get("details", []):
        if detail["type"] == "google.rpc.ErrorInfo":
            info = error_details_pb2.ErrorInfo.FromString(base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4)))
            return error["code"], info.reason, dict(info.metadata)
    return error["code"], "", {}


async def _grpc_stream_end(call: Any) -> tuple[float, grpc.StatusCode, str, dict[str, str]]:
    try:
        while await call.read() is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as exc:
        code, reason, metadata, _ = error_info(exc)
        return time.monotonic(), code, reason, metadata
    raise AssertionError("the stream ended without a status")


async def test_a_revoked_token_loses_its_open_streams_on_both_listeners(services, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    web_entry, operator_entry = token_entry("web-backend", "web", "web-token"), token_entry("operator", "operator", "operator-token")
    kept = token_entry("operator-kept", "operator", "kept-token")
    write_auth_file(auth, web_entry, operator_entry, kept)
    core = await services.core()
    http_port = free_port()
    replica = await services.start_process(
        core,
        QUEUE_AUTH_FILE=str(auth),
        QUEUE_CREDENTIALS_RELOAD_SECONDS="0",
        QUEUE_HTTP_ADDR=f"127.0.0.1:{http_port}",
    )
    user = new_user()
    bearer = lambda token: (("authorization", f"Bearer {token}"),)  # noqa: E731
    operator = op_grpc.OperatorServiceStub(replica.stubs.channel)

    grpc_jobs = replica.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), metadata=bearer("web-token"), timeout=60)
    grpc_overview = operator.WatchOverview(op_pb2.WatchOverviewRequest(), metadata=bearer("operator-token"), timeout=60)
    kept_overview = operator.WatchOverview(op_pb2.WatchOverviewRequest(), metadata=bearer("kept-token"), timeout=60)
    for call in (grpc_jobs, grpc_overview, kept_overview):
        await asyncio.wait_for(call.read(), 10)  # open: the snapshot, the first overview
    web_jobs = asyncio.create_task(
        asyncio.to_thread(
            _connect_stream,
            http_port,
            "AnalysisQueueService/WatchJobs",
            {"userId": user},
            {"authorization": "Bearer web-token"},
        )
    )
    web_overview = asyncio.create_task(
        asyncio.to_thread(
            _connect_stream,
            http_port,
            "OperatorService/WatchOverview",
            {},
            {"authorization": "Bearer operator-token"},
        )
    )
    grpc_ends = [asyncio.create_task(_grpc_stream_end(call)) for call in (grpc_jobs, grpc_overview)]
    await asyncio.sleep(RECHECK_SECONDS + 1)  # a recheck passed with the tokens still valid
    assert not web_jobs.done() and not web_overview.done() and not any(end.done() for end in grpc_ends)

    write_auth_file(auth, kept)
    replica.process.send_signal(signal.SIGHUP)
    revoked_at = time.monotonic()
    bound = RECHECK_SECONDS + SLACK_SECONDS
    ended = await asyncio.wait_for(asyncio.gather(*grpc_ends), bound)
    for when, code, reason, _metadata in ended:
        assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED") and when - revoked_at < bound
    for task, method in ((web_jobs, "WatchJobs"), (web_overview, "WatchOverview")):
        when, end = await asyncio.wait_for(task, bound)
        code, reason, metadata = _connect_reason(end)
        assert (code, reason) == ("unauthenticated", "UNAUTHENTICATED") and method in metadata["method"]
        assert when - revoked_at < bound

    # The token still in the file keeps its stream.
    await asyncio.sleep(RECHECK_SECONDS)
    assert not kept_overview.done()
    kept_overview.cancel()
    assert "stream ended, its credentials no longer hold" in replica.log()


async def test_a_stream_ends_when_its_user_assertion_expires_on_both_listeners(services, files) -> None:  # noqa: F811
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(
        core,
        auth_file=str(files["auth"]),
        user_assertion_key_file=str(files["key"]),
        user_assertion_issuer=ISSUER,
        user_assertion_leeway_seconds=0.0,
        http_addr="127.0.0.1:0",
    )
    user, lifetime = new_user(), 3
    assertion = mint(user, lifetime=lifetime)
    expires = time.monotonic() + lifetime
    call = service.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), metadata=web(assertion), timeout=60)
    await asyncio.wait_for(call.read(), 10)
    grpc_end = asyncio.create_task(_grpc_stream_end(call))
    web_end = asyncio.create_task(
        asyncio.to_thread(
            _connect_stream,
            service.app.http_port,
            "AnalysisQueueService/WatchJobs",
            {"userId": user},
            {"authorization": f"Bearer {TOKENS['web']}", "x-user-assertion": assertion},
        )
    )

    bound = lifetime + RECHECK_SECONDS + SLACK_SECONDS
    when, code, reason, metadata = await asyncio.wait_for(grpc_end, bound)
    assert (code, reason, metadata["problem"]) == (grpc.StatusCode.UNAUTHENTICATED, "USER_ASSERTION_INVALID", "expired")
    assert expires - 1 <= when < expires + RECHECK_SECONDS + SLACK_SECONDS
    when, end = await asyncio.wait_for(web_end, bound)
    code, reason, metadata = _connect_reason(end)
    assert (code, reason, metadata["problem"]) == ("unauthenticated", "USER_ASSERTION_INVALID", "expired")
    assert expires - 1 <= when < expires + RECHECK_SECONDS + SLACK_SECONDS
