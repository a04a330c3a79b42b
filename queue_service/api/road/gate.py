"""The one gate every call passes once its request is in: it counts calls in flight, gives out the
replica's turns (for the replica and for each caller), and drains the replica.

A turn is what a call holds while it is worked on, of one kind (`TurnKind`): a unary call's turn
(`calls`), and a stream's (`streams`, every WatchJobs, WatchOverview and reflection stream; a
WatchOverview takes an `overview` turn too, as each reads the overview on a timer). Each kind has
a replica's number and one caller's share of it, given out the same way (`_Turns`), so one caller
cannot take every turn of any kind. Each message of a reflection stream is worked on in a unary
turn (`each_in_a_turn`): a 50-byte request answers tens of KB of descriptors.

A drain closes the gate: new calls hear SHUTTING_DOWN (retry on another replica), streams see
`draining` set and end with SHUTTING_DOWN, and the server waits for the gate to be idle. gRPC
(the interceptor) and the browser endpoint (`web_road`) share one gate. Health is never gated:
probes and load balancers call it without credentials, and it has its own bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from queue_service import audit, deadline
from queue_service.errors import QueueError, ReplicaBusy, ShuttingDown, TooManyStreams

_ALWAYS_OPEN = "/grpc.health.v1.Health/"
WATCH_OVERVIEW = "/acurio.queue.v1.OperatorService/WatchOverview"
# Each caller's key begins with its role (`audit.caller_actor`): operators' streams have room reserved.
_OPERATOR_PREFIX = audit.caller_actor("operator", "")

_Message = TypeVar("_Message")


@dataclasses.dataclass(frozen=True)
class TurnKind:
    """One kind of turn: at most `size` held on the replica at once, at most `per_caller` of them by
    one caller (with authentication off no caller is told apart: `size` alone). `reserved` more
    are for operators only, beyond `size`. A call without a free turn waits for one within its
    deadline (at most `max_wait`) when `waits` (a unary call: turns come back within a deadline),
    else is refused at once (a stream holds its turn for as long as it is open). `refusal(scope,
    held)` is what it hears, `scope` being "replica" or "caller"."""

    size: int
    per_caller: int
    refusal: Callable[[str, int], QueueError]
    waits: bool = False
    reserved: int = 0


class _CallerShare:
    """The turns of one kind one caller may hold, and how many of its calls hold or wait for one
    (the share is forgotten when none does)."""

    __slots__ = ("slots", "users")

    def __init__(self, size: int) -> None:
        self.slots = asyncio.Semaphore(size)
        self.users = 0


class _Turns:
    """The turns of one kind: the replica's and each caller's share of them (`TurnKind`)."""

    def __init__(self, kind: TurnKind, max_wait: float) -> None:
        self.kind = kind
        self._per_caller = kind.per_caller
        self._max_wait = max_wait
        self._slots = asyncio.Semaphore(kind.size)
        self._reserved = asyncio.Semaphore(kind.reserved)
        self._shares: dict[str, _CallerShare] = {}
        self.held = 0

    async def take(self, caller: str) -> asyncio.Semaphore:
        """One turn for `caller` (the replica's slots it came from; give it back with `give_back`),
        or raises the kind's refusal."""
        share = self._share_of(caller)
        try:
            slots = await self._take(caller, share)
        except BaseException:
            self._let_go(caller, share)
            raise
        self.held += 1
        return slots

    def give_back(self, caller: str, slots: asyncio.Semaphore) -> None:
        self.held -= 1
        slots.release()
        share = self._shares[caller]
        share.slots.release()
        self._let_go(caller, share)

    def _share_of(self, caller: str) -> _CallerShare:
        share = self._shares.get(caller)
        if share is None:
            # No caller identified (authentication off): the replica's number is the only bound.
            share = self._shares[caller] = _CallerShare(self._per_caller if caller else self.kind.size)
        share.users += 1
        return share

    def _let_go(self, caller: str, share: _CallerShare) -> None:
        share.users -= 1
        if share.users == 0:
            del self._shares[caller]

    async def _take(self, caller: str, share: _CallerShare) -> asyncio.Semaphore:
        replica = self._slots
        if self._slots.locked() and caller.startswith(_OPERATOR_PREFIX) and not self._reserved.locked():
            replica = self._reserved
        if not share.slots.locked() and not replica.locked():
            # Both free: taken at once, with no timer to arm and cancel (the usual turn).
            await share.slots.acquire()
            await replica.acquire()
            return replica
        if not self.kind.waits:
            raise self.kind.refusal("caller" if share.slots.locked() else "replica", self.held)
        # At most half of what is left, for both waits together: a call refused then still has
        # time to retry elsewhere, even from a replica whose event loop is running late. A free
        # slot is taken without waiting (and so whatever is left).
        wait_until = asyncio.get_running_loop().time() + deadline.bound(self._max_wait, share=0.5)
        try:
            async with asyncio.timeout_at(wait_until):
                await share.slots.acquire()
        except TimeoutError:
            raise self.kind.refusal("caller", self.held) from None
        try:
            async with asyncio.timeout_at(wait_until):
                await replica.acquire()
        except BaseException as error:
            share.slots.release()
            if isinstance(error, TimeoutError):
                raise self.kind.refusal("replica", self.held) from None
            raise
        return replica


class Turn:
    """The turns one call holds (`CallGate.enter`); `leave` gives them back."""

    __slots__ = ("_gate", "_caller", "_held")

    def __init__(self, gate: CallGate, caller: str) -> None:
        self._gate = gate
        self._caller = caller
        self._held: list[tuple[_Turns, asyncio.Semaphore]] = []

    def leave(self) -> None:
        for turns, slots in reversed(self._held):
            turns.give_back(self._caller, slots)
        self._held.clear()
        self._gate._leave()


class CallGate:
    """Counts calls in flight; refuses new ones with UNAVAILABLE once closed for a drain; gives out
    the turns of each kind (`TurnKind`): `calls` for unary calls (and each reflection request),
    `streams` for every stream, `overview` for WatchOverview streams besides.

    Refusing in our own handler (rather than letting the server shut down under a call that is
    just arriving) gives late callers a clean UNAVAILABLE they can retry on another replica.

    The unary cap keeps an overloaded replica's event loop responsive: without it, every call shares
    the CPU with every other until all of them miss their deadlines. The caller's share keeps one
    caller (a web token flooding the replica, a runaway client) from taking every turn: while it
    holds its whole share, the rest stays for everyone else, the core's callbacks and the operators
    included. A waiting unary call costs nothing, and waits (for its share and then for the
    replica's turn together) no longer than half of what is left of its deadline (else `max_wait`):
    then it hears REPLICA_BUSY, in time to retry on another replica. A stream is refused at once
    (TOO_MANY_STREAMS) when its caller holds its share of streams or the replica all of them. A
    drain waits for the waiting calls too: each is refused with SHUTTING_DOWN when its turn comes.
    """

    def __init__(
        self,
        max_unary: int = 1_000_000,
        max_wait: float = 5.0,
        max_unary_per_caller: int | None = None,
        *,
        max_streams: int = 1_000_000,
        max_streams_per_caller: int | None = None,
        operator_streams_reserved: int = 0,
        max_overview_streams: int = 64,
        max_overview_streams_per_caller: int = 8,
    ) -> None:
        self.in_flight = 0
        calls_per_caller = min(max_unary, max_unary_per_caller or max_unary)
        self.calls = _Turns(TurnKind(max_unary, calls_per_caller, _calls_refusal(max_unary, calls_per_caller), waits=True), max_wait)
        streams_per_caller = min(max_streams, max_streams_per_caller or max_streams)
        self.streams = _Turns(
            TurnKind(
                max_streams, streams_per_caller, _streams_refusal(max_streams, streams_per_caller), reserved=operator_streams_reserved
            ),
            max_wait,
        )
        overview_per_caller = min(max_overview_streams, max_overview_streams_per_caller)
        self.overview = _Turns(
            TurnKind(max_overview_streams, overview_per_caller, _overview_refusal(max_overview_streams, overview_per_caller)), max_wait
        )
        self._closed = False
        # Set when the drain starts: streams watch it and end with SHUTTING_DOWN.
        self.draining = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    async def enter(self, method: str, *, unary: bool = True, caller: str = "") -> Turn | None:
        """Admits `caller`'s call (a `Turn`: call its `leave` when the call ends; None: health, not
        gated), or raises SHUTTING_DOWN, REPLICA_BUSY or TOO_MANY_STREAMS."""
        if method.startswith(_ALWAYS_OPEN):
            return None
        if self._closed:
            raise ShuttingDown("this replica is draining; retry on another replica")
        # Counted from here, so a drain also waits for calls waiting their turn.
        self.in_flight += 1
        self._idle.clear()
        turn = Turn(self, caller)
        kinds = (self.calls,) if unary else (self.streams, self.overview) if method == WATCH_OVERVIEW else (self.streams,)
        try:
            for turns in kinds:
                turn._held.append((turns, await turns.take(caller)))
            if self._closed:
                raise ShuttingDown("this replica is draining; retry on another replica")
        except BaseException:
            turn.leave()
            raise
        return turn

    def each_in_a_turn(self, messages: AsyncIterator[_Message], caller: str) -> EachInATurn[_Message]:
        """A stream's requests, each worked on in one of `caller`'s unary turns: the turn is taken
        as the request arrives and given back when the stream's answer to it goes out (`answered`)
        or the next request is asked for, so a client that does not read its answers holds none."""
        return EachInATurn(self.calls, messages, caller)

    def _leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

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


class EachInATurn(AsyncIterator[_Message]):
    """`CallGate.each_in_a_turn`'s requests; `answered` gives back the turn of the request answered."""

    def __init__(self, calls: _Turns, messages: AsyncIterator[_Message], caller: str) -> None:
        self._calls = calls
        self._messages = messages
        self._caller = caller
        self._held: asyncio.Semaphore | None = None

    def __aiter__(self) -> EachInATurn[_Message]:
        return self

    async def __anext__(self) -> _Message:
        self.answered()
        message = await self._messages.__anext__()
        self._held = await self._calls.take(self._caller)
        return message

    def answered(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._calls.give_back(self._caller, held)


def _calls_refusal(size: int, per_caller: int) -> Callable[[str, int], QueueError]:
    def refusal(scope: str, _held: int) -> QueueError:
        if scope == "caller":
            return ReplicaBusy(
                f"this caller has {per_caller} calls in progress on this replica (the most one caller may have) "
                "and had no turn for this one within its deadline; retry once they are answered, or on another replica",
                metadata={"maxConcurrentCalls": str(size), "maxConcurrentCallsPerCaller": str(per_caller)},
            )
        return ReplicaBusy(
            f"this replica is working on {size} calls (the maximum) and had no turn for this one "
            "within its deadline; retry, ideally on another replica",
            metadata={"maxConcurrentCalls": str(size)},
        )

    return refusal


def _streams_refusal(size: int, per_caller: int) -> Callable[[str, int], QueueError]:
    def refusal(scope: str, held: int) -> QueueError:
        if scope == "caller":
            return TooManyStreams(
                f"this caller has {per_caller} streams open on this replica (the most one caller may have); close one, or open it on another replica",
                metadata={"maxStreams": str(size), "maxStreamsPerCaller": str(per_caller)},
            )
        return TooManyStreams(
            f"this replica has {held} open streams (the maximum); retry later, or on another replica", metadata={"maxStreams": str(size)}
        )

    return refusal


def _overview_refusal(size: int, per_caller: int) -> Callable[[str, int], QueueError]:
    def refusal(scope: str, held: int) -> QueueError:
        if scope == "caller":
            return TooManyStreams(
                f"this caller has {per_caller} open WatchOverview streams (the maximum); close one",
                metadata={"maxOverviewStreamsPerCaller": str(per_caller)},
            )
        return TooManyStreams(
            f"this replica has {held} open WatchOverview streams (the maximum); retry later",
            metadata={"maxOverviewStreams": str(size)},
        )

    return refusal
