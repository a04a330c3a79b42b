"""The dispatcher starts the releases the engine hands over at once, never more than its bound
in flight, and the ones that waited start as releases end."""

from __future__ import annotations

import asyncio
import uuid

from queue_service.engine import dispatcher as dispatcher_module
from queue_service.engine.dispatcher import ReleaseDispatcher, Releasing
from queue_service.model import CapacityGrant, ClaimedRelease, ReleaseResult


class _HeldReleases(Releasing):
    """Releases that run until the test lets each one end; nothing is due, no capacity granted."""

    def __init__(self) -> None:
        self.started: list[uuid.UUID] = []
        self.waited: list[uuid.UUID] = []
        self._may_end: dict[uuid.UUID, asyncio.Event] = {}

    async def release(self, claim: ClaimedRelease) -> ReleaseResult:
        self.started.append(claim.job_id)
        if claim.waited_for_a_slot:
            self.waited.append(claim.job_id)
        await self._may_end.setdefault(claim.job_id, asyncio.Event()).wait()
        return ReleaseResult.RELEASED

    async def grant_capacity(self, *, max_grants: int) -> CapacityGrant:
        return CapacityGrant(claims=(), limited=False)

    async def claim_due_releases(self, *, batch_size: int) -> list[ClaimedRelease]:
        return []

    async def next_release_due_in(self) -> float | None:
        return None

    def end(self, job_id: uuid.UUID) -> None:
        self._may_end.setdefault(job_id, asyncio.Event()).set()


def _claim() -> ClaimedRelease:
    return ClaimedRelease(uuid.uuid4(), "user-1", uuid.uuid4(), attempt=1)


async def test_handed_over_releases_start_at_once_up_to_the_bound_and_the_rest_as_releases_end() -> None:
    engine = _HeldReleases()
    dispatcher = ReleaseDispatcher(engine, wake=asyncio.Event(), core_deadline_seconds=1)
    bound = dispatcher_module._MAX_CONCURRENT_RELEASES
    claims = [_claim() for _ in range(bound + 3)]
    for claim in claims:
        dispatcher.start_claimed(claim)
    await asyncio.sleep(0)  # one turn of the loop: every started task has run to its wait
    assert engine.started == [c.job_id for c in claims[:bound]]

    engine.end(claims[0].job_id)
    engine.end(claims[1].job_id)
    for _ in range(3):
        await asyncio.sleep(0)
    # Two ended, so the first two that waited started, in the order they were handed over.
    assert engine.started == [c.job_id for c in claims[: bound + 2]]

    for claim in claims:
        engine.end(claim.job_id)
    for _ in range(5):
        await asyncio.sleep(0)
    assert engine.started == [c.job_id for c in claims]
    # Those that waited for a place are sent marked so (a pause may have committed meanwhile).
    assert engine.waited == [c.job_id for c in claims[bound:]]
    await dispatcher.stop()
