"""Error details the clients rely on: RetryInfo on retryable reasons, and a core's per-field
rejection (google.rpc.BadRequest) passed through to the Admit caller."""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from queue_service._gen.acurio.core.v1 import run_service_pb2_grpc as core_grpc
from queue_service._gen.acurio.queue.v1 import job_pb2
from tests.harness import error_info, new_user


def _retry_delay_seconds(exc: grpc.aio.AioRpcError) -> float | None:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    for detail in status.details if status else ():
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            return retry.retry_delay.ToMilliseconds() / 1000
    return None


async def test_core_unavailable_carries_retry_info_and_invalid_request_does_not(services) -> None:
    core = await services.core()
    service = await services.start(core, core_deadline_seconds=0.5)
    user = new_user()
    await service.stubs.grant(user, 1)
    core.unavailable = True
    try:
        await service.stubs.admit(user)
        raise AssertionError("admit must fail while the core is unavailable")
    except grpc.aio.AioRpcError as exc:
        assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE")
        assert _retry_delay_seconds(exc) == 1.0
    core.unavailable = False
    try:
        await service.stubs.admit("")
        raise AssertionError("admit with an empty user must fail")
    except grpc.aio.AioRpcError as exc:
        assert error_info(exc)[1] == "INVALID_REQUEST"
        assert _retry_delay_seconds(exc) is None


async def test_a_draining_replica_answers_shutting_down_with_retry_info(services) -> None:
    service = await services.start()
    service.app.gate.close()  # what a drain does first
    try:
        await service.stubs.balance(new_user())
        raise AssertionError("a draining replica must refuse new calls")
    except grpc.aio.AioRpcError as exc:
        assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN")
        assert _retry_delay_seconds(exc) == 0.1


class _RejectingCore(core_grpc.RunServiceServicer):
    """A core that rejects every CreateRun with one violation per unregistered source."""

    async def CreateRun(self, request, context):  # noqa: N802
        bad_request = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=f"sources[{index}].doi", description=f"DOI {source.doi} is not registered"
                )
                for index, source in enumerate(request.sources)
            ]
        )
        detail = any_pb2.Any()
        detail.Pack(bad_request)
        status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="2 sources are not registered", details=[detail])
        await context.abort_with_status(rpc_status.to_status(status))


async def test_the_cores_per_source_violations_reach_the_admit_caller(services) -> None:
    server = grpc.aio.server()
    core_grpc.add_RunServiceServicer_to_server(_RejectingCore(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        placeholder = await services.core()  # receives no call: only gives the service a callback target
        service = await services.start(placeholder, core_addr=f"127.0.0.1:{port}")
        user = new_user()
        await service.stubs.grant(user, 1)
        try:
            await service.stubs.admit(user, dois=("10.1234/first", "10.1234/second"))
            raise AssertionError("the core rejects every run")
        except grpc.aio.AioRpcError as exc:
            code, reason, metadata, violations = error_info(exc)
            assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "CORE_REJECTED")
            assert metadata["coreMessage"] == "2 sources are not registered"
            assert violations == [
                ("sources[0].doi", "DOI 10.1234/first is not registered"),
                ("sources[1].doi", "DOI 10.1234/second is not registered"),
            ]
        assert await service.stubs.balance(user) == 1  # nothing charged
    finally:
        await server.stop(None)


async def test_the_dev_core_names_each_field_it_rejects_as_the_real_core_does(services) -> None:
    """`queue-service dev` answers like the real core: a BadRequest with `document_uri` and each
    `sources[i].doi` at fault, so a client's per-source messages can be built against it."""
    core = await services.core()
    service = await services.start(core)
    user = new_user()
    await service.stubs.grant(user, 1)
    try:
        await service.stubs.admit(user, uri="s3://theses/unparseable.pdf", dois=("10.1234/fine", "10.9999/unknown", "10.9999/other"))
        raise AssertionError("the dev core rejects an unparseable document and unregistered DOIs")
    except grpc.aio.AioRpcError as exc:
        code, reason, metadata, violations = error_info(exc)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "CORE_REJECTED")
        assert metadata["coreMessage"] == "3 problem(s) with the analysis"
        assert violations == [
            ("document_uri", "the document could not be parsed"),
            ("sources[1].doi", "DOI 10.9999/unknown is not registered"),
            ("sources[2].doi", "DOI 10.9999/other is not registered"),
        ]
    assert await service.stubs.balance(user) == 1  # nothing charged


async def test_the_dev_core_fails_every_release_of_a_fail_release_document(services) -> None:
    """The `fail-release` test input: the job takes its slot and stays PENDING, its release retried."""
    core = await services.core()
    service = await services.start(core)
    user = new_user()
    await service.stubs.grant(user, 1)
    job = await service.stubs.admit(user, uri="s3://theses/fail-release.pdf")
    for _ in range(200):
        job = await service.stubs.job(job.job_id)
        if job.release_attempts >= 1 and job.last_error:
            break
        await asyncio.sleep(0.05)
    assert job.status == job_pb2.JOB_STATUS_PENDING
    assert "ReleaseRun gave no answer (UNAVAILABLE)" in job.last_error
