"""TLS, mutual TLS, bearer tokens and roles; every refusal with its code and ErrorInfo."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from queue_service.config import Config, ConfigError
from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2 as callback_pb2,
    core_callback_service_pb2_grpc as callback_grpc,
    credits_service_pb2 as credits_pb2,
    credits_service_pb2_grpc as credits_grpc,
    job_pb2,
    queue_service_pb2 as queue_pb2,
    queue_service_pb2_grpc as queue_grpc,
)
from tests.harness import error_info, new_user

TOKENS = {"web": "web-secret-token", "core": "core-secret-token", "operator": "operator-secret-token"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    files: dict[str, Path] = {"ca": folder / "ca.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server = ca.issue_cert("127.0.0.1", "localhost")
    files["server_cert"], files["server_key"] = folder / "server.pem", folder / "server.key"
    server.cert_chain_pems[0].write_to_path(str(files["server_cert"]))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(files["server_cert"]), append=True)
    server.private_key_pem.write_to_path(str(files["server_key"]))
    for name in ("web-backend", "rust-core", "stranger"):
        client = ca.issue_cert(name, common_name=name)
        files[f"{name}_cert"], files[f"{name}_key"] = folder / f"{name}.pem", folder / f"{name}.key"
        client.cert_chain_pems[0].write_to_path(str(files[f"{name}_cert"]))
        client.private_key_pem.write_to_path(str(files[f"{name}_key"]))
    auth = {
        "tokens": [{"name": f"{role}-caller", "role": role, "sha256": hashlib.sha256(t.encode()).hexdigest()} for role, t in TOKENS.items()],
        "certificates": [{"common_name": "web-backend", "role": "web"}, {"common_name": "rust-core", "role": "core"}],
    }
    files["auth"] = folder / "auth.json"
    files["auth"].write_text(json.dumps(auth))
    return files


def _channel(address: str, pki: dict[str, Path], client: str | None = None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki[f"{client}_key"].read_bytes() if client else None,
        certificate_chain=pki[f"{client}_cert"].read_bytes() if client else None,
    )
    return grpc.aio.secure_channel(address, credentials)


def _token(role: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[role]}"),)


def _admit_request(user: str) -> queue_pb2.AdmitRequest:
    return queue_pb2.AdmitRequest(
        user_id=user, idempotency_key="k", document=job_pb2.Document(uri="s3://x"), sources=[job_pb2.Source(doi="10.1234/a")]
    )


@pytest.fixture
async def tls_service(services, pki):  # type: ignore[no-untyped-def]
    return await services.start(
        tls_cert_file=str(pki["server_cert"]), tls_key_file=str(pki["server_key"]), auth_file=str(pki["auth"])
    )


async def _refusal(call) -> tuple[grpc.StatusCode, str, dict[str, str]]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    code, reason, metadata, _ = error_info(raised.value)
    return code, reason, metadata


async def test_each_role_may_call_its_methods_and_is_refused_the_others(tls_service, pki) -> None:  # type: ignore[no-untyped-def]
    async with _channel(tls_service.address, pki) as channel:
        queue = queue_grpc.AnalysisQueueServiceStub(channel)
        credits = credits_grpc.CreditsServiceStub(channel)
        callback = callback_grpc.CoreCallbackServiceStub(channel)
        user = new_user()
        unknown_run = callback_pb2.CompleteRunRequest(
            run_id="00000000-0000-4000-8000-000000000000", outcome=callback_pb2.RUN_OUTCOME_SUCCEEDED
        )

        # No credentials at all: UNAUTHENTICATED, with an ErrorInfo, for every protected service.
        for call in (
            queue.Admit(_admit_request(user), timeout=5),
            credits.GetBalance(credits_pb2.GetBalanceRequest(user_id=user), timeout=5),
            callback.CompleteRun(unknown_run, timeout=5),
        ):
            code, reason, metadata = await _refusal(call)
            assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED") and "method" in metadata
        code, reason, _ = await _refusal(queue.Admit(_admit_request(user), timeout=5, metadata=(("authorization", "Bearer wrong"),)))
        assert reason == "UNAUTHENTICATED"

        # Operator: credits and tooling; not admits, not completions.
        grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=2, idempotency_key="g")
        assert (await credits.GrantCredits(grant, timeout=5, metadata=_token("operator"))).balance == 2
        assert not (await queue.Promote(queue_pb2.PromoteRequest(user_id=user), timeout=5, metadata=_token("operator"))).HasField("job")
        code, reason, metadata = await _refusal(queue.Admit(_admit_request(user), timeout=5, metadata=_token("operator")))
        assert (code, reason, metadata["role"]) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED", "operator")

        # Web backend: the queue; not credits, not tooling, not completions.
        job = (await queue.Admit(_admit_request(user), timeout=5, metadata=_token("web"))).job
        assert job.status == job_pb2.JOB_STATUS_PENDING
        for call in (
            credits.GrantCredits(grant, timeout=5, metadata=_token("web")),
            queue.Promote(queue_pb2.PromoteRequest(user_id=user), timeout=5, metadata=_token("web")),
            queue.Release(queue_pb2.ReleaseRequest(job_id=job.job_id), timeout=5, metadata=_token("web")),
            callback.CompleteRun(unknown_run, timeout=5, metadata=_token("web")),
        ):
            assert (await _refusal(call))[:2] == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")

        # Core: completions only.
        assert (await _refusal(callback.CompleteRun(unknown_run, timeout=5, metadata=_token("core"))))[1] == "RUN_NOT_FOUND"
        assert (await _refusal(queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=5, metadata=_token("core"))))[1] == "PERMISSION_DENIED"

        # Health is open; reflection needs any authenticated caller.
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert await _list_services(channel) == grpc.StatusCode.UNAUTHENTICATED
        assert "acurio.queue.v1.AnalysisQueueService" in await _list_services(channel, _token("web"))


async def _list_services(channel: grpc.aio.Channel, metadata=None):  # type: ignore[no-untyped-def]
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5, metadata=metadata)
    try:
        async for response in call:
            return [s.name for s in response.list_services_response.service]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return []


async def test_mutual_tls_identifies_callers_by_certificate(services, pki) -> None:  # type: ignore[no-untyped-def]
    service = await services.start(
        tls_cert_file=str(pki["server_cert"]),
        tls_key_file=str(pki["server_key"]),
        tls_client_ca_file=str(pki["ca"]),
        auth_file=str(pki["auth"]),
    )
    unknown_run = callback_pb2.CompleteRunRequest(run_id="00000000-0000-4000-8000-000000000000", outcome=callback_pb2.RUN_OUTCOME_FAILED)
    async with _channel(service.address, pki, "rust-core") as channel:
        callback = callback_grpc.CoreCallbackServiceStub(channel)
        assert (await _refusal(callback.CompleteRun(unknown_run, timeout=5)))[1] == "RUN_NOT_FOUND"
        queue = queue_grpc.AnalysisQueueServiceStub(channel)
        assert (await _refusal(queue.GetJob(queue_pb2.GetJobRequest(job_id=unknown_run.run_id), timeout=5)))[1] == "PERMISSION_DENIED"
    async with _channel(service.address, pki, "web-backend") as channel:
        queue = queue_grpc.AnalysisQueueServiceStub(channel)
        assert (await _refusal(queue.GetJob(queue_pb2.GetJobRequest(job_id=unknown_run.run_id), timeout=5)))[1] == "JOB_NOT_FOUND"
    async with _channel(service.address, pki, "stranger") as channel:
        queue = queue_grpc.AnalysisQueueServiceStub(channel)
        assert (await _refusal(queue.GetJob(queue_pb2.GetJobRequest(job_id=unknown_run.run_id), timeout=5)))[1] == "UNAUTHENTICATED"
    async with _channel(service.address, pki) as channel:  # no client certificate: the handshake fails
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_dev_core_reports_completions_with_its_token(services, pki) -> None:  # type: ignore[no-untyped-def]
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=str(pki["auth"]))
    user = new_user()
    grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=2, idempotency_key="g")
    await service.stubs.credits.GrantCredits(grant, timeout=5, metadata=_token("operator"))
    first = (await service.stubs.queue.Admit(_admit_request(user), timeout=5, metadata=_token("web"))).job
    second_request = _admit_request(user)
    second_request.idempotency_key = "k2"
    second = (await service.stubs.queue.Admit(second_request, timeout=5, metadata=_token("web"))).job

    async def released(run_id: str) -> None:
        for _ in range(200):
            if core.runs[run_id].state == 2:  # RUN_STATE_JUDGING: the queue released it
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"run {run_id} was never released")

    await released(first.run_id)
    response = await core.finish(first.run_id)
    assert response is not None and response.job.status == job_pb2.JOB_STATUS_SUCCEEDED

    await released(second.run_id)
    core.callback_token = TOKENS["web"]  # the wrong role: the callback is refused
    assert await core.finish(second.run_id) is None
    job = (await service.stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=second.job_id), timeout=5, metadata=_token("web"))).job
    assert job.status == job_pb2.JOB_STATUS_RUNNING


async def test_reflection_can_be_turned_off(services) -> None:  # type: ignore[no-untyped-def]
    service = await services.start(reflection=False)
    assert await _list_services(service.stubs.channel) == grpc.StatusCode.UNIMPLEMENTED


async def test_the_core_can_be_called_over_tls(services, pki) -> None:  # type: ignore[no-untyped-def]
    core = await services.core()
    await core.stop()
    credentials = grpc.ssl_server_credentials([(pki["server_key"].read_bytes(), pki["server_cert"].read_bytes())])
    await core.start("127.0.0.1:0", credentials=credentials)
    service = await services.start(core, core_addr=f"localhost:{core.port}", core_tls_ca_file=str(pki["ca"]))
    user = new_user()
    await service.stubs.grant(user, 1)
    job = await service.stubs.admit(user)
    assert job.run_id in core.runs
    await service.stubs.wait_for(job.job_id, job_pb2.JOB_STATUS_RUNNING)


def test_a_public_listener_without_authentication_is_refused(pki) -> None:  # type: ignore[no-untyped-def]
    base = {"database_url": "postgresql://x/y", "core_addr": "127.0.0.1:1"}
    with pytest.raises(ConfigError, match="QUEUE_AUTH_FILE"):
        Config.from_env({"QUEUE_LISTEN_ADDR": "0.0.0.0:50051"}, **base).require_service_targets()
    Config.from_env({"QUEUE_LISTEN_ADDR": "0.0.0.0:50051", "QUEUE_AUTH_FILE": str(pki["auth"])}, **base).require_service_targets()
    Config.from_env({"QUEUE_LISTEN_ADDR": "0.0.0.0:50051", "QUEUE_ALLOW_UNAUTHENTICATED": "true"}, **base).require_service_targets()
    with pytest.raises(ConfigError, match="must be set together"):
        Config.from_env({"QUEUE_TLS_CERT_FILE": str(pki["server_cert"])})
    with pytest.raises(ConfigError, match="no such file"):
        Config.from_env({"QUEUE_AUTH_FILE": "/nonexistent/auth.json"})


async def test_a_request_with_a_thousand_bad_dois_is_invalid_argument_with_a_bounded_bad_request(service) -> None:  # type: ignore[no-untyped-def]
    """1 000 invalid DOIs once made a 156 KB error trailer, which a default client refused with
    RESOURCE_EXHAUSTED. The BadRequest lists 50 violations and says how many it left out."""
    user = new_user()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await service.stubs.admit(user, dois=tuple(f"not-a-doi-{i}" for i in range(1000)))
    code, reason, metadata, violations = error_info(refused.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert len(violations) == 50
    assert metadata == {"violations": "1000", "violationsNotListed": "950"}


async def test_list_jobs_refuses_a_status_filter_longer_than_there_are_statuses(service) -> None:  # type: ignore[no-untyped-def]
    from queue_service._gen.acurio.queue.v1 import queue_service_pb2

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await service.stubs.queue.ListJobs(queue_service_pb2.ListJobsRequest(user_id="u", statuses=[1] * 100_000), timeout=5)
    code, reason, metadata, violations = error_info(refused.value)
    assert (code, reason, [f for f, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", ["statuses"])


def test_text_logs_quote_values_so_a_user_id_cannot_forge_fields() -> None:
    import logging

    from queue_service.telemetry import TextFormatter

    record = logging.LogRecord("queue_service", logging.INFO, __file__, 1, "job admitted", None, None)
    record.user_id = "eve status=succeeded\nforged line"
    record.status = "queued"
    line = TextFormatter().format(record)
    assert 'user_id="eve status=succeeded\\nforged line"' in line
    assert "\n" not in line and line.count("status=") == 2  # the real field, and the quoted text


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.8.9.10:50051", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("127.attacker.example:50051", False),
        ("127.0.0.1.nip.io:50051", False),
        ("0.0.0.0:50051", False),
        ("10.0.0.5:50051", False),
    ],
)
def test_only_literal_loopback_addresses_may_serve_without_authentication(address: str, loopback: bool) -> None:
    """A name that merely starts with 127. is resolved wherever its owner likes: it needs auth."""
    config = Config.from_env({}, database_url="postgresql://x", core_addr="127.0.0.1:1", listen_addr=address)
    assert config.listens_on_loopback is loopback
    if loopback:
        config.require_service_targets()
    else:
        with pytest.raises(ConfigError, match="not a loopback address"):
            config.require_service_targets()
