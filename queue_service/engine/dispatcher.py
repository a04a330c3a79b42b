"""The release dispatcher: one per replica, releasing PENDING jobs the moment they are due.

A job this replica makes PENDING (an admit into a free slot, a promotion) has its first release
claimed in that same transaction; the engine hands the claim over and the dispatcher starts it at
once, with no claim of its own. Every other release (retries, leases that ran out, jobs of
replicas of earlier versions) is claimed here with `FOR UPDATE SKIP LOCKED` (so replicas never
release the same job at once), leased for QUEUE_RELEASE_LEASE_SECONDS, and released in its own
task. The claiming loop wakes on a NOTIFY of a PENDING job whose release nobody claimed, on the
sweeper's pass, and otherwise exactly when the earliest retry or lease is due. The lease makes a
crash harmless: another replica claims the job when the lease runs out.
"""

from __future__ import annotations

import asyncio
import logging

from queue_service import errors
from queue_service.background import cancel_and_wait
from queue_service.engine.engine import QueueEngine
from queue_service.model import ClaimedRelease, ReleaseResult
from queue_service.store import Store

log = logging.getLogger(__name__)

_BATCH = 64
_MAX_IDLE_SECONDS = 5.0
_MAX_CONCURRENT_RELEASES = 64


class ReleaseDispatcher:
    def __init__(
        self,
        engine: QueueEngine,
        store: Store,
        *,
        wake: asyncio.Event,
        handed_over: asyncio.Queue[ClaimedRelease],
        lease_seconds: float,
        core_deadline_seconds: float,
    ) -> None:
        self._engine = engine
        self._store = store
        # Set by the watch hub (a PENDING job nobody claimed), the sweeper (every pass) and a
        # release attempt that scheduled a retry.
        self._wake = wake
        # Releases this replica claimed when it made their jobs PENDING: started without a claim.
        self._handed_over = handed_over
        self._taker: asyncio.Task[None] | None = None
        self._lease_seconds = lease_seconds
        self._core_deadline_seconds = core_deadline_seconds
        self._slots = asyncio.Semaphore(_MAX_CONCURRENT_RELEASES)
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run(), name="release-dispatcher")
        self._taker = asyncio.create_task(self._take_handed_over(), name="release-hand-over")

    async def stop(self) -> None:
        await cancel_and_wait(self._taker)
        await cancel_and_wait(self._runner)
        # In-flight releases finish (bounded by the core deadline) so no lease is left dangling.
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self._core_deadline_seconds + 1)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                self._wake.clear()
                claimed = await self._claim_and_start()
                failures = 0
                if claimed == _BATCH:
                    continue
                delay = await self._seconds_until_next_due()
            except (errors.QueueError, OSError) as exc:
                failures += 1
                delay = min(_MAX_IDLE_SECONDS, 0.1 * 2**failures)
                log.warning("release dispatcher could not reach the database: %s", exc)
            except Exception:
                failures += 1
                delay = min(_MAX_IDLE_SECONDS, 0.1 * 2**failures)
                log.exception("release dispatcher pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except TimeoutError:
                pass

    async def _take_handed_over(self) -> None:
        """Starts the releases the engine claimed in the transactions that made their jobs PENDING."""
        while True:
            claim = await self._handed_over.get()
            await self._start(claim)

    async def _claim_and_start(self) -> int:
        async with self._store.statements() as db:
            claims = await db.claim_due_releases(lease_seconds=self._lease_seconds, batch_size=_BATCH)
        for claim in claims:
            await self._start(claim)
        return len(claims)

    async def _start(self, claim: ClaimedRelease) -> None:
        await self._slots.acquire()
        task = asyncio.create_task(self._release(claim), name=f"release-{claim.job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, claim: ClaimedRelease) -> None:
        try:
            if await self._engine.release(claim) is ReleaseResult.RETRY:
                # Its retry is due after a backoff shorter than the loop may be asleep for: the
                # loop re-reads the earliest due time (no NOTIFY wakes it for a claimed job).
                self._wake.set()
        except errors.QueueError as exc:
            # The database went away mid-release: the lease runs out and any replica retries.
            log.warning("release attempt interrupted: %s", exc.message, extra={"job_id": claim.job_id, "attempt": claim.attempt})
        except Exception:
            # The lease runs out and any replica retries; nothing is lost.
            log.exception("release attempt failed", extra={"job_id": claim.job_id, "attempt": claim.attempt})
        finally:
            self._slots.release()

    async def _seconds_until_next_due(self) -> float:
        async with self._store.statements() as db:
            due_in = await db.next_release_due_in()
        return _MAX_IDLE_SECONDS if due_in is None else min(_MAX_IDLE_SECONDS, due_in)
