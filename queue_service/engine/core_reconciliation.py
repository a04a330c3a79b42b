"""The core as the second copy (design I14): its live runs reconciled against the jobs.

An asynchronous PostgreSQL failover can lose commits the service acknowledged: admits (their
jobs, charges and run reservations), releases, completions. The core still holds or judges the
runs of those jobs. Three things follow:

- **Reconciliation** lists the core's live runs (`RunService.ListRuns`) and, for every run no job
  owns and no admit has reserved, decides between adopting it back into a job and canceling it.
  A first-pass run the core judges is such a run even when reserved: it judges only once its job
  committed, so its reservation is what the standby had of an admit acknowledged and released on
  the lost primary, not an admit in flight. A claimed reservation written on an earlier timeline
  is adopted too rather than canceled (`adopt_if_lost`).
  Adopting or canceling a run is `core_adoption.RunAdoption`'s.
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
- **A completion of an unknown run** (`adopt_for_completion`) adopts the run first, so the
  completion applies (`RunAdoption.adopt_for_completion`).
- **Runs the core forgot** (the other direction, `engine.forgotten_runs`): every listing also
  finds the active jobs whose run it did not show and ends those the core answers NOT_FOUND
  for; a probe of one active job's run every few seconds (`probe_if_due`) makes a listing due at
  once (trigger `run_forgotten`) when the core came back without its runs.

These answer the engine's rooms as their `FailoverGuard` (`engine/ports.py`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable

from queue_service import errors, telemetry
from queue_service.config import Config, settings_of
from queue_service.engine.core_adoption import RunAdoption, RunAdoptionSettings
from queue_service.engine.forgotten_runs import ForgottenRuns, JobEnder
from queue_service.engine.parts import SharedParts
from queue_service.engine.tasks import BackgroundTasks, each_at_most
from queue_service.model import (
    ClaimedRelease,
    CoreRun,
    DatabaseIdentity,
    RunFate,
)

log = logging.getLogger(__name__)

# Orphans settled side by side at most (each asks the core and takes a user's lock).
_ORPHANS_AT_ONCE = 8
# How old a health probe's reading of the database's identity may be for a look to take it
# instead of reading its own (at most one and a half health intervals): a look comes every 2 s.
_PROBED_IDENTITY_FRESH_SECONDS = 1.0
# How often an active job's run is asked about at the core (`ForgottenRuns.probe`), at most: a
# core that came back without its runs is noticed this long after at most (and a look's 2 s).
FORGOTTEN_RUN_PROBE_SECONDS = 10.0


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
    # Active jobs whose run the core no longer knew: failed and refunded (`engine.forgotten_runs`).
    forgotten: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CoreReconcilerSettings:
    """The settings the reconciler reads (QUEUE_* of the same names), and its adoptions'."""

    core_deadline_seconds: float
    core_reconcile_interval_seconds: float
    health_interval_seconds: float
    max_active_per_user: int
    adoption: RunAdoptionSettings

    @classmethod
    def from_config(cls, config: Config) -> CoreReconcilerSettings:
        return settings_of(cls, config, adoption=RunAdoptionSettings.from_config(config))


class CoreReconciler:
    """Reconciles the core's live runs against the jobs; one per replica, safe on all at once."""

    def __init__(
        self,
        parts: SharedParts,
        settings: CoreReconcilerSettings,
        *,
        on_database_replaced: Callable[[], None] = lambda: None,
        ender: JobEnder | None = None,
    ) -> None:
        store, core = parts.store, parts.core
        self._store = store
        self._core = core
        self._settings = settings
        # Adopts or cancels the runs no job owns, whoever finds them.
        self._adoption = RunAdoption(store, core, settings.adoption, wake_dispatcher=parts.wake_dispatcher)
        self._on_database_replaced = on_database_replaced
        # Ends the jobs whose run the core forgot (without an ender: only runs the queue lost).
        self._forgotten = ForgottenRuns(store, core, ender) if ender is not None else None
        # A replica started after the core came back probes at its first look.
        self._last_probed = float("-inf")
        self._identity: DatabaseIdentity | None = None
        # When the reading `_identity` holds was taken (monotonic): an older one is never taken.
        self._identity_read_at = float("-inf")
        # When this replica first saw the current history (monotonic).
        self._identity_seen_at = time.monotonic()
        # A reconciliation that has not yet gone through whole (the core or the new primary not
        # answering yet, an adoption to retry), and why it is owed ("database_changed" after a
        # failover; "history_unreconciled" for a history found unrecorded at start;
        # "run_forgotten" when the core did not know an active job's run): every look and sweep
        # tries again, not only the next periodic one.
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
        return self._settings.core_deadline_seconds + 1.0

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
        # Health's probe reads the identity in its commit every QUEUE_HEALTH_INTERVAL_SECONDS: a
        # reading that fresh, taken after the one this replica holds, saves a statement.
        now = time.monotonic()
        fresh_after = now - min(_PROBED_IDENTITY_FRESH_SECONDS, 1.5 * self._settings.health_interval_seconds)
        probed = self._store.probed_identity(started_after=max(fresh_after, self._identity_read_at))
        if probed is not None:
            read_at, identity = probed
        else:
            read_at = now
            async with self._store.statements() as db:
                identity = await db.database_identity()
        previous, self._identity, self._identity_read_at = self._identity, identity, read_at
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

    def _probe_interval(self) -> float:
        interval = self._settings.core_reconcile_interval_seconds
        return min(FORGOTTEN_RUN_PROBE_SECONDS, interval) if interval > 0 else FORGOTTEN_RUN_PROBE_SECONDS

    async def probe_if_due(self) -> bool:
        """Every FORGOTTEN_RUN_PROBE_SECONDS (or the reconcile interval, when shorter): asks the core
        about one active job's run; NOT_FOUND makes a listing owed at once (`run_forgotten`), so a
        core that came back without its runs is noticed within seconds, not at the next periodic
        listing. Whether this look made one owed."""
        if self._forgotten is None or not self._core_lists_runs or self._owed_trigger is not None:
            return False
        if time.monotonic() - self._last_probed < self._probe_interval():
            return False
        self._last_probed = time.monotonic()
        if not await self._forgotten.probe():
            return False
        self._owed_trigger = "run_forgotten"
        return True

    async def reconcile_if_due(self) -> ReconcileReport | None:
        """The sweeper's step: reconciles at once after the database changed (or when its
        history is unrecorded), else once per QUEUE_CORE_RECONCILE_INTERVAL_SECONDS."""
        await self.database_replaced()
        trigger = self._owed_trigger or ("history_unreconciled" if self._history_record_due() else None)
        interval = self._settings.core_reconcile_interval_seconds
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
            listed_after: dt.datetime | None = None
            if self._forgotten is not None:
                # Before the listing: a job admitted before it began has its run at the core by
                # then (its CreateRun was answered before its insert), so the listing must show it.
                async with self._store.statements() as db:
                    listed_after = await db.database_clock()
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
            outcomes = await self._settle_orphans(orphans)
            report.adopted = outcomes.count("adopted")
            report.lost = outcomes.count("lost")
            more_forgotten = await self._end_forgotten(runs, listed_after, report)
            self._last_reconciled = time.monotonic()
            if "retry" not in outcomes:
                self._owed_trigger = None
                if identity is not None and listed_at - seen_at >= self._straggler_seconds():
                    report.history_recorded = await self._record_history(identity)
            if more_forgotten:
                self._owed_trigger = self._owed_trigger or "run_forgotten"
            for name, value in dataclasses.asdict(report).items():
                if name != "trigger":
                    span.set_attribute(f"queue.reconcile.{name}", value)
        telemetry.metrics.core_reconciliations.add(1, {"trigger": trigger, "result": "ok"})
        if report.orphans:
            log.info("reconciled the core's live runs", extra={"reason": trigger, "amount": report.orphans})
        if report.forgotten:
            log.warning(
                "failed and refunded the jobs whose run the core no longer knew", extra={"reason": trigger, "amount": report.forgotten}
            )
        return report

    async def _settle_orphans(self, orphans: list[CoreRun]) -> list[str]:
        """Adopts or cancels the runs no job owns, a few at once; each one's outcome ("adopted",
        "lost", or "retry" when it could not be settled yet)."""
        outcomes: list[str] = []
        # Judging runs first: they do hold their users' slots at the core, so they take the
        # free ones, and a held run adopted after them waits behind (QUEUED), not in front.
        judging = [run for run in orphans if run.fate is RunFate.JUDGING]
        held = [run for run in orphans if run.fate is not RunFate.JUDGING]
        for runs in (judging, held):
            for run, outcome in zip(runs, await each_at_most(_ORPHANS_AT_ONCE, runs, self.settle_orphan), strict=True):
                if isinstance(outcome, errors.QueueError):
                    log.warning("orphaned run %s not settled yet (%s); the next reconciliation retries", run.run_id, outcome.message)
                    outcome = "retry"
                outcomes.append(outcome)
        return outcomes

    async def _end_forgotten(self, runs: list[CoreRun], listed_after: dt.datetime | None, report: ReconcileReport) -> bool:
        """Ends the active jobs admitted before `listed_after` whose run the listing did not show
        and the core does not know (`engine.forgotten_runs`), counted in `report`; whether more
        are left for the next look (those not read yet included)."""
        if self._forgotten is None or listed_after is None:
            return False
        try:
            report.forgotten, more_forgotten = await self._forgotten.end_unlisted(runs, listed_after=listed_after)
        except errors.QueueError as exc:
            log.warning("jobs whose run the core did not list were not read yet (%s); the next look retries", exc.message)
            return True
        return more_forgotten

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
            # A probe begun before the record would say it is missing.
            self._identity_read_at = time.monotonic()
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
        """Adopts or cancels one run the queue did not know when it looked (`RunAdoption`)."""
        return await self._adoption.settle_orphan(listed)

    # -- the failover guard: I9 at the core, and adoptions the rooms ask for ----------------------

    async def adopt_if_lost(self, run_id: uuid.UUID) -> bool:
        """A reserved run about to be canceled whose job a failover lost (`RunAdoption.adopt_if_lost`)."""
        return await self._adoption.adopt_if_lost(run_id)

    async def adopt_for_completion(self, run_id: uuid.UUID) -> bool:
        """A completion of a run no job owns (`RunAdoption.adopt_for_completion`)."""
        return await self._adoption.adopt_for_completion(run_id)

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
            limit = await db.user_slot_limit(user_id=claim.user_id, default_max_active=self._settings.max_active_per_user)
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

    async def _settle_stray(self, run: CoreRun) -> None:
        try:
            await self.settle_orphan(run)
        except errors.QueueError as exc:
            log.warning("a judging run the queue does not count was not settled yet (%s); reconciliation retries", exc.message)

    async def stop(self) -> None:
        await self._tasks.stop()
