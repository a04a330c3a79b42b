"""Each replica's heartbeat: a row in `queue_replicas` (migration 0017) rewritten every few
seconds with what the replica reports about itself (calls in flight, open streams, the core's
answers, refusals and unknown outcomes since it started, and its recent health: migration 0030),
deleted when it stops cleanly. The console's Replicas view reads the rows
(OperatorService.ListReplicas), the Overview the fresh rows' core health; a row whose heartbeat
stopped is a replica that died without stopping.

Before each write, the core is probed when it said nothing since the previous beat
(`CoreClient.probe_if_quiet`): the report's core state is then at most one beat old, with no
statement beyond the write, so OperatorService.GetOverview turns the core's health red within
three beats of the core stopping (docs/operations.md).

One failed write never stops the loop (the database may be away: the next one catches up).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable

from queue_service import telemetry
from queue_service.background import SupervisedLoop
from queue_service.model import ReplicaReport
from queue_service.store import Store

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0


def new_replica_id() -> str:
    """`host:pid:random`: unique per process start, readable in the console."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class ReplicaHeartbeat:
    def __init__(
        self,
        store: Store,
        report: Callable[[], ReplicaReport],
        *,
        probe_core: Callable[[], Awaitable[None]] | None = None,
        interval_seconds: float = HEARTBEAT_SECONDS,
    ) -> None:
        self._store = store
        self._report = report
        # Asks the core before the report when nothing proved it alive since the previous beat.
        self._probe_core = probe_core
        # Any failure is a warning: the database may be away, and the next beat catches up.
        self._loop = SupervisedLoop(
            "replica-heartbeat",
            self.beat_once,
            interval_seconds=interval_seconds,
            expected=(Exception,),
            failure_log=("replica heartbeat not written: %s", "replica heartbeat not written"),
        )

    def start(self) -> None:
        self._loop.start()

    async def beat_once(self) -> None:
        with telemetry.tracer.start_as_current_span("replica_heartbeat"):
            if self._probe_core is not None:
                await self._probe_core()
            async with self._store.statements() as db:
                await db.write_replica_heartbeat(self._report())

    async def stop(self) -> None:
        """Stops beating and leaves the list (best effort: a replica that cannot reach the
        database now shows as not heard from)."""
        await self._loop.stop()
        try:
            async with self._store.statements() as db:
                await db.forget_replica(replica_id=self._report().replica_id)
        except Exception as exc:
            log.warning("replica heartbeat row not deleted: %s", exc)
