"""The core as the second copy (design I14): its live runs reconciled against the jobs.

An asynchronous PostgreSQL failover can lose commits the service acknowledged: admits (their
jobs, charges and run reservations), releases, completions. The core still holds or judges the
runs of those jobs. Three things follow, each here:

- **Reconciliation** lists the core's live runs (`RunService.ListRuns`) and, for every run no job
  owns and no admit has reserved, decides between adopting it back into a job and canceling it.
  A first-pass run the core judges is such a run even when reserved: it judges only once its job
  committed, so its reservation is what the standby had of an admit acknowledged and released on
  the lost primary, not an admit in flight. A claimed reservation written on an earlier timeline
  is adopted too rather than canceled (`adopt_if_lost`).
  It adopts whenever the core's record suffices (the queue's job id, idempotency key, request
  digest and price travel with CreateRun and come back in `Run.creation`): the click was
  acknowledged, the user was told her job exists, and the core did or does the work, so the job
  comes back with its charge, under its user's lock, idempotently across replicas (the run id and
  the idempotency key are unique). A judging run comes back RUNNING holding a slot, the user's
  PENDING jobs going back to her queue to make room for it (migration 0024: from then on the
  database alone keeps them from the core until it settles, whatever the history's record says);
  a held one QUEUED or PENDING by the normal rules. It cancels, and records the loss in `core_runs_lost`
  for the operator, only when adoption would be wrong or impossible: the record lacks the
  queue's fields, the same click was admitted again meanwhile (another run now carries it), a
  delta's base job was lost too, or the user's balance cannot pay the charge again (I3).
  It runs every QUEUE_CORE_RECONCILE_INTERVAL_SECONDS and at once when the database's identity
  (system identifier, timeline) changes: a promoted standby starts a new timeline.
- **I9 at the core** (`release_gate`): before a first-pass release on a database history the
  queue has not reconciled yet, the core is asked which of the user's first-pass runs are
  judging; one the queue does not count as holding a slot (its job lost, or ended while the core
  still judges) holds the release back, retried like a release with no answer, and is adopted
  (or canceled) at once. Only a failover or a restore makes the database forget a judging run,
  and both start a new history (timeline, system identifier): once a reconciliation has gone
  through whole on the current history, begun after any release from the old one could still
  reach the core, the history is recorded (`core_reconciled_histories`) and releases rely on the
  slot index alone again, without a call to the core each.
- **A completion of an unknown run** (`adopt_for_completion`) adopts the run first (the core's
  record, by GetRun), so the completion applies; while that cannot be decided (the core or the
  database does not answer) the completion is answered RUN_NOT_YET_ADMITTED, which the core
  retries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable

from queue_service import errors, telemetry
from queue_service.config import Config
from queue_service.core_client import CoreClient
from queue_service.engine.tasks import BackgroundTasks
from queue_service.model import (
    Adoption,
    ClaimedRelease,
    CoreRun,
    DatabaseIdentity,
    JobStatus,
    LostRun,
    PromotionLimits,
    RunFate,
)
from queue_service.store import Store

log = logging.getLogger(__name__)

# Orphans settled side by side at most (each asks the core and takes a user's lock).
_ORPHANS_AT_ONCE = 8


@dataclasses.dataclass
class ReconcileReport:
    """What one reconciliation found and did."""

    live_runs: int = 0
    orphans: int = 0
    adopted: int = 0
    lost: int = 0
    supported: bool = True
    trigger: str = "periodic"
    # This reconciliation recorded the current database history as reconciled.
    history_recorded: bool = False


class CoreReconciler:
    """Reconciles the core's live runs against the jobs; one per replica, safe on all at once."""

    def __init__(
        self,
        store: Store,
        core: CoreClient,
        config: Config,
        *,
        wake_dispatcher: Callable[[], None],
        on_database_replaced: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._core = core
        self._config = config
        self._limits = PromotionLimits(config.max_active_per_user, config.release_window_seconds, config.release_lease_seconds)
        self._wake_dispatcher = wake_dispatcher
        self._on_database_replaced = on_database_replaced
        self._identity: DatabaseIdentity | None = None
        # When this replica first saw the current history (monotonic).
        self._identity_seen_at = time.monotonic()
        # A reconciliation that has not yet gone through whole (the core or the new primary not
        # answering yet, an adoption to retry), and why it is owed ("database_changed" after a
        # failover; "history_unreconciled" for a history found unrecorded at start): every look
        # and sweep tries again, not only the next periodic one.
        self._owed_trigger: str | None = None
        self._core_lists_runs = True
        self._last_reconciled = float("-inf")
        # Settlements of strays the release check found, not waited for by the release.
        self._tasks = BackgroundTasks(stop_seconds=1.0)

    # -- when ------------------------------------------------------------------------------------

    @property
    def identity(self) -> DatabaseIdentity | None:
        """The database's identity at the last look (None before the first)."""
        return self._identity

    @property
    def reconcile_owed(self) -> bool:
        """A reconciliation is owed: the database's change (or an unrecorded history) asked for
        one that has not gone through whole yet, or the current history is due to be recorded."""
        return self._owed_trigger is not None or self._history_record_due()

    def _straggler_seconds(self) -> float:
        """How long after a new history appeared a ReleaseRun begun on the old one may still
        reach the core: its deadline, and a second to spare. A reconciliation that listed the
        core's runs sooner may have missed such a run, so it does not record the history."""
        return self._config.core_deadline_seconds + 1.0

    def _history_unrecorded(self) -> bool:
        """The last look found a history this replica could record and that is not recorded."""
        identity = self._identity
        return identity is not None and identity.timeline_id is not None and not identity.reconciled and self._core_lists_runs

    def _history_record_due(self) -> bool:
        return self._history_unrecorded() and time.monotonic() - self._identity_seen_at >= self._straggler_seconds()

    async def database_replaced(self) -> bool:
        """Whether the database's identity changed since the last look (the first look only
        learns it, and owes a reconciliation when that history was never reconciled: the fleet
        may have restarted on a promoted standby). A failover changes the timeline."""
        async with self._store.statements() as db:
            identity = await db.database_identity()
        previous, self._identity = self._identity, identity
        # A record that vanished from a history this replica saw recorded (a restore that kept
        # the identity, an operator clearing it to have releases ask the core again) is a new
        # history too: the straggler bound runs again before it may be recorded.
        record_vanished = previous is not None and previous.reconciled and not identity.reconciled
        if identity != previous or record_vanished:
            self._identity_seen_at = time.monotonic()
        if record_vanished and identity == previous:
            log.warning("the record that this database history was reconciled with the core is gone: releases ask the core first again")
        if previous is None and self._history_unrecorded():
            self._owed_trigger = self._owed_trigger or "history_unreconciled"
        if previous is None or identity == previous or identity.timeline_id is None:
            return False
        log.warning(
            "the database changed (system %s timeline %s, was %s timeline %s): reconciling with the core's runs",
            identity.system_identifier,
            identity.timeline_id,
            previous.system_identifier,
            previous.timeline_id,
        )
        self._owed_trigger = "database_changed"
        self._on_database_replaced()
        return True

    async def reconcile_if_due(self) -> ReconcileReport | None:
        """The sweeper's step: reconciles at once after the database changed (or when its
        history is unrecorded), else once per QUEUE_CORE_RECONCILE_INTERVAL_SECONDS."""
        await self.database_replaced()
        trigger = self._owed_trigger or ("history_unreconciled" if self._history_record_due() else None)
        interval = self._config.core_reconcile_interval_seconds
        if trigger is None and (interval <= 0 or time.monotonic() - self._last_reconciled < interval):
            return None
        return await self.reconcile(trigger=trigger or "periodic")

    # -- reconciliation ------------------------------------------------------------------------

    async def reconcile(self, *, trigger: str = "periodic") -> ReconcileReport:
        """Lists the core's live runs and settles every one the queue does not know."""
        report = ReconcileReport(trigger=trigger)
        identity, seen_at, listed_at = self._identity, self._identity_seen_at, time.monotonic()
        with telemetry.tracer.start_as_current_span("core.reconcile") as span:
            span.set_attribute("queue.reconcile.trigger", trigger)
            try:
                runs = await self._core.list_runs()
            except errors.CoreUnavailable:
                telemetry.metrics.core_reconciliations.add(1, {"trigger": trigger, "result": "unavailable"})
                raise
            if runs is None:
                # A core that lists no runs: nothing to retry, no history to record (I9 at the
                # core is not asked of it either: it lists nothing).
                self._owed_trigger, self._core_lists_runs = None, False
                report.supported = False
                telemetry.metrics.core_reconciliations.add(1, {"trigger": trigger, "result": "unsupported"})
                return report
            report.live_runs = len(runs)
            orphans = await self._unknown(runs)
            report.orphans = len(orphans)
            gate = asyncio.Semaphore(_ORPHANS_AT_ONCE)

            async def settle(run: CoreRun) -> str:
                async with gate:
                    try:
                        return await self.settle_orphan(run)
                    except errors.QueueError as exc:
                        log.warning("orphaned run %s not settled yet (%s); the next reconciliation retries", run.run_id, exc.message)
                        return "retry"

            # Judging runs first: they do hold their users' slots at the core, so they take the
            # free ones, and a held run adopted after them waits behind (QUEUED), not in front.
            outcomes = await asyncio.gather(*(settle(run) for run in orphans if run.fate is RunFate.JUDGING))
            outcomes += await asyncio.gather(*(settle(run) for run in orphans if run.fate is not RunFate.JUDGING))
            report.adopted = outcomes.count("adopted")
            report.lost = outcomes.count("lost")
            self._last_reconciled = time.monotonic()
            if "retry" not in outcomes:
                self._owed_trigger = None
                if identity is not None and listed_at - seen_at >= self._straggler_seconds():
                    report.history_recorded = await self._record_history(identity)
            for name, value in dataclasses.asdict(report).items():
                if name != "trigger":
                    span.set_attribute(f"queue.reconcile.{name}", value)
        telemetry.metrics.core_reconciliations.add(1, {"trigger": trigger, "result": "ok"})
        if report.orphans:
            log.info("reconciled the core's live runs", extra={"reason": trigger, "amount": report.orphans})
        return report

    async def _record_history(self, identity: DatabaseIdentity) -> bool:
        """Records that `identity`'s history is reconciled (when the database still writes it)."""
        if identity.timeline_id is None or identity.reconciled:
            return False
        try:
            async with self._store.statements() as db:
                recorded = await db.record_reconciled_history(identity)
        except errors.QueueError as exc:
            log.info("could not record the reconciled database history yet (%s); the next look retries", exc.message)
            return False
        if recorded and self._identity == identity:
            self._identity = dataclasses.replace(identity, reconciled=True)
            log.info(
                "database history reconciled with the core: releases no longer ask the core first",
                extra={"reason": f"system {identity.system_identifier} timeline {identity.timeline_id}"},
            )
        return recorded

    async def _unknown(self, runs: list[CoreRun]) -> list[CoreRun]:
        """The runs no job owns and no admit has reserved, and the judging first-pass runs no job
        owns whatever their reservation (read after the list: a run listed
        whose admit committed meanwhile is known by then)."""
        if not runs:
            return []
        judging = [run.run_id for run in runs if run.first_pass and run.fate is RunFate.JUDGING]
        async with self._store.statements() as db:
            unknown = await db.runs_unknown_to_queue(run_ids=[run.run_id for run in runs], judging_first_pass=judging)
        return [run for run in runs if run.run_id in unknown]

    async def settle_orphan(self, listed: CoreRun) -> str:
        """Adopts or cancels one run the queue did not know when it looked: 'adopted', 'lost',
        or 'known' (a job owns it after all, or an admit is in flight with it)."""
        # Asked again after the database was read: a run listed before its admit's clean-up
        # canceled it (and dropped the reservation) is canceled now, never adopted.
        run = await self._core.get_run_record(listed.run_id)
        if run is None or run.fate.settled:
            return "known"
        return await self._adopt_or_cancel(run)

    async def _abandoned(self, run_id: uuid.UUID) -> bool:
        """A failed admit's run, confirmed settled at the core: no lost job, never adopted (I5)."""
        async with self._store.statements() as db:
            return await db.run_abandoned(run_id=run_id)

    async def _adopt_or_cancel(self, run: CoreRun, *, cancel: bool = True) -> str:
        if await self._abandoned(run.run_id):
            return "abandoned"
        if not run.adoptable:
            return await self._lose(run, "record_incomplete", cancel=cancel)
        adoption = await self._store.adopt_run(run, self._limits, reconcile_after_seconds=self._config.reconcile_after_seconds)
        if adoption.kind == "adopted":
            view = adoption.view
            assert view is not None
            state = "judging" if run.fate is RunFate.JUDGING else "held"
            telemetry.metrics.core_runs_adopted.add(1, {"state": state})
            log.warning(
                "adopted a run whose job the database had lost",
                extra={"job_id": view.job_id, "user_id": view.user_id, "run_id": run.run_id, "status": view.status, "amount": run.price},
            )
            self._log_taken_back(adoption)
            if view.status is JobStatus.PENDING:
                self._wake_dispatcher()
            return "adopted"
        if adoption.kind == "reserved":
            return "reserved"
        if adoption.kind == "known":
            return "known"
        return await self._lose(run, adoption.kind, cancel=cancel)

    @staticmethod
    def _log_taken_back(adoption: Adoption) -> None:
        """The user's PENDING jobs an adopted judging run sent back to her queue: the database
        keeps them from the core until that run settles (I9), then promotes them first."""
        for job in adoption.taken_back:
            log.warning(
                "a job went back to its queue: a run adopted after a database failover judges in its place",
                extra={"job_id": job.job_id, "user_id": job.user_id, "run_id": job.run_id, "status": job.status},
            )

    async def _lose(self, run: CoreRun, reason: str, *, cancel: bool) -> str:
        """Records the run as lost for the operator, then cancels it (confirmed by the core, or
        retried by the next reconciliation while it stays live)."""
        lost = LostRun(run.run_id, run.user_id, run.job_id, run.idempotency_key, run.price, run.fate.value, reason)
        async with self._store.statements() as db:
            first = await db.record_lost_run(lost)
        if first:
            telemetry.metrics.core_runs_lost.add(1, {"reason": reason})
            log.warning(
                "a run whose job the database lost could not be adopted; canceling it",
                extra={"run_id": run.run_id, "user_id": run.user_id, "job_id": run.job_id, "reason": reason, "amount": run.price},
            )
        if cancel:
            await self._core.cancel_run(run.run_id)
        return "lost"

    # -- I9 at the core --------------------------------------------------------------------------

    async def release_gate(self, claim: ClaimedRelease) -> str | None:
        """Why this first-pass release must wait, or None. It waits while the core reports as
        many of the user's other first-pass runs judging as her limit, counting those whose job
        holds a slot and those no job knows: the core's count, where the database's may have
        forgotten a judging run in a failover (I9). A run whose job ended with the core's
        confirmation that it settled is not counted. The unknown ones are adopted (or canceled)
        at once. Raises CoreUnavailable when the
        core does not answer (the release waits, as for no answer).

        Asked only on a database history not yet reconciled with the core: the claim's own
        statement says which (`history_reconciled`); where it did not, the database is asked,
        once the replica's last look found the history recorded."""
        reconciled = claim.history_reconciled
        if reconciled is None and self._identity is not None and self._identity.reconciled:
            async with self._store.statements() as db:
                reconciled = await db.history_reconciled()
        if reconciled:
            return None
        telemetry.metrics.release_checks_at_core.add(1)
        runs = await self._core.list_runs(user_id=claim.user_id, judging_only=True)
        others = [run for run in runs or () if run.first_pass and run.run_id != claim.run_id]
        if not others:
            return None
        run_ids = [run.run_id for run in others]
        async with self._store.statements() as db:
            limit = await db.user_slot_limit(user_id=claim.user_id, default_max_active=self._config.max_active_per_user)
            counted = await db.runs_taking_a_slot(run_ids=run_ids)
            unknown = await db.runs_unknown_to_queue(run_ids=run_ids, judging_first_pass=run_ids) if counted else set()
        for run in others:
            if run.run_id in unknown:
                self._tasks.in_background(self._settle_stray(run), name=f"settle-stray-{run.run_id}")
        if len(counted) < limit:
            return None
        telemetry.metrics.releases_held_for_core.add(1)
        first = next(run.run_id for run in others if run.run_id in counted)
        return (
            f"the core reports {len(counted)} other first-pass run(s) of this user judging (run {first} first),"
            f" her limit is {limit}: the release waits until one settles"
        )

    async def adopt_if_lost(self, run_id: uuid.UUID) -> bool:
        """A reserved run is about to be canceled (its reservation claimed by the sweeper once its
        grace is over, or by its admit's own clean-up): True when it must not be, because its job
        was lost in a failover. That is so when the core judges it as a first-pass run (it judges
        only once its job committed: the standby had only the reservation), or when the
        reservation was written on an earlier timeline than the current primary's (its admit ran
        on a primary a failover replaced: it committed there and was acknowledged, or answered an
        error the client retries with the same key, finding the adopted job). The run is adopted
        (the reservation consumed; True also when a job owns it already, adopted meanwhile by
        another path); where it cannot be, it is recorded lost and False lets the cancel go on.
        Raises CoreUnavailable when the core does not answer (the cancel is retried)."""
        run = await self._core.get_run_record(run_id)
        if run is None or run.fate.settled:
            return False
        if not (run.first_pass and run.fate is RunFate.JUDGING):
            # A held run: adopted only when an earlier timeline wrote its reservation. Asked
            # without the user's lock, so a failed admit's clean-up (the common case, this
            # timeline's) never waits for a busy user queue before it cancels.
            async with self._store.statements() as db:
                if not await db.reservation_of_an_earlier_timeline(run_id=run_id):
                    return False
        # "known": adopted meanwhile (the release gate, another replica's reconciliation): a job
        # owns the run now, and a claim taken before must not cancel it. "reserved": an admit's
        # reservation of this timeline, canceled as before.
        return await self._adopt_or_cancel(run, cancel=False) in ("adopted", "known")

    async def _settle_stray(self, run: CoreRun) -> None:
        try:
            await self.settle_orphan(run)
        except errors.QueueError as exc:
            log.warning("a judging run the queue does not count was not settled yet (%s); reconciliation retries", exc.message)

    # -- completions of unknown runs ---------------------------------------------------------------

    async def adopt_for_completion(self, run_id: uuid.UUID) -> bool:
        """A CompleteRun came for a run no job owns: adopts it from the core's record (as the
        judging run it was) so the completion can apply. True when a job owns the run now; False
        when it never will (the core does not know it, or it could not be adopted: recorded as
        lost). Raises RunNotYetAdmitted while an admit is still in flight with it, and the
        core's or the database's unavailability while it cannot be decided."""
        with telemetry.tracer.start_as_current_span("core.adopt_for_completion") as span:
            span.set_attribute("queue.run_id", str(run_id))
            run = await self._core.get_run_record(run_id)
            # A run the core holds or canceled never judged to an end: its completion records no
            # work. A failed admit's run (a delta judges at once, and may finish before the admit's
            # cancel reaches it) was answered as an error: adopting it would charge a job behind
            # that answer (I5).
            if run is None or run.fate in (RunFate.HELD, RunFate.CANCELED) or await self._abandoned(run_id):
                return False
            if not run.adoptable:
                await self._lose(run, "record_incomplete", cancel=False)
                return False
            telemetry.metrics.core_reconciliations.add(1, {"trigger": "completion", "result": "ok"})
            # It was judging when the database lost its job: adopted RUNNING, then completed.
            judged = dataclasses.replace(run, fate=RunFate.JUDGING)
            adoption = await self._store.adopt_run(judged, self._limits, reconcile_after_seconds=self._config.reconcile_after_seconds)
            span.set_attribute("queue.adoption", adoption.kind)
            if adoption.kind == "reserved":
                raise errors.RunNotYetAdmitted(
                    f"the admit of run {run_id} has not committed yet; retry the completion shortly", metadata={"runId": str(run_id)}
                )
            if adoption.kind in ("adopted", "known"):
                if adoption.kind == "adopted":
                    self._log_taken_back(adoption)
                    telemetry.metrics.core_runs_adopted.add(1, {"state": "finished"})
                    log.warning("adopted a finished run whose job the database had lost", extra={"run_id": run_id, "user_id": run.user_id})
                return True
            await self._lose(run, adoption.kind, cancel=False)
            return False

    async def stop(self) -> None:
        await self._tasks.stop()
