"""grpc.health.v1.Health with a bound on open Watch streams.

Health needs no credentials (load balancers and probes call it), so anyone who reaches the
listener may open Watch streams; each holds a little memory and a task until the caller leaves.
At most `max_watches` (QUEUE_MAX_HEALTH_WATCHES) are open per replica; one more is refused with
RESOURCE_EXHAUSTED `TOO_MANY_STREAMS`, and closing a watch frees its place. Check is not bounded:
it ends at once.

Watch is an async generator (it yields its messages) rather than grpcio-health-checking's
servicer, which writes with `context.write`: the call road (`ErrorInterceptor`) iterates a
streaming handler's messages, so that servicer's Watch ended in INTERNAL behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from queue_service import errors

_SERVING = health_pb2.HealthCheckResponse.SERVING
_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthService(health_pb2_grpc.HealthServicer):
    """The statuses of the overall service "" and of each named service, and their watchers."""

    def __init__(self, max_watches: int) -> None:
        self._statuses: dict[str, int] = {"": _SERVING}
        self._changed = asyncio.Condition()
        self._max_watches = max_watches
        self.open_watches = 0

    async def set(self, service: str, status: int) -> None:
        async with self._changed:
            self._statuses[service] = status
            self._changed.notify_all()

    async def Check(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse],
    ) -> health_pb2.HealthCheckResponse:
        status = self._statuses.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse],
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The current status at once, then every change (SERVICE_UNKNOWN for a name not set)."""
        if self.open_watches >= self._max_watches:
            raise errors.TooManyStreams(
                f"this replica has {self.open_watches} open Health.Watch streams (the maximum); retry later, or poll Health.Check",
                metadata={"maxHealthWatches": str(self._max_watches)},
            )
        self.open_watches += 1
        try:
            sent = None
            while True:
                status = self._statuses.get(request.service, _UNKNOWN)
                if status != sent:
                    sent = status
                    yield health_pb2.HealthCheckResponse(status=status)
                async with self._changed:
                    # wait_for calls the predicate only while this iteration waits: it sees its `sent`.
                    await self._changed.wait_for(lambda: self._statuses.get(request.service, _UNKNOWN) != sent)  # noqa: B023
        finally:
            self.open_watches -= 1
