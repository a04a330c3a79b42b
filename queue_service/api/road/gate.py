"""The one gate every call passes: it counts calls in flight, caps concurrent unary calls, and
drains the replica.

A drain closes the gate: new calls hear SHUTTING_DOWN (retry on another replica), streams see
`draining` set and end with SHUTTING_DOWN, and the server waits for the gate to be idle. gRPC
(the interceptor) and the browser endpoint (`web`) share one gate.
"""

from __future__ import annotations

import asyncio

from queue_service import deadline
from queue_service.errors import ReplicaBusy, ShuttingDown

_ALWAYS_OPEN = "/grpc.health.v1.Health/"


class CallGate:
    """Counts calls in flight; refuses new ones with UNAVAILABLE once closed for a drain; lets at
    most `max_unary` unary calls work at once, the others waiting their turn in order.

    Refusing in our own handler (rather than letting the server shut down under a call that is
    just arriving) gives late callers a clean UNAVAILABLE they can retry on another replica.

    The cap keeps an overloaded replica's event loop responsive: without it, every call shares
    the CPU with every other until all of them miss their deadlines. A waiting call costs nothing,
    and waits no longer than half of what is left of its deadline (else `max_wait`): then it hears
    REPLICA_BUSY, in time to retry on another replica. Streams have caps of their own. A drain waits
    for the waiting calls too: each is refused with SHUTTING_DOWN when its turn comes.
    """

    def __init__(self, max_unary: int = 1_000_000, max_wait: float = 5.0) -> None:
        self.in_flight = 0
        self._max_unary = max_unary
        self._max_wait = max_wait
        self._unary_slots = asyncio.Semaphore(max_unary)
        self._closed = False
        # Set when the drain starts: streams watch it and end with SHUTTING_DOWN.
        self.draining = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    async def enter(self, method: str, *, unary: bool = True) -> bool:
        """Admits the call (True: counted, call `exit`), or raises SHUTTING_DOWN / REPLICA_BUSY."""
        if method.startswith(_ALWAYS_OPEN):
            return False
        if self._closed:
            raise ShuttingDown("this replica is draining; retry on another replica")
        # Counted from here, so a drain also waits for calls waiting their turn.
        self.in_flight += 1
        self._idle.clear()
        if unary:
            try:
                await self._take_unary_slot()
            except BaseException:
                self._leave()
                raise
            if self._closed:
                self._unary_slots.release()
                self._leave()
                raise ShuttingDown("this replica is draining; retry on another replica")
        return True

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def _take_unary_slot(self) -> None:
        # At most half of what is left: a call refused then still has time to retry elsewhere, even
        # from a replica whose event loop is running late.
        if not await deadline.acquire(self._unary_slots, limit=self._max_wait, share=0.5):
            raise ReplicaBusy(
                f"this replica is working on {self._max_unary} calls (the maximum) and had no turn for this one "
                "within its deadline; retry, ideally on another replica",
                metadata={"maxConcurrentCalls": str(self._max_unary)},
            )

    def exit(self, *, unary: bool = True) -> None:
        if unary:
            self._unary_slots.release()
        self._leave()

    def close(self) -> None:
        """Starts the drain: refuses new calls and tells open streams to end."""
        self._closed = True
        self.draining.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
