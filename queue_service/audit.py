"""Who moves credits: the actor every ledger entry records (docs/design.md, "The audit trail").

The gRPC edge (and the browser endpoint) marks each call with its caller, as the auth layer
identified it: `<role>:<name>` (`web:web-backend`, `core:rust-core`, `operator:alice`), or
`anonymous` when authentication is off. The store reads the mark when it writes a ledger entry,
so no engine method carries an actor parameter. Work that no call is doing (the dispatcher, the
sweeper, clean-up detached from a call with `as_system`) has no mark, and its entries are the
system's: `system:<reason>` (`system:release_give_up`, `system:reconcile`).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Coroutine
from contextlib import AbstractContextManager
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("queue_service.credits")

ANONYMOUS = "anonymous"
SYSTEM_PREFIX = "system:"

_call_actor: contextvars.ContextVar[str | None] = contextvars.ContextVar("queue_call_actor", default=None)


def caller_actor(role: str, name: str) -> str:
    """The actor of a call by an identified caller. Roles never read `system`, so a caller's
    actor cannot pass for the service's own."""
    return f"{role}:{name}"


def acting_for_call(actor: str = ANONYMOUS) -> AbstractContextManager[None]:
    """Marks the block as a call's work by `actor` (narrowed with `identify` once the caller is
    known)."""
    return _ActingFor(actor)


class _ActingFor:
    """`acting_for_call`'s block: a class, not a generator, as every call enters one."""

    __slots__ = ("_actor", "_previous")

    def __init__(self, actor: str = ANONYMOUS) -> None:
        self._actor = actor

    def __enter__(self) -> None:
        self._previous = _call_actor.get()
        _call_actor.set(self._actor)

    def __exit__(self, *exc_info: object) -> None:
        # Not Token.reset: a stream's generator may be closed from another context.
        _call_actor.set(self._previous)


def identify(actor: str) -> None:
    """The caller of the current call, once authorization has identified it."""
    _call_actor.set(actor)


def current_caller() -> str | None:
    """The current call's caller (`<role>:<name>`, `anonymous`), None outside a call."""
    return _call_actor.get()


def actor_for(reason: str) -> str:
    """Who moves a credit now for `reason`: the current call's caller, or the system."""
    return _call_actor.get() or f"{SYSTEM_PREFIX}{reason}"


async def as_system(work: Coroutine[Any, Any, T]) -> T:
    """Runs `work` as the system's own, not the call it was started from. Await it only as the
    whole of a task (it clears the mark in the task's copy of the context)."""
    _call_actor.set(None)
    return await work


def log_movement(*, kind: str, user_id: str, amount: int, actor: str, reason: str, job_id: object = None) -> None:
    """One info line per credit movement, with the ledger entry's fields."""
    log.info(
        "credits moved",
        extra={"kind": kind, "user_id": user_id, "amount": amount, "job_id": job_id, "actor": actor, "reason": reason},
    )
