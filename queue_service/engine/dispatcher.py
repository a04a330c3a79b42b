"""The release dispatcher: one per replica, releasing PENDING jobs the moment they are due.

A job this replica makes PENDING (an admit into a free slot, a promotion) has its first release
claimed in that same transaction; the engine hands the claim over and the dispatcher starts it at
once, with no claim of its own. Every other release (retries, leases that ran out, jobs of
replicas of earlier versions) is claimed here with `FOR UPDATE SKIP LOCKED` (so replicas never
release the same job at once), leased for QUEUE_RELEASE_LEASE_SECONDS, and released in its own
task. The claiming loop wakes on a NOTIFY of a PENDING job whose release nobody claimed, on the
sweeper's pass, and otherwise exactly when the earliest retry or lease is due. The lease makes a
crash harmless: another replica claims the job when the lease runs out.

While the fleet's capacity at the core is limited, a first-pass job that becomes PENDING waits
for it: each pass first asks for a grant (`Releases.grant_capacity`, decided in PostgreSQL
under the fleet-wide capacity lock), which claims the releases of the waiting jobs next in the
fair order for this replica. When capacity may have freed (an ending, a settlement) or a job began
to wait, the engine asks for a grant at once (`request_grant`: one grant in flight per replica, one
more after it if asked meanwhile); a release the core refused ("not now") wakes the loop again
after the probe interval, once for the whole replica.

A claim held back for a place among the releases in flight is started marked
`waited_for_a_slot`: the attempt then checks the pauses of releases before it is sent
(`Releases.release`), since one may have committed while it waited.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from typing import Protocol

from queue_service import audit, deadline, errors
from queue_service.background import SupervisedLoop, cancel_and_wait
from queue_service.engine.capacity import FleetCapacity
from queue_service.engine.ports import ReleaseHandoff
from queue_service.model import CapacityGrant, ClaimedRelease, ReleaseResult
from queue_service.telemetry import metrics

log = logging.getLogger(__name__)

_BATCH = 64
_MAX_IDLE_SECONDS = 5.0
_MAX_CONCURRENT_RELEASES = 64


class Releasing(Protocol):
    """What the dispatcher asks of the engine: `engine.releases.Releases` in the service."""

    async def release(self, claim: ClaimedRelease) -> ReleaseResult: ...

    async def grant_capacity(self, *, max_grants: int) -> CapacityGrant: ...

    async def claim_due_releases(self, *, batch_size: int) -> list[ClaimedRelease]: ...

    async def next_release_due_in(self) -> float | None: ...


class ReleaseDispatcher:
    def __init__(
        self,
        releases: Releasing,
        *,
        wake: asyncio.Event,
        core_deadline_seconds: float,
        capacity: FleetCapacity | None = None,
        handoff: ReleaseHandoff | None = None,
    ) -> None:
        self._releases = releases
        # Shared with the engine (the server builds one per replica).
        self._capacity = capacity or FleetCapacity(wake_grant=wake.set, probe_interval_seconds=1.0)
        # The wake-up after the core said "not now" (one per replica, not one per job).
        self._probe_wake: asyncio.TimerHandle | None = None
        # Grants asked for when capacity may have freed: one in flight, and one more after it when
        # asked again meanwhile (a burst of completions costs a grant or two, not one each).
        self._granting: asyncio.Task[None] | None = None
        self._grant_again = False
        # Set by the watch hub (a PENDING job nobody claimed), the sweeper (every pass) and a
        # release attempt that scheduled a retry.
        self._wake = wake
        self._core_deadline_seconds = core_deadline_seconds
        # Releases this replica claimed when it made their jobs PENDING, waiting for a free slot.
        self._claimed_waiting: collections.deque[ClaimedRelease] = collections.deque()
        self._slot_freed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        # The claiming loop: woken by `wake`, otherwise when the earliest release is due; while
        # the database is away, it backs off (doubling, at most _MAX_IDLE_SECONDS).
        self._loop = SupervisedLoop(
            "release-dispatcher",
            self._claim_pass,
            interval_seconds=_MAX_IDLE_SECONDS,
            wake=wake,
            expected=(errors.QueueError, OSError),
            backoff_seconds=(0.1, _MAX_IDLE_SECONDS),
            failure_log=("release dispatcher could not reach the database: %s", "release dispatcher pass failed"),
        )
        # The rooms hand claims and grant requests to the handoff they were built with; from here
        # on it passes them to this dispatcher (`start_claimed`, `request_grant`).
        if handoff is not None:
            handoff.deliver_to(self)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        if self._probe_wake is not None:
            self._probe_wake.cancel()
        await self._loop.stop()
        await cancel_and_wait(self._granting)
        # Claims still waiting for a slot are left to their leases: any replica claims them then.
        self._claimed_waiting.clear()
        # In-flight releases finish (bounded by the core deadline) so no lease is left dangling.
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self._core_deadline_seconds + 1)

    async def _claim_pass(self) -> float | None:
        """One pass of the claiming loop; the seconds until the next (a full batch: at once)."""
        woken_by = "full_batch" if self._loop.woken_by == "at_once" else self._loop.woken_by
        metrics.release_claim_passes.add(1, {"woken_by": woken_by})
        self._wake.clear()
        claimed = await self._claim_and_start(grant=self._capacity.limited or woken_by != "full_batch")
        if claimed == _BATCH:
            self._loop.again_at_once()
            return None
        return await self._seconds_until_next_due()

    def request_grant(self) -> None:
        """Capacity may have freed or a job began to wait: ask for a grant now, in a task of its
        own (no claim of due releases, no read of the next due time: the claiming loop does those)."""
        if self._granting is not None and not self._granting.done():
            self._grant_again = True
            return
        self._granting = asyncio.create_task(self._grant_while_asked(), name="capacity-grant")

    async def _grant_while_asked(self) -> None:
        while True:
            self._grant_again = False
            try:
                grants = await self._releases.grant_capacity(max_grants=_BATCH)
                for claim, _waited in grants.claims:
                    await self._start(claim)
                if len(grants.claims) == _BATCH:
                    self._grant_again = True
            except (errors.QueueError, OSError) as exc:
                # The claiming loop grants on its next pass (at most 5 s away).
                log.warning("capacity grant could not reach the database: %s", exc)
                return
            except Exception:
                log.exception("capacity grant failed")
                return
            if not self._grant_again:
                return

    def start_claimed(self, claim: ClaimedRelease) -> None:
        """Starts a release this replica claimed in the transaction that made its job PENDING:
        its task is created right here (no claim query, no hand-off through a queue and a taker
        task), or as soon as one of the releases in flight ends."""
        if len(self._tasks) < _MAX_CONCURRENT_RELEASES:
            self._spawn(claim)
        else:
            self._claimed_waiting.append(claim)

    async def _claim_and_start(self, *, grant: bool) -> int:
        """Starts the releases the fleet's capacity grants this replica (asked for when the
        capacity is limited, or on a pass an event or the timer started, which is how a replica
        learns that another one limited it), then every due release claimed."""
        granted = 0
        if grant:
            grants = await self._releases.grant_capacity(max_grants=_BATCH)
            for claim, _waited in grants.claims:
                await self._start(claim)
            granted = len(grants.claims)
        claims = await self._releases.claim_due_releases(batch_size=_BATCH)
        for claim in claims:
            await self._start(claim)
        return max(granted, len(claims))

    async def _start(self, claim: ClaimedRelease) -> None:
        waited = False
        while len(self._tasks) >= _MAX_CONCURRENT_RELEASES:
            waited = True
            self._slot_freed.clear()
            await self._slot_freed.wait()
        self._spawn(dataclasses.replace(claim, waited_for_a_slot=True) if waited else claim)

    def _spawn(self, claim: ClaimedRelease) -> None:
        # A release handed over from a call is the system's work: not bounded by that call's
        # deadline, nor done in its caller's name (`audit`).
        task = deadline.spawn_detached(audit.as_system(self._release(claim)), name=f"release-{claim.job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._release_ended)

    def _release_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._claimed_waiting:
            self._spawn(dataclasses.replace(self._claimed_waiting.popleft(), waited_for_a_slot=True))
        else:
            self._slot_freed.set()

    async def _release(self, claim: ClaimedRelease) -> None:
        try:
            result = await self._releases.release(claim)
            if result is ReleaseResult.RETRY:
                # Its retry is due after a backoff shorter than the loop may be asleep for: the
                # loop re-reads the earliest due time (no NOTIFY wakes it for a claimed job).
                self._wake.set()
            elif result is ReleaseResult.WAITING:
                self._wake_for_probe()
        except errors.QueueError as exc:
            # The database went away mid-release: the lease runs out and any replica retries.
            log.warning("release attempt interrupted: %s", exc.message, extra={"job_id": claim.job_id, "attempt": claim.attempt})
        except Exception:
            # The lease runs out and any replica retries; nothing is lost.
            log.exception("release attempt failed", extra={"job_id": claim.job_id, "attempt": claim.attempt})

    def _wake_for_probe(self) -> None:
        """The core refused a release: ask for a grant again once a probe may be due (one timer
        for the replica however many releases were refused)."""
        if self._probe_wake is None or self._probe_wake.cancelled() or self._probe_wake.when() <= asyncio.get_running_loop().time():
            self._probe_wake = asyncio.get_running_loop().call_later(self._capacity.probe_interval_seconds, self._wake.set)

    async def _seconds_until_next_due(self) -> float:
        due_in = await self._releases.next_release_due_in()
        return _MAX_IDLE_SECONDS if due_in is None else min(_MAX_IDLE_SECONDS, due_in)
