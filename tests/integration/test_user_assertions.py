"""Per-user assertions (QUEUE_USER_ASSERTION_KEY_FILE): the `web` role acts only for the user a
signed, short-lived JWT names; other roles and a service without a key are unaffected."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2 as callback_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    credits_service_pb2 as credits_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    job_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2 as queue_pb2,
)
from queue_service.api.access.user_assertions import AssertionVerifier, load_keys
from queue_service.config import Config, ConfigError
from queue_service.errors import UserAssertionInvalid
from tests import connect_client
from tests.harness import error_info, new_user, role_tokens

TOKENS = {"web": "web-token-for-assertions", "core": "core-token-for-assertions", "operator": "operator-token-for-assertions"}
ISSUER = "https://web.acurio.example"
AUDIENCE = "acurio-queue"  # the default of QUEUE_USER_ASSERTION_AUDIENCE
SIGNING_KEY = ed25519.Ed25519PrivateKey.generate()


def _public_pem(private_key: Any) -> bytes:
    return private_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("assertions")
    auth = {"tokens": role_tokens(TOKENS)}
    (folder / "auth.json").write_text(json.dumps(auth))
    (folder / "web-backend.pub.pem").write_bytes(_public_pem(SIGNING_KEY))
    return {"auth": folder / "auth.json", "key": folder / "web-backend.pub.pem", "folder": folder}


def mint(
    user: str | None, *, key: Any = SIGNING_KEY, algorithm: str = "EdDSA", lifetime: int = 60, issued_ago: int = 0, **claims: Any
) -> str:
    """An assertion as the web backend signs it; a claim given as None is left out."""
    now = int(time.time()) - issued_ago
    payload = {"sub": user, "aud": AUDIENCE, "iss": ISSUER, "iat": now, "exp": now + lifetime, **claims}
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, key, algorithm=algorithm)


def web(assertion: str | None = None) -> tuple[tuple[str, str], ...]:
    metadata = (("authorization", f"Bearer {TOKENS['web']}"),)
    return metadata + ((("x-user-assertion", assertion),) if assertion is not None else ())


def operator() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS['operator']}"),)


def admit_request(user: str, key: str = "k") -> queue_pb2.AdmitRequest:
    return queue_pb2.AdmitRequest(
        user_id=user, idempotency_key=key, document=job_pb2.Document(uri="s3://x"), sources=[job_pb2.Source(doi="10.1234/a")]
    )


async def refusal(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str], list[tuple[str, str]]]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return error_info(raised.value)


@pytest.fixture
async def asserting_service(services, files):  # type: ignore[no-untyped-def]
    core = await services.core(callback_token=TOKENS["core"])
    return await services.start(
        core, auth_file=str(files["auth"]), user_assertion_key_file=str(files["key"]), user_assertion_issuer=ISSUER, http_addr="127.0.0.1:0"
    )


async def _first_watch_message(queue: Any, user: str, metadata: Any) -> queue_pb2.WatchJobsResponse:
    call = queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), timeout=5, metadata=metadata)
    try:
        async for message in call:
            return message
        raise AssertionError("the stream ended without a message")
    finally:
        call.cancel()


async def test_the_web_role_acts_only_for_the_user_its_assertion_names(asserting_service) -> None:  # type: ignore[no-untyped-def]
    """Every `web` method: no assertion is UNAUTHENTICATED, another user's is PERMISSION_DENIED
    USER_MISMATCH (nothing charged, nothing read), the right one goes through."""
    stubs, alice, mallory = asserting_service.stubs, new_user(), new_user()
    queue = stubs.queue
    await stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=alice, amount=3, idempotency_key="g"), timeout=5, metadata=operator()
    )

    code, reason, metadata, _ = await refusal(queue.Admit(admit_request(alice), timeout=5, metadata=web()))
    assert (code, reason, metadata) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "USER_ASSERTION_INVALID",
        {"method": "/acurio.queue.v1.AnalysisQueueService/Admit", "problem": "missing"},
    )
    # A backend bug sends alice's id with mallory's session: refused before anything is charged.
    code, reason, metadata, _ = await refusal(queue.Admit(admit_request(alice), timeout=5, metadata=web(mint(mallory))))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "USER_MISMATCH")
    assert metadata == {"method": "/acurio.queue.v1.AnalysisQueueService/Admit", "userId": alice, "assertionSubject": mallory}
    balance = await stubs.credits.GetBalance(credits_pb2.GetBalanceRequest(user_id=alice), timeout=5, metadata=operator())
    assert balance.balance == 3

    job = (await queue.Admit(admit_request(alice), timeout=5, metadata=web(mint(alice)))).job
    assert job.user_id == alice and job.status == job_pb2.JOB_STATUS_PENDING

    as_alice, as_mallory = web(mint(alice)), web(mint(mallory))
    reads = {
        "ListJobs": lambda user, md: queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=5, metadata=md),
        "GetJob": lambda user, md: queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id, user_id=user), timeout=5, metadata=md),
        "WatchJobs": lambda user, md: _first_watch_message(queue, user, md),
    }
    for name, call in reads.items():
        for metadata in (web(), as_mallory):
            code, reason, details, _ = await refusal(call(alice, metadata))
            expected = (
                (grpc.StatusCode.UNAUTHENTICATED, "USER_ASSERTION_INVALID")
                if metadata == web()
                else (grpc.StatusCode.PERMISSION_DENIED, "USER_MISMATCH")
            )
            assert (code, reason, details["method"]) == (*expected, f"/acurio.queue.v1.AnalysisQueueService/{name}")
    assert [j.job_id for j in (await reads["ListJobs"](alice, as_alice)).jobs] == [job.job_id]
    assert (await reads["GetJob"](alice, as_alice)).job.job_id == job.job_id
    assert (await reads["WatchJobs"](alice, as_alice)).job.job_id == job.job_id
    # Mallory's own, valid assertion does not reach alice's job through GetJob's scope either.
    assert (await refusal(reads["GetJob"](mallory, as_mallory)))[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    # With assertions on, GetJob must say whose job it reads.
    code, reason, _, violations = await refusal(queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=5, metadata=as_alice))
    assert (code, reason, [field for field, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", ["user_id"])

    cancel = queue_pb2.CancelJobRequest(job_id=job.job_id, user_id=alice)
    assert (await refusal(queue.CancelJob(cancel, timeout=5, metadata=as_mallory)))[1] == "USER_MISMATCH"
    assert (await refusal(queue.CancelJob(cancel, timeout=5, metadata=web())))[1] == "USER_ASSERTION_INVALID"
    still = await queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=5, metadata=operator())
    assert still.job.status in (job_pb2.JOB_STATUS_PENDING, job_pb2.JOB_STATUS_RUNNING)  # the refused cancels changed nothing
    canceled = await queue.CancelJob(cancel, timeout=5, metadata=as_alice)
    assert canceled.job.status == job_pb2.JOB_STATUS_CANCELED


@pytest.mark.parametrize(
    ("problem", "assertion"),
    [
        ("expired", lambda user: mint(user, issued_ago=200, lifetime=100)),  # expired 100 s ago, beyond the 30 s leeway
        ("not_yet_valid", lambda user: mint(user, issued_ago=-120)),
        ("bad_signature", lambda user: mint(user, key=ed25519.Ed25519PrivateKey.generate())),
        ("wrong_audience", lambda user: mint(user, aud="another-service")),
        ("wrong_issuer", lambda user: mint(user, iss="https://elsewhere.example")),
        ("missing_claim", lambda user: mint(user, exp=None)),
        ("missing_claim", lambda user: mint(None)),
        ("too_long_lived", lambda user: mint(user, lifetime=3600)),
        # `alg: none` and an HMAC signed with the public key (algorithm confusion) are refused.
        (
            "wrong_algorithm",
            lambda user: jwt.encode(
                {"sub": user, "aud": AUDIENCE, "iss": ISSUER, "iat": int(time.time()), "exp": int(time.time()) + 60}, None, algorithm="none"
            ),
        ),
        ("wrong_algorithm", lambda user: mint(user, key=b"not the key" * 4, algorithm="HS256")),
        ("malformed", lambda user: "not.a.jwt"),
        ("malformed", lambda user: "x" * 5000),
    ],
)
async def test_an_assertion_that_does_not_verify_is_unauthenticated_with_its_problem(
    asserting_service, problem: str, assertion: Any
) -> None:  # type: ignore[no-untyped-def]
    user = new_user()
    request = queue_pb2.ListJobsRequest(user_id=user)
    code, reason, metadata, _ = await refusal(asserting_service.stubs.queue.ListJobs(request, timeout=5, metadata=web(assertion(user))))
    assert (code, reason, metadata.get("problem")) == (grpc.StatusCode.UNAUTHENTICATED, "USER_ASSERTION_INVALID", problem)
    # The same call with a good assertion goes through: the refusal was the assertion's.
    await asserting_service.stubs.queue.ListJobs(request, timeout=5, metadata=web(mint(user)))


async def test_operator_and_core_calls_need_no_assertion(asserting_service) -> None:  # type: ignore[no-untyped-def]
    stubs, user = asserting_service.stubs, new_user()
    await stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=1, idempotency_key="g"), timeout=5, metadata=operator()
    )
    job = (await stubs.queue.Admit(admit_request(user), timeout=5, metadata=web(mint(user)))).job
    assert (await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=5, metadata=operator())).job.user_id == user
    assert len((await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=5, metadata=operator())).jobs) == 1
    canceled = await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=5, metadata=operator())
    assert canceled.job.status == job_pb2.JOB_STATUS_CANCELED
    unknown_run = callback_pb2.CompleteRunRequest(run_id=str(uuid.uuid4()), outcome=callback_pb2.RUN_OUTCOME_SUCCEEDED)
    core = (("authorization", f"Bearer {TOKENS['core']}"),)
    assert (await refusal(stubs.callback.CompleteRun(unknown_run, timeout=5, metadata=core)))[1] == "RUN_NOT_FOUND"
    # The roles still hold: an assertion does not let `web` call what its role may not.
    promote = stubs.queue.Promote(queue_pb2.PromoteRequest(user_id=user), timeout=5, metadata=web(mint(user)))
    assert (await refusal(promote))[1] == "PERMISSION_DENIED"


async def test_without_a_key_the_web_role_works_as_before(services, files) -> None:  # type: ignore[no-untyped-def]
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=str(files["auth"]))
    user = new_user()
    await service.stubs.credits.GrantCredits(
        credits_pb2.GrantCreditsRequest(user_id=user, amount=1, idempotency_key="g"), timeout=5, metadata=operator()
    )
    job = (await service.stubs.queue.Admit(admit_request(user), timeout=5, metadata=web())).job
    assert (await service.stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=5, metadata=web())).job.user_id == user
    # An assertion sent anyway is not read (not even a broken one).
    listed = await service.stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=5, metadata=web("not.a.jwt"))
    assert [j.job_id for j in listed.jobs] == [job.job_id]


async def test_the_browser_endpoint_checks_assertions_like_grpc(asserting_service) -> None:  # type: ignore[no-untyped-def]
    port, alice, mallory = asserting_service.app.http_port, new_user(), new_user()

    def post(method: str, message: dict[str, Any], assertion: str | None, *, stream: bool = False) -> tuple[int, bytes]:
        headers = {"content-type": "application/connect+json" if stream else "application/json", "connect-protocol-version": "1"}
        headers["authorization"] = f"Bearer {TOKENS['web']}"
        if assertion is not None:
            headers["x-user-assertion"] = assertion
        body = json.dumps(message).encode()
        if stream:
            headers["connect-timeout-ms"] = "1000"
            body = struct.pack(">BI", 0, len(body)) + body
        status, _, answer = connect_client.post(port, f"/acurio.queue.v1.AnalysisQueueService/{method}", body, headers)
        return status, answer

    async def unary(method: str, message: dict[str, Any], assertion: str | None) -> tuple[int, str, dict[str, Any]]:
        status, body = await asyncio.to_thread(post, method, message, assertion)
        answer = json.loads(body)
        return status, connect_client.error_details(answer)[0] if status != 200 else "", answer

    assert (await unary("ListJobs", {"userId": alice}, None))[:2] == (401, "USER_ASSERTION_INVALID")
    assert (await unary("ListJobs", {"userId": alice}, mint(mallory)))[:2] == (403, "USER_MISMATCH")
    assert (await unary("ListJobs", {"userId": alice}, mint(alice)))[:2] == (200, "")

    _, body = await asyncio.to_thread(post, "WatchJobs", {"userId": alice}, mint(mallory), stream=True)
    flags, end = connect_client.envelopes(body)[-1]
    assert flags == 2 and end["error"]["code"] == "permission_denied" and connect_client.error_details(end["error"])[0] == "USER_MISMATCH"
    _, body = await asyncio.to_thread(post, "WatchJobs", {"userId": alice}, mint(alice), stream=True)
    assert [m.get("snapshotComplete") for flags, m in connect_client.envelopes(body) if flags == 0] == [True]


def test_key_files_choose_one_algorithm_and_bad_ones_stop_start(tmp_path: Path, files: dict[str, Path]) -> None:
    """Ed25519, P-256 and RSA public keys and HS256 secrets verify with their own algorithm only,
    several public keys (a rotation) each verify;
    a private key, a short secret, a weak RSA key or a key without an auth file stop start-up."""

    def write(name: str, data: bytes) -> str:
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    def verifier(path: str) -> AssertionVerifier:
        return AssertionVerifier(load_keys(path), audience=AUDIENCE, issuer="", max_age_seconds=300, leeway_seconds=30)

    rsa_key, p256_key = rsa.generate_private_key(65537, 2048), ec.generate_private_key(ec.SECP256R1())
    secret = base64.b64encode(uuid.uuid4().bytes * 2)
    cases = [
        (write("rsa.pem", _public_pem(rsa_key)), rsa_key, "RS256"),
        (write("p256.pem", _public_pem(p256_key)), p256_key, "ES256"),
        (write("secret", secret + b"\n"), secret, "HS256"),
        (str(files["key"]), SIGNING_KEY, "EdDSA"),
    ]
    for path, signing_key, algorithm in cases:
        assert [key.algorithm for key in load_keys(path)] == [algorithm]
        assert verifier(path).subject(mint("u-1", key=signing_key, algorithm=algorithm), "m") == "u-1"
        with pytest.raises(UserAssertionInvalid) as refused:
            verifier(path).subject(
                mint("u-1", key=SIGNING_KEY if algorithm != "EdDSA" else p256_key, algorithm="EdDSA" if algorithm != "EdDSA" else "ES256"),
                "m",
            )
        assert refused.value.metadata["problem"] == "wrong_algorithm"

    # A rotation: the file holds the old and the new public key; either verifies, a third does not.
    new_key = ed25519.Ed25519PrivateKey.generate()
    rotating = verifier(write("rotation.pem", _public_pem(SIGNING_KEY) + _public_pem(new_key)))
    assert [rotating.subject(mint(user, key=key), "m") for user, key in (("old", SIGNING_KEY), ("new", new_key))] == ["old", "new"]
    with pytest.raises(UserAssertionInvalid) as refused:
        rotating.subject(mint("u-1", key=ed25519.Ed25519PrivateKey.generate()), "m")
    assert refused.value.metadata["problem"] == "bad_signature"

    private = SIGNING_KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    weak_rsa = _public_pem(rsa.generate_private_key(65537, 1024))
    for data, message in (
        (private, "holds a private key"),
        (b"short", "at least 32 bytes"),
        (weak_rsa, "at least 2048 bits"),
        (b"-----BEGIN PUBLIC KEY-----\nnope\n", "not a PEM public key"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_keys(write("bad", data))
    with pytest.raises(ConfigError, match="QUEUE_USER_ASSERTION_KEY_FILE needs QUEUE_AUTH_FILE"):
        Config.from_env({"QUEUE_USER_ASSERTION_KEY_FILE": str(files["key"])})
    with pytest.raises(ConfigError, match="QUEUE_USER_ASSERTION_AUDIENCE"):
        Config.from_env(
            {
                "QUEUE_AUTH_FILE": str(files["auth"]),
                "QUEUE_USER_ASSERTION_KEY_FILE": str(files["key"]),
                "QUEUE_USER_ASSERTION_AUDIENCE": " ",
            }
        )
    config = Config.from_env({"QUEUE_AUTH_FILE": str(files["auth"]), "QUEUE_USER_ASSERTION_KEY_FILE": str(files["key"])})
    assert (config.user_assertion_audience, config.user_assertion_max_age_seconds, config.user_assertion_leeway_seconds) == (
        AUDIENCE,
        300,
        30,
    )
