"""The releases a locked change owes when its outcome is unknown.

A locked change that frees a slot (a completion, a cancel, a give-up, a settlement, a promotion)
promotes the user's next job and claims its first release for this replica, for the release
lease, in the same commit; the replica hands the release to the dispatcher once it hears the
commit. When the answer is lost instead (OUTCOME_UNKNOWN: a commit acknowledged late, a
connection that broke or was given up), nothing is handed over, and the promoted job would wait
for the lease to run out (QUEUE_RELEASE_LEASE_SECONDS) before any replica tried it. So the lost
answer is followed up here, in the background: once the user's lock is free (the change has
committed or not by then), the user's PENDING jobs whose first release is claimed and was not
tried again are handed over. A release is idempotent at the core and its mark is fenced by the
attempt, so handing over one that is also being released elsewhere costs a duplicate ReleaseRun,
never a second start. A paused user's owed release is not handed over: it was never sent, so the
same statement sends the job back to waiting for a grant, which the resume hands out.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from queue_service import errors, telemetry
from queue_service.engine.ports import ReleaseStarter
from queue_service.store import Store

log = logging.getLogger(__name__)

# Between attempts while the database does not answer (it may be restarting).
_RETRY_SECONDS = 0.5


class OwedReleases:
    """Follows up locked changes whose outcome is unknown: `follow_up` starts, in the background
    (`spawn`), the hand-over of the first releases the user's lost change may have claimed."""

    def __init__(
        self,
        store: Store,
        starter: ReleaseStarter,
        *,
        lease_seconds: float,
        spawn: Callable[[Coroutine[Any, Any, Any], str], object],
    ) -> None:
        self._store = store
        self._starter = starter
        self._lease_seconds = lease_seconds
        self._spawn = spawn

    def follow_up(self, *, user_id: str | None = None, run_id: uuid.UUID | None = None) -> None:
        """For a lost change of the user named, or of the user whose job owns `run_id`."""
        self._spawn(self.hand_over_owed(user_id=user_id, run_id=run_id), f"owed-releases-{user_id or run_id}")

    async def hand_over_owed(self, *, user_id: str | None = None, run_id: uuid.UUID | None = None) -> int:
        """Hands over the first releases the lost change may have claimed; retried while the
        database does not answer, until the lease would have run out anyway (then the dispatcher
        finds them). How many were handed over."""
        give_up_at = time.monotonic() + self._lease_seconds
        while True:
            try:
                owed, held = await self._store.first_releases_owed(user_id=user_id, run_id=run_id)
                break
            except errors.QueueError as exc:
                if time.monotonic() + _RETRY_SECONDS >= give_up_at:
                    telemetry.metrics.owed_release_handovers.add(1, {"result": "gave_up"})
                    log.warning("the releases a lost change may owe were not looked up (%s); the lease ends them", exc.reason)
                    return 0
                await asyncio.sleep(_RETRY_SECONDS)
        for claim in held:
            log.info(
                "releases paused; the job a change whose outcome was unknown promoted waits",
                extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "attempt": claim.attempt},
            )
        if held:
            telemetry.metrics.owed_release_handovers.add(len(held), {"result": "paused"})
        for claim in owed:
            log.info(
                "a change whose outcome was unknown promoted this job; releasing it",
                extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "attempt": claim.attempt},
            )
            self._starter.start_claimed(claim)
        if owed:
            telemetry.metrics.owed_release_handovers.add(len(owed), {"result": "handed_over"})
        elif not held:
            telemetry.metrics.owed_release_handovers.add(1, {"result": "none"})
        return len(owed)
