"""Identity watch: the database's identity (its timeline) looked at every few seconds, so a
failover is seen within seconds, not a sweep interval later; after a change the core's live runs
are reconciled with the jobs and a whole sweep runs (`Sweeper.after_database_replaced`). The same
looks probe the core for one active job's run now and then (`CoreReconciler.probe_if_due`), so a
core that came back without its runs is reconciled within seconds too."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from queue_service import deadline, errors
from queue_service.background import SupervisedLoop
from queue_service.engine.maintenance.ports import Reconciling

log = logging.getLogger("queue_service.engine.sweeper")

# How often the identity is looked at; failed looks in a row before one is logged as a warning;
# how long one look may take.
CHECK_SECONDS = 2.0
FAILURES_BEFORE_WARNING = 3
LOOK_SECONDS = 4.0


@dataclasses.dataclass
class IdentityWatch:
    """What the database identity watch has done (for logs, tests and diagnosis)."""

    looks: int = 0
    changes_seen: int = 0
    work_owed: bool = False
    failures_in_a_row: int = 0
    last_failure: str = ""


class DatabaseIdentityWatch:
    """Looks at the database's identity, first at once (the identity this replica started on),
    and does the work after a change (`after_change`) as soon as it changed. That work is owed
    until it has gone through whole (the new primary or the core not answering yet), retried at
    every look rather than at the next sweep. Failing looks are logged quietly at first, then as
    a warning, so a watch that cannot see the database is noticed."""

    def __init__(self, reconciler: Reconciling, after_change: Callable[[], Awaitable[None]], *, sweep_interval_seconds: float) -> None:
        self._reconciler = reconciler
        self._after_change = after_change
        self.record = IdentityWatch()
        self.loop = SupervisedLoop(
            "database-identity-watch",
            self.look,
            interval_seconds=min(CHECK_SECONDS, sweep_interval_seconds),
            jitter=(0.8, 1.0),
            # A look reports its own failures (quietly at first).
            expected=(),
        )

    async def look(self) -> None:
        watch = self.record
        watch.looks += 1
        try:
            # A look is one trivial read: bounded like a call, so a look whose exchange stalls (a
            # connection left half-open by the failover) is given up in seconds.
            with deadline.call_budget(LOOK_SECONDS):
                replaced = await self._reconciler.database_replaced()
            if replaced:
                watch.changes_seen += 1
                watch.work_owed = True
            if watch.work_owed:
                await self._after_change()
                watch.work_owed = False
            else:
                # A core that came back without its runs makes a reconciliation owed at once.
                await self._reconciler.probe_if_due()
                if self._reconciler.reconcile_owed:
                    # An orphan the reconciliation after the change could not settle yet, or the
                    # jobs whose runs the core forgot.
                    await self._reconciler.reconcile_if_due()
            if watch.failures_in_a_row >= FAILURES_BEFORE_WARNING:
                log.info("database identity watch works again after %d failed looks", watch.failures_in_a_row)
            watch.failures_in_a_row = 0
        except Exception as exc:
            watch.failures_in_a_row += 1
            watch.last_failure = f"{exc.__class__.__name__}: {exc}"
            loud = watch.failures_in_a_row % FAILURES_BEFORE_WARNING == 0
            if isinstance(exc, errors.QueueError):
                log.log(
                    logging.WARNING if loud else logging.DEBUG,
                    "database identity look failed (%s, %d in a row%s); retrying",
                    exc.message,
                    watch.failures_in_a_row,
                    ", failover work owed" if watch.work_owed else "",
                )
            else:
                log.exception("database identity look failed; retrying")
