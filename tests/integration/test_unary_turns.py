"""Who may take the replica's turns for unary calls (`QUEUE_MAX_CONCURRENT_CALLS`): a browser
request takes one only once its body is in, and one caller takes at most its share
(`QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER`), on both listeners together, so one web token leaves
the other callers, the core's callbacks and the operators their turns. Against real PostgreSQL
and a live replica with tokens configured; traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2 as callback_pb2
from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from tests.harness import S, error_info, new_user, role_tokens, token_entry, write_auth_file

TOKENS = {"web": "unary-turns-web-token", "operator": "unary-turns-operator-token", "core": "unary-turns-core-token"}
# A second web caller: the one that floods.
FLOODER_TOKEN = "unary-turns-flooding-web-token"
# A second operator, whose reflection floods.
FLOODING_OPERATOR_TOKEN = "unary-turns-flooding-operator-token"
MAX_CALLS = 4  # so each caller's share is 2
# A deadline the callers' calls have: on a replica with no turn for them they hear REPLICA_BUSY
# after half of it.
CALL_TIMEOUT_SECONDS = 3.0


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("auth") / "auth.json"
    write_auth_file(
        path,
        *role_tokens(TOKENS),
        token_entry("flooding-web-caller", "web", FLOODER_TOKEN),
        token_entry("flooding-operator", "operator", FLOODING_OPERATOR_TOKEN),
    )
    return str(path)


def _as(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _connect_call(port: int, method: str, message: dict[str, Any], token: str) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {
        "content-type": "application/json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": str(int(CALL_TIMEOUT_SECONDS * 1000)),
        "authorization": f"Bearer {token}",
    }
    try:
        connection.request("POST", f"/acurio.queue.v1.{method}", body=json.dumps(message).encode(), headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _error_info(error: dict[str, Any]) -> tuple[str, dict[str, str]]:
    for detail in error.get("details", []):
        if detail["type"] == "google.rpc.ErrorInfo":
            info = error_details_pb2.ErrorInfo.FromString(base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4)))
            return info.reason, dict(info.metadata)
    return "", {}


async def _running_job(stubs, user: str) -> job_pb2.Job:  # type: ignore[no-untyped-def]
    grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=1, idempotency_key=f"grant-{user}")
    await stubs.credits.GrantCredits(grant, timeout=10, metadata=_as(TOKENS["operator"]))
    job = (await stubs.queue.Admit(_admit(user, "first"), timeout=10, metadata=_as(TOKENS["web"]))).job
    for _ in range(750):
        job = (await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=10, metadata=_as(TOKENS["operator"]))).job
        if job.status == S.JOB_STATUS_RUNNING:
            return job
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job.job_id} did not start: {S.JobStatus.Name(job.status)}")


def _admit(user: str, key: str) -> queue_pb2.AdmitRequest:
    return queue_pb2.AdmitRequest(
        user_id=user,
        idempotency_key=key,
        document=job_pb2.Document(uri="s3://theses/thesis.pdf"),
        sources=[job_pb2.Source(doi="10.1234/a")],
    )


async def _open_unfinished_requests(port: int, token: str, count: int) -> list[asyncio.StreamWriter]:
    """`count` HTTP/1.1 connections, each with a ListJobs whose headers are in and whose body
    never finishes (one byte of the 1000 it announces)."""
    head = (
        f"POST /acurio.queue.v1.AnalysisQueueService/ListJobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nConnect-Protocol-Version: 1\r\nContent-Length: 1000\r\n"
        f"Authorization: Bearer {token}\r\n\r\n{{"
    ).encode()
    writers = []
    for _ in range(count):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        await writer.drain()
        writers.append(writer)
    return writers


async def test_requests_whose_bodies_never_arrive_take_no_turn_from_other_callers(services, auth_file) -> None:
    """One web token holds twice as many browser requests as the replica has turns, their bodies
    never finishing: another web caller's calls (gRPC and Connect), the operator's GetOverview
    and the core's CompleteRun are answered all the same, not REPLICA_BUSY."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, http_addr="127.0.0.1:0", max_concurrent_calls=MAX_CALLS)
    stubs, port, user = service.stubs, service.app.http_port, new_user()
    running = await _running_job(stubs, user)

    unfinished = await _open_unfinished_requests(port, FLOODER_TOKEN, 2 * MAX_CALLS)
    try:
        await asyncio.sleep(0.5)  # every request's headers are in (the body timeout is 10 s)
        web, operator, core_token = _as(TOKENS["web"]), _as(TOKENS["operator"]), _as(TOKENS["core"])
        listed = await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=CALL_TIMEOUT_SECONDS, metadata=web)
        assert [job.job_id for job in listed.jobs] == [running.job_id]
        status, answer = await asyncio.to_thread(_connect_call, port, "AnalysisQueueService/ListJobs", {"userId": user}, TOKENS["web"])
        assert status == 200, answer
        assert [job["jobId"] for job in answer["jobs"]] == [running.job_id]
        overview = await op_grpc.OperatorServiceStub(stubs.channel).GetOverview(
            op_pb2.GetOverviewRequest(), timeout=CALL_TIMEOUT_SECONDS, metadata=operator
        )
        assert overview.overview.running >= 1  # this test's job, at least
        completion = callback_pb2.CompleteRunRequest(run_id=running.run_id, outcome=callback_pb2.RUN_OUTCOME_SUCCEEDED)
        completed = await stubs.callback.CompleteRun(completion, timeout=CALL_TIMEOUT_SECONDS, metadata=core_token)
        assert completed.job.status == S.JOB_STATUS_SUCCEEDED
    finally:
        for writer in unfinished:
            writer.close()


async def test_a_caller_beyond_its_share_hears_replica_busy_on_both_listeners_while_others_pass(services, auth_file) -> None:
    """The flooding web token's two Admits wait for a hung core, holding its share (2 of 4): its
    next call, over gRPC or Connect, hears UNAVAILABLE REPLICA_BUSY naming the share, while
    another web caller and the operator are answered."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(
        core, auth_file=auth_file, http_addr="127.0.0.1:0", max_concurrent_calls=MAX_CALLS, core_deadline_seconds=10.0
    )
    stubs, port, user = service.stubs, service.app.http_port, new_user()
    grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=2, idempotency_key=f"grant-{user}")
    await stubs.credits.GrantCredits(grant, timeout=10, metadata=_as(TOKENS["operator"]))
    flooder, web = _as(FLOODER_TOKEN), _as(TOKENS["web"])
    core.slow_seconds = 30  # every call to the core hangs: the flooder's Admits hold their turns

    async def admit(key: str) -> queue_pb2.AdmitResponse:
        return await stubs.queue.Admit(_admit(user, key), timeout=6, metadata=flooder)

    holding = [asyncio.create_task(admit(f"hold-{n}")) for n in range(MAX_CALLS // 2)]
    try:
        await asyncio.sleep(0.5)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=CALL_TIMEOUT_SECONDS, metadata=flooder)
        code, reason, metadata, _ = error_info(refused.value)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "REPLICA_BUSY")
        assert metadata["maxConcurrentCallsPerCaller"] == str(MAX_CALLS // 2)
        status, answer = await asyncio.to_thread(_connect_call, port, "AnalysisQueueService/ListJobs", {"userId": user}, FLOODER_TOKEN)
        assert (status, answer.get("code"), _error_info(answer)[0]) == (503, "unavailable", "REPLICA_BUSY"), answer

        # The other callers have the replica's other turns.
        listed = await stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user), timeout=CALL_TIMEOUT_SECONDS, metadata=web)
        assert list(listed.jobs) == []
        status, answer = await asyncio.to_thread(_connect_call, port, "AnalysisQueueService/ListJobs", {"userId": user}, TOKENS["web"])
        assert status == 200, answer
        overview = await op_grpc.OperatorServiceStub(stubs.channel).GetOverview(
            op_pb2.GetOverviewRequest(), timeout=CALL_TIMEOUT_SECONDS, metadata=_as(TOKENS["operator"])
        )
        assert overview.overview.window_minutes > 0
        assert not any(task.done() for task in holding)  # the share was held throughout
    finally:
        core.slow_seconds = 0
        await asyncio.gather(*holding, return_exceptions=True)


_REFLECTION_INFO = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


async def _describe(channel: grpc.aio.Channel, token: str) -> reflection_pb2.ServerReflectionResponse:
    """One reflection request (the contract's largest file, ~60 KB with its comments), sent with its
    half-close (see test_security's `_list_services` for why not through the bidi stub)."""
    describe = channel.unary_unary(
        _REFLECTION_INFO,
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="acurio.queue.v1.AnalysisQueueService")
    return await describe(request, timeout=CALL_TIMEOUT_SECONDS, metadata=_as(token))


async def test_each_reflection_request_takes_a_turn_of_its_callers_share(services, auth_file) -> None:
    """Reflection answers tens of KB per 50-byte request: it is the operators', and each request is
    worked on in a unary turn of its caller's share. With one operator's share held by two
    RetryJobs waiting for a hung core, its reflection request hears UNAVAILABLE REPLICA_BUSY naming
    the share, as its unary calls do, while another operator's reflection is answered; a web
    token's is refused."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, max_concurrent_calls=MAX_CALLS, core_deadline_seconds=10.0)
    stubs, user = service.stubs, new_user()
    flooder, operator = _as(FLOODING_OPERATOR_TOKEN), _as(TOKENS["operator"])
    grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=4, idempotency_key=f"grant-{user}")
    await stubs.credits.GrantCredits(grant, timeout=10, metadata=operator)
    canceled = []
    for n in range(MAX_CALLS // 2):
        job = (await stubs.queue.Admit(_admit(user, f"to-cancel-{n}"), timeout=10, metadata=_as(TOKENS["web"]))).job
        await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=10, metadata=operator)
        canceled.append(job.job_id)
    assert (await _describe(stubs.channel, FLOODING_OPERATOR_TOKEN)).file_descriptor_response.file_descriptor_proto
    with pytest.raises(grpc.aio.AioRpcError) as web_refused:
        await _describe(stubs.channel, TOKENS["web"])
    assert error_info(web_refused.value)[:2] == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    core.slow_seconds = 30  # every call to the core hangs: the flooding operator's retries hold their turns
    retries = op_grpc.OperatorServiceStub(stubs.channel)
    holding = [
        asyncio.ensure_future(retries.RetryJob(op_pb2.RetryJobRequest(job_id=job_id), timeout=6, metadata=flooder)) for job_id in canceled
    ]
    try:
        await asyncio.sleep(0.5)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _describe(stubs.channel, FLOODING_OPERATOR_TOKEN)
        code, reason, metadata, _ = error_info(refused.value)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "REPLICA_BUSY"), refused.value
        assert metadata["maxConcurrentCallsPerCaller"] == str(MAX_CALLS // 2)
        # Another operator's reflection and a web caller's calls have the replica's other turns.
        assert (await _describe(stubs.channel, TOKENS["operator"])).file_descriptor_response.file_descriptor_proto
        listed = await stubs.queue.ListJobs(
            queue_pb2.ListJobsRequest(user_id=user), timeout=CALL_TIMEOUT_SECONDS, metadata=_as(TOKENS["web"])
        )
        assert len(listed.jobs) == len(canceled)
        assert not any(task.done() for task in holding)  # the share was held throughout
    finally:
        core.slow_seconds = 0
        await asyncio.gather(*holding, return_exceptions=True)


async def test_health_is_answered_outside_the_turns(services, auth_file) -> None:
    """Probes call health without credentials and while every turn is taken: Check is answered."""
    core = await services.core(callback_token=TOKENS["core"])
    service = await services.start(core, auth_file=auth_file, max_concurrent_calls=MAX_CALLS, core_deadline_seconds=10.0)
    stubs, user = service.stubs, new_user()
    grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=4, idempotency_key=f"grant-{user}")
    await stubs.credits.GrantCredits(grant, timeout=10, metadata=_as(TOKENS["operator"]))
    core.slow_seconds = 30
    tokens = (FLOODER_TOKEN, FLOODER_TOKEN, TOKENS["web"], TOKENS["web"])
    holding = [
        asyncio.ensure_future(stubs.queue.Admit(_admit(user, f"hold-{n}"), timeout=6, metadata=_as(token)))
        for n, token in enumerate(tokens)
    ]
    try:
        await asyncio.sleep(0.5)
        check = await health_pb2_grpc.HealthStub(stubs.channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        assert not any(task.done() for task in holding)  # every turn of the replica was held
    finally:
        core.slow_seconds = 0
        await asyncio.gather(*holding, return_exceptions=True)
