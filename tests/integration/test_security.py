"""TLS, mutual TLS, bearer tokens and roles; every refusal with its code and ErrorInfo."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2 as callback_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2_grpc as callback_grpc,
)
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
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2_grpc as queue_grpc,
)
from queue_service.config import Config, ConfigError
from tests.harness import error_info, new_user, role_tokens

TOKENS = {"web": "web-secret-token", "core": "core-secret-token", "operator": "operator-secret-token"}


OPERATOR_URI = "spiffe://acurio.example/ns/ops/sa/operator"


def _issue_with_uri_san(ca: trustme.CA, *, common_name: str, uri: str) -> tuple[bytes, bytes]:
    """A client certificate signed by `ca` whose only SAN is a URI (trustme issues DNS, IP and
    e-mail SANs only)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


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
    # file name: (subject common name, DNS subject alternative names)
    clients = {
        "web-backend": ("web-backend", ["web-backend"]),
        "rust-core": ("rust-core", ["rust-core"]),
        "stranger": ("stranger", ["stranger"]),
        # The identity that counts is the SAN: this one is the core, whatever its CN says ...
        "cn-stranger-san-rust-core": ("stranger", ["rust-core"]),
        # ... and this one is a stranger, although its CN names the core.
        "cn-rust-core-san-stranger": ("rust-core", ["stranger"]),
        # Names two identities of the auth file: refused, not resolved by order.
        "two-identities": ("two", ["rust-core", "web-backend"]),
    }
    for name, (common_name, sans) in clients.items():
        client = ca.issue_cert(*sans, common_name=common_name)
        files[f"{name}_cert"], files[f"{name}_key"] = folder / f"{name}.pem", folder / f"{name}.key"
        client.cert_chain_pems[0].write_to_path(str(files[f"{name}_cert"]))
        client.private_key_pem.write_to_path(str(files[f"{name}_key"]))
    # A workload identity as a URI SAN (SPIFFE style), with a CN that names nobody.
    cert_pem, key_pem = _issue_with_uri_san(ca, common_name="operator-workload", uri=OPERATOR_URI)
    files["spiffe-operator_cert"], files["spiffe-operator_key"] = folder / "spiffe-operator.pem", folder / "spiffe-operator.key"
    files["spiffe-operator_cert"].write_bytes(cert_pem)
    files["spiffe-operator_key"].write_bytes(key_pem)
    auth = {
        "tokens": role_tokens(TOKENS),
        "certificates": [
            {"san": "web-backend", "role": "web"},
            {"san": "rust-core", "role": "core"},
            {"san": OPERATOR_URI, "role": "operator"},
        ],
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
async def tls_service(services, pki):
    return await services.start(tls_cert_file=str(pki["server_cert"]), tls_key_file=str(pki["server_key"]), auth_file=str(pki["auth"]))


async def _refusal(call) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    code, reason, metadata, _ = error_info(raised.value)
    return code, reason, metadata


async def test_each_role_may_call_its_methods_and_is_refused_the_others(tls_service, pki) -> None:
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
        assert (await _refusal(queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=5, metadata=_token("core"))))[
            1
        ] == "PERMISSION_DENIED"

        # Health is open; reflection is the operators' (a 50-byte request answers ~60 KB).
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert await _list_services(channel) == grpc.StatusCode.UNAUTHENTICATED
        assert await _list_services(channel, _token("web")) == grpc.StatusCode.PERMISSION_DENIED
        assert await _list_services(channel, _token("core")) == grpc.StatusCode.PERMISSION_DENIED
        assert "acurio.queue.v1.AnalysisQueueService" in await _list_services(channel, _token("operator"))


_REFLECTION_INFO = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


async def _list_services(channel: grpc.aio.Channel, metadata=None):
    """The services reflection lists, or the status that refused the call. Asked as one message
    sent with its half-close: through the bidi stub the request is a write of its own, and when the
    server refuses at once (UNAUTHENTICATED, UNIMPLEMENTED) grpc.aio's client can lose that race
    and read INTERNAL instead (grpc/grpc issue 36066; 2 calls in 3 000 on one starved core)."""
    list_services = channel.unary_unary(
        _REFLECTION_INFO,
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    try:
        response = await list_services(reflection_pb2.ServerReflectionRequest(list_services=""), timeout=5, metadata=metadata)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return [s.name for s in response.list_services_response.service]


async def test_mutual_tls_identifies_callers_by_certificate(services, pki) -> None:
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


async def test_a_client_certificate_is_identified_by_its_subject_alternative_name_never_its_common_name(services, pki) -> None:
    """CN `stranger` with SAN `rust-core` is the core; CN `rust-core` with SAN `stranger` is nobody
    (it was once authorized as the core through its CN). A URI SAN identifies as well as a DNS
    SAN; a certificate naming two identities of the file is refused."""
    service = await services.start(
        tls_cert_file=str(pki["server_cert"]),
        tls_key_file=str(pki["server_key"]),
        tls_client_ca_file=str(pki["ca"]),
        auth_file=str(pki["auth"]),
    )
    unknown_run = callback_pb2.CompleteRunRequest(run_id="00000000-0000-4000-8000-000000000000", outcome=callback_pb2.RUN_OUTCOME_FAILED)

    async def complete_run(client: str) -> tuple[grpc.StatusCode, str, dict[str, str]]:
        async with _channel(service.address, pki, client) as channel:
            return await _refusal(callback_grpc.CoreCallbackServiceStub(channel).CompleteRun(unknown_run, timeout=5))

    # Authorized as `core`: the call reaches the handler, which knows no such run.
    assert (await complete_run("cn-stranger-san-rust-core"))[:2] == (grpc.StatusCode.NOT_FOUND, "RUN_NOT_FOUND")
    assert (await complete_run("cn-rust-core-san-stranger"))[:2] == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    code, reason, metadata = await complete_run("two-identities")
    assert (code, reason, metadata["subjectAlternativeNames"]) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "UNAUTHENTICATED",
        "rust-core,web-backend",
    )

    async with _channel(service.address, pki, "spiffe-operator") as channel:
        balance = await credits_grpc.CreditsServiceStub(channel).GetBalance(credits_pb2.GetBalanceRequest(user_id=new_user()), timeout=5)
        assert balance.balance == 0
        code, reason, metadata = await _refusal(callback_grpc.CoreCallbackServiceStub(channel).CompleteRun(unknown_run, timeout=5))
        assert (code, metadata["role"], metadata["caller"]) == (grpc.StatusCode.PERMISSION_DENIED, "operator", OPERATOR_URI)


def test_certificate_entries_name_one_subject_alternative_name(tmp_path: Path) -> None:
    from queue_service.api.access.auth import AuthConfigError, Authorizer, _identify_certificate

    def load(*entries: dict[str, str]) -> Authorizer:
        path = tmp_path / "auth.json"
        path.write_text(json.dumps({"certificates": list(entries)}))
        return Authorizer.from_file(str(path))

    def identify(authorizer: Authorizer, **auth_context: str):
        """The caller for a verified certificate gRPC describes with these auth-context properties."""
        return _identify_certificate(authorizer._callers.certificates, {name: [value.encode()] for name, value in auth_context.items()})

    authorizer = load({"san": "rust-core", "role": "core"})
    assert identify(authorizer, peer_dns="rust-core").role == "core"
    assert identify(authorizer, x509_common_name="rust-core") is None
    assert identify(authorizer, peer_dns="Rust-Core") is None  # exact, no case folding
    # The old spelling means the same thing (a SAN), so existing files keep working.
    legacy = load({"common_name": "rust-core", "role": "core"})
    assert identify(legacy, peer_dns="rust-core").role == "core"
    assert identify(legacy, x509_common_name="rust-core", peer_dns="stranger") is None
    with pytest.raises(AuthConfigError, match="both `san` and `common_name`"):
        load({"san": "rust-core", "common_name": "rust-core", "role": "core"})
    with pytest.raises(AuthConfigError, match="appears twice"):
        load({"san": "rust-core", "role": "core"}, {"san": "rust-core", "role": "operator"})
    with pytest.raises(AuthConfigError, match=r"certificates\[0\]\.san is required"):
        load({"role": "core"})


async def test_the_dev_core_reports_completions_with_its_token(services, pki) -> None:
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

    async def queue_status() -> int:
        request = queue_pb2.GetJobRequest(job_id=second.job_id)
        return (await service.stubs.queue.GetJob(request, timeout=5, metadata=_token("web"))).job.status

    # The core judges once ReleaseRun reached it; the queue marks the job RUNNING when the answer
    # is back. Wait for that, so the refused callback below is the only thing that could change it.
    for _ in range(200):
        if await queue_status() == job_pb2.JOB_STATUS_RUNNING:
            break
        await asyncio.sleep(0.02)
    assert await queue_status() == job_pb2.JOB_STATUS_RUNNING
    core.callback_token = TOKENS["web"]  # the wrong role: the callback is refused
    assert await core.finish(second.run_id) is None
    assert await queue_status() == job_pb2.JOB_STATUS_RUNNING


async def test_reflection_can_be_turned_off(services) -> None:
    service = await services.start(reflection=False)
    assert await _list_services(service.stubs.channel) == grpc.StatusCode.UNIMPLEMENTED


async def test_the_core_can_be_called_over_tls(services, pki) -> None:
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


def test_a_public_listener_without_authentication_is_refused(pki) -> None:
    base = {"database_url": "postgresql://x/y", "core_addr": "127.0.0.1:1"}
    with pytest.raises(ConfigError, match="QUEUE_AUTH_FILE"):
        Config.from_env({"QUEUE_LISTEN_ADDR": "0.0.0.0:50051"}, **base).require_service_targets()
    tls = {"QUEUE_TLS_CERT_FILE": str(pki["server_cert"]), "QUEUE_TLS_KEY_FILE": str(pki["server_key"])}
    Config.from_env({"QUEUE_LISTEN_ADDR": "0.0.0.0:50051", "QUEUE_AUTH_FILE": str(pki["auth"]), **tls}, **base).require_service_targets()
    Config.from_env({"QUEUE_LISTEN_ADDR": "0.0.0.0:50051", "QUEUE_ALLOW_UNAUTHENTICATED": "true"}, **base).require_service_targets()
    with pytest.raises(ConfigError, match="must be set together"):
        Config.from_env({"QUEUE_TLS_CERT_FILE": str(pki["server_cert"])})
    with pytest.raises(ConfigError, match="no such file"):
        Config.from_env({"QUEUE_AUTH_FILE": "/nonexistent/auth.json"})


@pytest.mark.parametrize("listener", ["QUEUE_LISTEN_ADDR", "QUEUE_HTTP_ADDR"])
def test_bearer_tokens_are_never_served_in_plaintext_beyond_loopback(pki, listener: str) -> None:
    """With an auth file, a non-loopback listener without TLS of its own would carry tokens
    readable on the wire: refused, unless the operator says TLS ends in front of it."""
    base = {"database_url": "postgresql://x/y", "core_addr": "127.0.0.1:1"}
    public = {"QUEUE_LISTEN_ADDR": "127.0.0.1:50051", listener: "0.0.0.0:50051", "QUEUE_AUTH_FILE": str(pki["auth"])}
    with pytest.raises(
        ConfigError, match=rf"{listener}=0.0.0.0:50051 is not a loopback address and serves plaintext.*QUEUE_TLS_TERMINATED_UPSTREAM=true"
    ):
        Config.from_env(public, **base).require_service_targets()
    with pytest.raises(ConfigError, match="QUEUE_TLS_TERMINATED_UPSTREAM"):
        Config.from_env({**public, "QUEUE_TLS_TERMINATED_UPSTREAM": "false"}, **base).require_service_targets()
    # TLS of its own (one certificate serves both listeners).
    tls = {"QUEUE_TLS_CERT_FILE": str(pki["server_cert"]), "QUEUE_TLS_KEY_FILE": str(pki["server_key"])}
    Config.from_env({**public, **tls}, **base).require_service_targets()
    # TLS terminated by a mesh or ingress in front, stated explicitly.
    Config.from_env({**public, "QUEUE_TLS_TERMINATED_UPSTREAM": "true"}, **base).require_service_targets()
    # Loopback only: tokens never leave the machine.
    Config.from_env({**public, listener: "[::1]:50051"}, **base).require_service_targets()
    Config.from_env({**public, listener: "localhost:50051"}, **base).require_service_targets()


async def test_a_request_with_a_thousand_bad_dois_is_invalid_argument_with_a_bounded_bad_request(service) -> None:
    """1 000 invalid DOIs once made a 156 KB error trailer, which a default client refused with
    RESOURCE_EXHAUSTED. The BadRequest lists 50 violations and says how many it left out."""
    user = new_user()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await service.stubs.admit(user, dois=tuple(f"not-a-doi-{i}" for i in range(1000)))
    code, reason, metadata, violations = error_info(refused.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert len(violations) == 50
    assert metadata == {"violations": "1000", "violationsNotListed": "950"}


async def test_list_jobs_refuses_a_status_filter_longer_than_there_are_statuses(service) -> None:
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
