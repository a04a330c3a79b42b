"""Runs the core forgot: active jobs whose run the core no longer knows, found and ended.

A core that restarts without its runs (a standalone core killed and started afresh), or that lets
a held run expire (`hold_expiry_seconds` at the dev core), leaves jobs that claim a run nothing
will ever judge: a RUNNING job would wait for a completion that never comes, a PENDING or QUEUED
one for a release the core answers NOT_FOUND. Two looks find them:

- **the probe** (`probe`): every few seconds one active job's run (the longest-running job's
  first) is asked about with `GetRun`; a core that answers NOT_FOUND for it came back without its
  runs, and a listing is due at once (`CoreReconciler`'s `run_forgotten` trigger);
- **the listing** (`end_unlisted`): every reconciliation of the core's live runs (`ListRuns`) also
  reads the active jobs admitted before the listing began whose run it did not show, and asks the
  core about each with `GetRun`.

Only the core's own NOT_FOUND for a job that is in the database ends it: a job is inserted only
after the core answered its CreateRun, so its run existed at the core before; the listing's fence
(`listed_after`) only spares calls for jobs admitted while it was read. A core that does not answer
(an outage, a slow core) ends nothing; a run that ended meanwhile (its completion on the way)
answers its end state and is left to its completion. The ending (`Transition.forgotten_by_core`)
is fenced by the job's status and release attempt, so replicas doing this at once, a release or a
completion racing it, apply one ending and one refund. It fails the job with a clear `last_error`
and refunds it as a reconciliation does (the user did not cause it); the run is canceled
afterwards (a CreateRun still on its way then finds it canceled), which frees its seat and
promotes the user's next job.

A forgotten held run is failed rather than created again: the job's place is kept by nothing the
core still has, and a second CreateRun under the same id would make a run twice should the core
still have the first after all (a core answering from a restored state); one answer the user can
act on (her credits back, admit again, or an operator's RetryJob) is safer than a hidden re-run.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Sequence
from typing import Protocol

from queue_service import errors, telemetry
from queue_service.core_client import CoreClient
from queue_service.engine.tasks import each_at_most
from queue_service.model import CoreRun, JobEnding, RunFate, Transition, UnlistedRun
from queue_service.store import Store

log = logging.getLogger(__name__)

# Jobs one listing asks the core about at most (the rest: the next look, seconds later).
UNLISTED_PER_LISTING = 2_000
# GetRun calls side by side at most.
_ASKED_AT_ONCE = 16


class JobEnder(Protocol):
    """What ends a job (`QueueEngine.end_job`: the ending, its refund, the settlement after)."""

    async def end_job(self, job_id: uuid.UUID, user_id: str, transition: Transition) -> JobEnding | None: ...


class ForgottenRuns:
    def __init__(self, store: Store, core: CoreClient, ender: JobEnder) -> None:
        self._store = store
        self._core = core
        self._ender = ender

    async def probe(self) -> bool:
        """Whether the core answered NOT_FOUND for the run of one active job (it came back
        without its runs: a listing is due). False without active jobs or without an answer."""
        async with self._store.statements() as db:
            run_id = await db.run_to_probe_at_the_core()
        if run_id is None:
            return False
        try:
            report = await self._core.get_run(run_id)
        except errors.CoreUnavailable:
            return False
        if report.fate is not RunFate.UNKNOWN_TO_CORE:
            return False
        log.warning("the core does not know an active job's run: listing its live runs now", extra={"run_id": run_id})
        return True

    async def end_unlisted(self, runs: Sequence[CoreRun], *, listed_after: dt.datetime) -> tuple[int, bool]:
        """Asks the core about every active job admitted before `listed_after` whose run `runs`
        (its live runs, listed from then on) did not show, and ends those it does not know.
        Returns how many ended and whether more such jobs are left for the next look."""
        async with self._store.statements() as db:
            unlisted = await db.jobs_with_runs_not_listed(
                run_ids=[run.run_id for run in runs], listed_after=listed_after, batch_size=UNLISTED_PER_LISTING
            )
        if not unlisted:
            return 0, False
        ended = 0
        for outcome in await each_at_most(_ASKED_AT_ONCE, unlisted, self.end_if_forgotten):
            if isinstance(outcome, errors.QueueError):
                log.warning("a job whose run the core did not list was not settled yet (%s); the next look retries", outcome.message)
            else:
                ended += outcome
        return ended, len(unlisted) >= UNLISTED_PER_LISTING

    async def end_if_forgotten(self, job: UnlistedRun) -> bool:
        """Ends the job when the core answers that it does not know its run; whether it did."""
        try:
            report = await self._core.get_run(job.run_id)
        except errors.CoreUnavailable:
            return False
        if report.fate is not RunFate.UNKNOWN_TO_CORE:
            # Live after all (listed late), or ended with its completion on the way: not lost.
            return False
        ending = await self._ender.end_job(job.job_id, job.user_id, Transition.forgotten_by_core(job.status, attempts=job.release_attempts))
        if ending is None:
            return False  # it moved meanwhile (released, completed, canceled): that path decides
        telemetry.metrics.core_runs_forgotten.add(1, {"status": str(job.status)})
        log.warning(
            "the core does not know this job's run: failed and refunded",
            extra={"job_id": job.job_id, "user_id": job.user_id, "run_id": job.run_id, "status": job.status},
        )
        return True
