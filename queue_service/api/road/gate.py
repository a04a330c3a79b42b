"""The one gate every call passes once its request is in: it counts calls in flight, caps
concurrent unary calls (for the replica and for each caller), and drains the replica.

A drain closes the gate: new calls hear SHUTTING_DOWN (retry on another replica), streams see
`draining` set and end with SHUTTING_DOWN, and the server waits for the gate to be idle. gRPC
(the interceptor) and the browser endpoint (`web_road`) share one gate.
"""

from __future__ import annotations

import asyncio

from queue_service import deadline
from queue_service.errors import ReplicaBusy, ShuttingDown

_ALWAYS_OPEN = "/grpc.health.v1.Health/"


class _CallerShare:
    """The unary slots one caller may hold, and how many of its calls hold or wait for one (the
    share is forgotten when none does)."""

    __slots__ = ("slots", "users")

    def __init__(self, size: int) -> None:
        self.slots = asyncio.Semaphore(size)
        self.users = 0


class CallGate:
    """Counts calls in flight; refuses new ones with UNAVAILABLE once closed for a drain; lets at
    most `max_unary` unary calls work at once, and at most `max_unary_per_caller` of one caller's,
    the others waiting their turn in order.

    Refusing in our own handler (rather than letting the server shut down under a call that is
    just arriving) gives late callers a clean UNAVAILABLE they can retry on another replica.

    The cap keeps an overloaded replica's event loop responsive: without it, every call shares
    the CPU with every other until all of them miss their deadlines. The caller's share keeps one
    caller (a web token flooding the replica, a runaway client) from taking every turn: while it
    holds its whole share, `max_unary - max_unary_per_caller` slots stay for everyone else, the
    core's callbacks and the operators included. A waiting call costs nothing, and waits (for its
    share and then for the replica's turn together) no longer than half of what is left of its
    deadline (else `max_wait`): then it hears REPLICA_BUSY, in time to retry on another replica.
    Streams have caps of their own. A drain waits for the waiting calls too: each is refused with
    SHUTTING_DOWN when its turn comes.
    """

    def __init__(self, max_unary: int = 1_000_000, max_wait: float = 5.0, max_unary_per_caller: int | None = None) -> None:
        self.in_flight = 0
        self._max_unary = max_unary
        self._max_per_caller = min(max_unary, max_unary_per_caller or max_unary)
        self._max_wait = max_wait
        self._unary_slots = asyncio.Semaphore(max_unary)
        self._shares: dict[str, _CallerShare] = {}
        self._closed = False
        # Set when the drain starts: streams watch it and end with SHUTTING_DOWN.
        self.draining = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    async def enter(self, method: str, *, unary: bool = True, caller: str = "") -> bool:
        """Admits `caller`'s call (True: counted, call `exit` with the same caller), or raises
        SHUTTING_DOWN / REPLICA_BUSY."""
        if method.startswith(_ALWAYS_OPEN):
            return False
        if self._closed:
            raise ShuttingDown("this replica is draining; retry on another replica")
        # Counted from here, so a drain also waits for calls waiting their turn.
        self.in_flight += 1
        self._idle.clear()
        if unary:
            share = self._share_of(caller)
            try:
                await self._take_unary_slot(share)
            except BaseException:
                self._let_go(caller, share)
                self._leave()
                raise
            if self._closed:
                self._release_unary_slot(caller, share)
                self._leave()
                raise ShuttingDown("this replica is draining; retry on another replica")
        return True

    def _share_of(self, caller: str) -> _CallerShare:
        share = self._shares.get(caller)
        if share is None:
            # No caller identified (authentication off): the replica's cap is the only bound.
            share = self._shares[caller] = _CallerShare(self._max_per_caller if caller else self._max_unary)
        share.users += 1
        return share

    def _let_go(self, caller: str, share: _CallerShare) -> None:
        share.users -= 1
        if share.users == 0:
            del self._shares[caller]

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def _take_unary_slot(self, share: _CallerShare) -> None:
        if not share.slots.locked() and not self._unary_slots.locked():
            # Both slots free: taken at once, with no timer to arm and cancel (the usual turn).
            await share.slots.acquire()
            await self._unary_slots.acquire()
            return
        # At most half of what is left, for both waits together: a call refused then still has
        # time to retry elsewhere, even from a replica whose event loop is running late. A free
        # slot is taken without waiting (and so whatever is left).
        wait_until = asyncio.get_running_loop().time() + deadline.bound(self._max_wait, share=0.5)
        try:
            async with asyncio.timeout_at(wait_until):
                await share.slots.acquire()
        except TimeoutError:
            raise ReplicaBusy(
                f"this caller has {self._max_per_caller} calls in progress on this replica (the most one caller may have) "
                "and had no turn for this one within its deadline; retry once they are answered, or on another replica",
                metadata={"maxConcurrentCalls": str(self._max_unary), "maxConcurrentCallsPerCaller": str(self._max_per_caller)},
            ) from None
        try:
            async with asyncio.timeout_at(wait_until):
                await self._unary_slots.acquire()
        except BaseException as error:
            share.slots.release()
            if isinstance(error, TimeoutError):
                raise ReplicaBusy(
                    f"this replica is working on {self._max_unary} calls (the maximum) and had no turn for this one "
                    "within its deadline; retry, ideally on another replica",
                    metadata={"maxConcurrentCalls": str(self._max_unary)},
                ) from None
            raise

    def _release_unary_slot(self, caller: str, share: _CallerShare) -> None:
        self._unary_slots.release()
        share.slots.release()
        self._let_go(caller, share)

    def exit(self, *, unary: bool = True, caller: str = "") -> None:
        if unary:
            self._release_unary_slot(caller, self._shares[caller])
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
