"""What one caller may hold open without credentials: Health.Watch streams per replica, and
streams per client connection (the listener's HTTP/2 limit), through real servers."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.harness import error_info

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
