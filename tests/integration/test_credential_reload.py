"""Credentials re-read while serving: tokens rotated and revoked on SIGHUP against a real
`queue-service serve` process without dropping calls, a broken file refused with the old one
kept, a changed file picked up without a signal, and the listener's certificate rotated for new
connections (gRPC and the browser listener) while open connections carry on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
import trustme
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from queue_service._gen.acurio.queue.v1 import (
    credits_service_pb2 as credits_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    credits_service_pb2_grpc as credits_grpc,
)
from queue_service._gen.acurio.queue.v1 import (
    job_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2 as queue_pb2,
)
from queue_service.dev.embedded_postgres import free_port
from tests.harness import REPO_ROOT, ProcessHandle, new_user, token_entry, write_auth_file


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _code_of(call: Awaitable[object]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _eventually(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


async def _log_says(process: ProcessHandle, text: str, times: int = 1, timeout: float = 20) -> None:
    async def found() -> bool:
        return process.log().count(text) >= times

    await _eventually(found, f"the log says {text!r}; it has:\n{process.log()[-2000:]}", timeout)


async def test_sighup_rotates_tokens_without_dropping_calls(services, tmp_path: Path) -> None:
    """The old operator token is refused and the new one accepted once SIGHUP is handled; a
    WatchJobs stream opened before goes on delivering, and the web backend's calls, made all
    along, never fail."""
    auth = tmp_path / "auth.json"
    web, old_operator = token_entry("web-backend", "web", "web-token"), token_entry("operator-old", "operator", "old-operator-token")
    write_auth_file(auth, web, old_operator)
    core = await services.core(manual=False, judging_seconds=0.05)
    # No polling: only the signal may reload here.
    replica = await services.start_process(core, QUEUE_AUTH_FILE=str(auth), QUEUE_CREDENTIALS_RELOAD_SECONDS="0")
    stubs = replica.stubs
    user = new_user()
    grant = lambda token, key: stubs.credits.GrantCredits(  # noqa: E731
        credits_pb2.GrantCreditsRequest(user_id=user, amount=1, idempotency_key=key), metadata=_bearer(token), timeout=5
    )
    assert await _code_of(grant("old-operator-token", "before")) == grpc.StatusCode.OK

    stream = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), metadata=_bearer("web-token"), timeout=60)
    await stream.read()  # the snapshot: the stream is open

    web_failures: list[grpc.StatusCode] = []
    web_calls = 0
    stop_web = asyncio.Event()

    async def web_backend() -> None:
        nonlocal web_calls
        while not stop_web.is_set():
            code = await _code_of(stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), metadata=_bearer("web-token"), timeout=5))
            web_calls += 1
            if code != grpc.StatusCode.OK:
                web_failures.append(code)

    traffic = asyncio.create_task(web_backend())
    try:
        write_auth_file(auth, web, token_entry("operator-new", "operator", "new-operator-token"))
        assert await _code_of(grant("old-operator-token", "still-old")) == grpc.StatusCode.OK, "no reload before the signal"
        replica.process.send_signal(signal.SIGHUP)
        await _log_says(replica, "reloaded: 2 tokens")

        assert await _code_of(grant("old-operator-token", "after")) == grpc.StatusCode.UNAUTHENTICATED
        assert await _code_of(grant("new-operator-token", "new")) == grpc.StatusCode.OK
        await asyncio.sleep(0.3)  # some web calls after the reload too
    finally:
        stop_web.set()
        await traffic
    assert web_calls > 5 and web_failures == []

    # The stream opened before the reload still delivers: an admit shows up on it.
    admitted = await stubs.queue.Admit(
        queue_pb2.AdmitRequest(
            user_id=user, idempotency_key="a", document=job_pb2.Document(uri="s3://d"), sources=[job_pb2.Source(doi="10.1234/x")]
        ),
        metadata=_bearer("web-token"),
        timeout=5,
    )
    update = await asyncio.wait_for(stream.read(), 10)
    assert admitted.job.job_id in str(update)
    stream.cancel()
    assert replica.process.poll() is None


async def test_a_broken_auth_file_on_sighup_keeps_the_old_one(services, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    write_auth_file(auth, token_entry("operator", "operator", "operator-token"))
    core = await services.core()
    replica = await services.start_process(core, QUEUE_AUTH_FILE=str(auth), QUEUE_CREDENTIALS_RELOAD_SECONDS="0")
    balance = lambda token: replica.stubs.credits.GetBalance(  # noqa: E731
        credits_pb2.GetBalanceRequest(user_id="u"), metadata=_bearer(token), timeout=5
    )

    broken_files = (
        '{"tokens": [',
        json.dumps({"tokens": [{"name": "x", "role": "admin", "sha256": "0" * 64}]}),
        "[1, 2]",
        '{"tokens": ["x"]}',
    )
    for count, broken in enumerate(broken_files, start=1):
        auth.write_text(broken)
        replica.process.send_signal(signal.SIGHUP)
        await _log_says(replica, "not reloaded, the previous one stays in force", times=count)
        assert await _code_of(balance("operator-token")) == grpc.StatusCode.OK, broken
        assert replica.process.poll() is None

    write_auth_file(auth, token_entry("operator-2", "operator", "operator-token-2"))
    replica.process.send_signal(signal.SIGHUP)
    await _log_says(replica, "reloaded: 1 tokens")
    assert await _code_of(balance("operator-token")) == grpc.StatusCode.UNAUTHENTICATED
    assert await _code_of(balance("operator-token-2")) == grpc.StatusCode.OK


async def test_a_changed_auth_file_is_picked_up_without_a_signal(services, tmp_path: Path) -> None:
    """QUEUE_CREDENTIALS_RELOAD_SECONDS: the file's contents are checked and re-read when they
    change (what a Kubernetes Secret update does to the mounted file)."""
    auth = tmp_path / "auth.json"
    write_auth_file(auth, token_entry("operator", "operator", "leaked-token"))
    service = await services.start(auth_file=str(auth), credentials_reload_seconds=0.1)
    balance = lambda token: service.stubs.credits.GetBalance(  # noqa: E731
        credits_pb2.GetBalanceRequest(user_id="u"), metadata=_bearer(token), timeout=5
    )
    assert await _code_of(balance("leaked-token")) == grpc.StatusCode.OK
    write_auth_file(auth, token_entry("operator", "operator", "fresh-token"))

    async def revoked() -> bool:
        return await _code_of(balance("leaked-token")) == grpc.StatusCode.UNAUTHENTICATED

    await _eventually(revoked, "the revoked token is refused")
    assert await _code_of(balance("fresh-token")) == grpc.StatusCode.OK


# -- the listener's certificate ----------------------------------------------------------------


def _issue_server_certificate(ca: trustme.CA, folder: Path, name: str) -> tuple[Path, Path]:
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    cert.write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    key.write_bytes(issued.private_key_pem.bytes())
    return cert, key


def _tls_channel(address: str, ca: trustme.CA) -> grpc.aio.Channel:
    # A fresh channel each time (no subchannel sharing), so each one makes its own handshake.
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    return grpc.aio.secure_channel(address, credentials, options=[("grpc.use_local_subchannel_pool", 1)])


async def _health(channel: grpc.aio.Channel) -> grpc.StatusCode:
    return await _code_of(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3))


def _presented_certificate(port: int) -> x509.Certificate:
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    return x509.load_pem_x509_certificate(pem.encode())


async def test_sighup_rotates_the_listener_certificate_for_new_connections(services, database_url: str, tmp_path: Path) -> None:
    """After SIGHUP, new connections (gRPC and the browser listener) get the certificate of the
    new CA; a connection opened before keeps working; a key that does not fit is refused and the
    current certificate stays."""
    old_ca, new_ca = trustme.CA(), trustme.CA()
    cert_file, key_file = tmp_path / "server.pem", tmp_path / "server.key"
    old_cert, old_key = _issue_server_certificate(old_ca, tmp_path, "old")
    new_cert, new_key = _issue_server_certificate(new_ca, tmp_path, "new")
    cert_file.write_bytes(old_cert.read_bytes())
    key_file.write_bytes(old_key.read_bytes())
    auth = tmp_path / "auth.json"
    write_auth_file(auth, token_entry("operator", "operator", "operator-token"))

    core = await services.core()
    port, http_port = free_port(), free_port()
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "QUEUE_CORE_ADDR": f"127.0.0.1:{core.port}",
        "QUEUE_LISTEN_ADDR": f"127.0.0.1:{port}",
        "QUEUE_HTTP_ADDR": f"127.0.0.1:{http_port}",
        "QUEUE_MIGRATE_ON_START": "false",
        "QUEUE_SWEEP_INTERVAL_SECONDS": "0",
        "QUEUE_TLS_CERT_FILE": str(cert_file),
        "QUEUE_TLS_KEY_FILE": str(key_file),
        "QUEUE_AUTH_FILE": str(auth),
        "QUEUE_CREDENTIALS_RELOAD_SECONDS": "0",
        "QUEUE_LOG_FORMAT": "json",
    }
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "queue_service.cli", "serve"],
            env=environment,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    address = f"127.0.0.1:{port}"
    open_channels: list[grpc.aio.Channel] = []
    try:
        before = _tls_channel(address, old_ca)
        open_channels.append(before)

        async def serving() -> bool:
            assert process.poll() is None, log_path.read_text()[-3000:]
            return await _health(before) == grpc.StatusCode.OK

        await _eventually(serving, "the TLS replica serves", timeout=30)
        stub = credits_grpc.CreditsServiceStub(before)
        assert _presented_certificate(http_port) == x509.load_pem_x509_certificate(old_cert.read_bytes())

        cert_file.write_bytes(new_cert.read_bytes())
        key_file.write_bytes(new_key.read_bytes())
        process.send_signal(signal.SIGHUP)

        async def rotated() -> bool:
            return "new connections use the new certificate" in log_path.read_text()

        await _eventually(rotated, "the certificate reload is logged")
        trusting_new, trusting_old = _tls_channel(address, new_ca), _tls_channel(address, old_ca)
        open_channels += [trusting_new, trusting_old]
        assert await _health(trusting_new) == grpc.StatusCode.OK
        assert await _health(trusting_old) == grpc.StatusCode.UNAVAILABLE  # the old CA no longer vouches
        assert _presented_certificate(http_port) == x509.load_pem_x509_certificate(new_cert.read_bytes())
        # The connection opened before the reload carries on, calls included.
        answer = await stub.GetBalance(credits_pb2.GetBalanceRequest(user_id="u"), metadata=_bearer("operator-token"), timeout=5)
        assert answer.balance == 0

        # A key that is not the certificate's: refused, the new certificate stays in force.
        key_file.write_bytes(old_key.read_bytes())
        process.send_signal(signal.SIGHUP)

        async def refused() -> bool:
            return "is not the key of the first certificate" in log_path.read_text()

        await _eventually(refused, "the mismatched key is refused")
        again = _tls_channel(address, new_ca)
        open_channels.append(again)
        assert await _health(again) == grpc.StatusCode.OK
        assert process.poll() is None
    finally:
        for channel in open_channels:
            await channel.close()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_a_bad_certificate_at_start_is_a_configuration_error(tmp_path: Path) -> None:
    from queue_service.api.access.server_tls import read_tls_files
    from queue_service.config import ConfigError

    ca = trustme.CA()
    cert, key = _issue_server_certificate(ca, tmp_path, "a")
    _, other_key = _issue_server_certificate(ca, tmp_path, "b")
    assert read_tls_files(str(cert), str(key), "").certificate_chain == cert.read_bytes()
    with pytest.raises(ConfigError, match="is not the key of the first certificate"):
        read_tls_files(str(cert), str(other_key), "")
    with pytest.raises(ConfigError, match="QUEUE_TLS_CLIENT_CA_FILE"):
        read_tls_files(str(cert), str(key), str(key))
    with pytest.raises(ConfigError, match="not readable"):
        read_tls_files(str(tmp_path / "missing.pem"), str(key), "")


async def test_a_reload_swaps_the_client_ca_for_new_mutual_tls_connections(services, tmp_path: Path) -> None:
    """Moving clients to a new CA: after the reload, a client certificate of the old CA no longer
    completes a handshake and one of the new CA (same SAN) is the same caller."""
    server_ca, old_client_ca, new_client_ca = trustme.CA(), trustme.CA(), trustme.CA()
    cert, key = _issue_server_certificate(server_ca, tmp_path, "server")
    client_ca_file = tmp_path / "client-ca.pem"
    client_ca_file.write_bytes(old_client_ca.cert_pem.bytes())
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"certificates": [{"san": "ops-tool", "role": "operator"}]}))
    service = await services.start(
        tls_cert_file=str(cert),
        tls_key_file=str(key),
        tls_client_ca_file=str(client_ca_file),
        auth_file=str(auth),
        credentials_reload_seconds=0,
    )
    channels: list[grpc.aio.Channel] = []

    async def balance_with_certificate_of(ca: trustme.CA) -> grpc.StatusCode:
        issued = ca.issue_cert("ops-tool")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=server_ca.cert_pem.bytes(),
            private_key=issued.private_key_pem.bytes(),
            certificate_chain=issued.cert_chain_pems[0].bytes(),
        )
        channel = grpc.aio.secure_channel(service.address, credentials, options=[("grpc.use_local_subchannel_pool", 1)])
        channels.append(channel)
        stub = credits_grpc.CreditsServiceStub(channel)
        return await _code_of(stub.GetBalance(credits_pb2.GetBalanceRequest(user_id="u"), timeout=3))

    try:
        assert await balance_with_certificate_of(old_client_ca) == grpc.StatusCode.OK
        assert await balance_with_certificate_of(new_client_ca) == grpc.StatusCode.UNAVAILABLE
        client_ca_file.write_bytes(new_client_ca.cert_pem.bytes())
        assert service.app.reload_credentials() is True
        assert await balance_with_certificate_of(new_client_ca) == grpc.StatusCode.OK
        assert await balance_with_certificate_of(old_client_ca) == grpc.StatusCode.UNAVAILABLE
    finally:
        for channel in channels:
            await channel.close()
