"""What one caller may hold open: without credentials, Health.Watch streams per replica and
streams per client connection (the listener's HTTP/2 limit); with them, WatchJobs and
WatchOverview streams per caller, with room reserved for operators; through real servers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.api.servicers.operator import MAX_OVERVIEW_STREAMS_PER_CALLER
from tests.harness import error_info, eventually, new_user

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _watch(channel: grpc.aio.Channel, service: str = "") -> grpc.aio.UnaryStreamCall:
    return health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service), timeout=60)


async def _first_status(call: grpc.aio.UnaryStreamCall) -> int:
    return (await asyncio.wait_for(call.read(), 10)).status


async def test_health_watch_streams_are_capped_per_replica_and_a_closed_one_frees_its_place(services) -> None:  # type: ignore[no-untyped-def]
    service = await services.start(max_health_watches=3)
    channel = service.stubs.channel
    watches = [_watch(channel) for _ in range(3)]
    assert [await _first_status(w) for w in watches] == [SERVING] * 3

    refused = _watch(channel)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await refused.read()
    code, reason, metadata, _ = error_info(raised.value)
    assert (code, reason, metadata) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS", {"maxHealthWatches": "3"})
    check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert check.status == SERVING, "Check is not a stream and stays answerable at the cap"

    # The open watches follow changes (a drain's NOT_SERVING reaches load balancers this way).
    await service.app.health.set("", NOT_SERVING)
    assert [(await asyncio.wait_for(w.read(), 10)).status for w in watches] == [NOT_SERVING] * 3
    await service.app.health.set("", SERVING)
    assert [(await asyncio.wait_for(w.read(), 10)).status for w in watches] == [SERVING] * 3

    # Closing one frees its place, once the server has seen the cancel.
    watches[0].cancel()
    deadline = time.monotonic() + 10
    while True:
        again = _watch(channel)
        try:
            assert await _first_status(again) == SERVING
            break
        except grpc.aio.AioRpcError as exc:
            assert error_info(exc)[1] == "TOO_MANY_STREAMS" and time.monotonic() < deadline, exc
            await asyncio.sleep(0.02)
    for call in (*watches, again):
        call.cancel()


async def test_a_watch_of_an_unknown_service_says_so_and_checking_it_is_not_found(service) -> None:  # type: ignore[no-untyped-def]
    watch = _watch(service.stubs.channel, "no.such.Service")
    assert await _first_status(watch) == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    watch.cancel()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await health_pb2_grpc.HealthStub(service.stubs.channel).Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_one_connection_holds_at_most_max_streams_per_connection_and_others_are_not_held_up(services) -> None:  # type: ignore[no-untyped-def]
    """The HTTP/2 limit is per connection: the third stream on a connection allowed two waits
    for a free stream, while a second connection is served at once."""
    service = await services.start(max_streams_per_connection=2)
    # Each channel with its own subchannel pool has its own connection (else gRPC shares one).
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    async with (
        grpc.aio.insecure_channel(service.address, options=own_connection) as first,
        grpc.aio.insecure_channel(service.address, options=own_connection) as second,
    ):
        held = [_watch(first), _watch(first)]
        assert [await _first_status(w) for w in held] == [SERVING, SERVING]
        waiting = _watch(first)
        waiting_read = asyncio.ensure_future(waiting.read())
        other = _watch(second)
        assert await _first_status(other) == SERVING
        done, _ = await asyncio.wait({waiting_read}, timeout=0.5)
        assert not done, "a third stream on a connection allowed two was served"
        held[0].cancel()
        assert (await asyncio.wait_for(waiting_read, 10)).status == SERVING
        for call in (held[1], waiting, other):
            call.cancel()


# -- WatchJobs and WatchOverview: caps per caller, room for operators -------------------------

_TOKENS = {"web-a": "web-a-token", "web-b": "web-b-token", "alice": "alice-token", "bob": "bob-token"}


@pytest.fixture
def callers_auth_file(tmp_path) -> str:  # type: ignore[no-untyped-def]
    roles = {"web-a": "web", "web-b": "web", "alice": "operator", "bob": "operator"}
    entries = [{"name": name, "role": roles[name], "sha256": hashlib.sha256(token.encode()).hexdigest()} for name, token in _TOKENS.items()]
    (tmp_path / "auth.json").write_text(json.dumps({"tokens": entries}))
    return str(tmp_path / "auth.json")


@pytest.fixture
async def callers_service(services, callers_auth_file):  # type: ignore[no-untyped-def]
    return await services.start(auth_file=callers_auth_file, max_streams_per_user=2, max_streams=3, max_streams_per_caller=3)


def _as(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {_TOKENS[name]}"),)


async def _opens(call: grpc.aio.UnaryStreamCall) -> tuple[grpc.StatusCode, str]:
    """OK once the stream's first message arrives, else the refusal's code and reason."""
    try:
        await asyncio.wait_for(call.read(), 10)
    except grpc.aio.AioRpcError as exc:
        code, reason, _, _ = error_info(exc)
        return code, reason
    return grpc.StatusCode.OK, ""


async def test_one_callers_watch_jobs_streams_never_lock_an_operator_out_of_a_user(callers_service) -> None:  # type: ignore[no-untyped-def]
    queue, user, other = callers_service.stubs.queue, new_user(), new_user()
    watch = lambda caller, of=user: queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=of), metadata=_as(caller), timeout=60)  # noqa: E731
    opened = [watch("web-a"), watch("web-a")]
    try:
        assert [await _opens(call) for call in opened] == [(grpc.StatusCode.OK, "")] * 2
        refused = watch("web-a")
        assert await _opens(refused) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
        # Another caller, web or operator, has its own streams of the same user.
        opened.append(watch("web-b"))
        assert await _opens(opened[-1]) == (grpc.StatusCode.OK, "")
        # The replica is full (3) for everyone but operators, who have room reserved.
        assert await _opens(watch("web-b", other)) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
        opened.append(watch("alice"))
        assert await _opens(opened[-1]) == (grpc.StatusCode.OK, "")
    finally:
        for call in opened:
            call.cancel()


async def test_one_caller_opens_at_most_its_share_of_the_replicas_streams_and_another_still_opens_its_own(
    services, callers_auth_file
) -> None:  # type: ignore[no-untyped-def]
    """One web token naming many users used to open every WatchJobs stream of the replica: now it
    opens its share (half of QUEUE_MAX_STREAMS by default), whatever users it names, and the second
    web backend still opens its own; a WatchOverview is a stream of its caller's share too."""
    service = await services.start(auth_file=callers_auth_file, max_streams=8)
    queue = service.stubs.queue
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    watch = lambda caller: queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=new_user()), metadata=_as(caller), timeout=60)  # noqa: E731
    opened = [watch("web-a") for _ in range(4)]
    try:
        assert [await _opens(call) for call in opened] == [(grpc.StatusCode.OK, "")] * 4
        refused = watch("web-a")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await asyncio.wait_for(refused.read(), 10)
        code, reason, metadata, _ = error_info(raised.value)
        assert (code, reason, metadata.get("maxStreamsPerCaller")) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS", "4")
        # The second web backend has its own share of the replica's streams.
        opened += [watch("web-b") for _ in range(3)]
        assert [await _opens(call) for call in opened[4:]] == [(grpc.StatusCode.OK, "")] * 3
        # An operator's WatchOverview is a stream of the replica's too: the eighth and last.
        opened.append(operator.WatchOverview(op_pb2.WatchOverviewRequest(interval_ms=60_000), metadata=_as("alice"), timeout=60))
        assert await _opens(opened[-1]) == (grpc.StatusCode.OK, "")
        assert await _opens(watch("web-b")) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
        # A closed stream gives its place back to its caller.
        opened[0].cancel()

        async def reopens() -> bool:
            opened.append(watch("web-a"))
            return await _opens(opened[-1]) == (grpc.StatusCode.OK, "")

        await eventually(reopens, timeout=10, what="web-a's closed stream to give its place back")
    finally:
        for call in opened:
            call.cancel()


async def test_watch_overview_streams_are_capped_per_caller(services, callers_auth_file) -> None:  # type: ignore[no-untyped-def]
    service = await services.start(auth_file=callers_auth_file)
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    watch = lambda caller: operator.WatchOverview(op_pb2.WatchOverviewRequest(interval_ms=60_000), metadata=_as(caller), timeout=60)  # noqa: E731
    opened = [watch("alice") for _ in range(MAX_OVERVIEW_STREAMS_PER_CALLER)]
    try:
        assert {await _opens(call) for call in opened} == {(grpc.StatusCode.OK, "")}
        assert await _opens(watch("alice")) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
        opened.append(watch("bob"))
        assert await _opens(opened[-1]) == (grpc.StatusCode.OK, "")
        opened[0].cancel()
        await asyncio.sleep(0.3)
        opened.append(watch("alice"))  # a closed stream frees its place
        assert await _opens(opened[-1]) == (grpc.StatusCode.OK, "")
    finally:
        for call in opened:
            call.cancel()
