"""The actor mark (`queue_service.audit`): a call's caller reaches the work it awaits and the
tasks it fans out to, never the clean-up the engine detaches from it, nor the next call."""

from __future__ import annotations

import asyncio

from queue_service import audit
from queue_service.engine.tasks import BackgroundTasks


async def _actor() -> str:
    return audit.actor_for("probe")


async def test_a_call_s_caller_reaches_its_tasks_but_not_detached_clean_up() -> None:
    tasks = BackgroundTasks()
    assert await _actor() == "system:probe"  # no call: the service's own work
    with audit.acting_for_call():
        assert await _actor() == audit.ANONYMOUS  # a call before (or without) authentication
        audit.identify(audit.caller_actor("operator", "ops-alice"))
        assert await _actor() == "operator:ops-alice"
        # Fan-out (a bulk cancel's gather) copies the context: still the operator's work.
        assert await asyncio.gather(_actor(), _actor()) == ["operator:ops-alice"] * 2
        detached: list[str] = []

        async def record() -> None:
            detached.append(await _actor())

        await tasks.in_background(record(), name="probe")
        assert detached == ["system:probe"]
        assert await _actor() == "operator:ops-alice"  # the detached task did not clear the call's mark
    assert await _actor() == "system:probe"  # the call's mark ends with it
