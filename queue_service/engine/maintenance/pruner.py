"""The pruner: ended jobs do not stay forever (docs/security.md, "What one user can store").

Every QUEUE_PRUNE_INTERVAL_SECONDS (at the sweeper's first pass after; at every pass while it is
behind) it empties the full sources of jobs that ended more than
QUEUE_JOB_INPUTS_RETENTION_SECONDS ago (their document, first 10 sources and counts stay; a
RetryJob of them answers `JOB_INPUTS_PRUNED`), then deletes jobs that ended more than
QUEUE_JOB_RETENTION_SECONDS ago, as River's job cleaner and Oban's pruner do: in bounded batches,
oldest first, each found by an index, rows another transaction holds skipped, so every replica may
prune at once. A job still active, one whose run is not yet settled, and the base of a kept delta
re-check are never deleted. The credit ledger keeps a pruned job's entries (migration 0026), so
every balance still equals its ledger (I3).
"""

from __future__ import annotations

import dataclasses
import logging

from queue_service import telemetry
from queue_service.config import Config, settings_of
from queue_service.engine.maintenance.service import EVERY_PASS, Work, guarded
from queue_service.store import Statements, Store

log = logging.getLogger(__name__)

# Sources are up to about a megabyte a job, so their batches are small (one statement's work stays
# well within the statement timeout); a pass does at most this many statements of each kind, the
# rest waits for the next pass.
_INPUTS_BATCH = 50
_JOBS_BATCH = 500
_STATEMENTS_PER_PASS = 20


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PruneSettings:
    """The settings the pruner reads (QUEUE_* of the same names)."""

    job_retention_seconds: float
    job_inputs_retention_seconds: float
    prune_interval_seconds: float

    @classmethod
    def from_config(cls, config: Config) -> PruneSettings:
        return settings_of(cls, config)


@dataclasses.dataclass
class PruneReport:
    inputs_pruned: int = 0
    jobs_pruned: int = 0


async def prune_ended_jobs(store: Store, settings: PruneSettings) -> tuple[PruneReport, bool]:
    """One pass: ended jobs' sources past their retention, then ended jobs past theirs; and
    whether it caught up (no batch stopped at the pass's bound)."""
    report = PruneReport()
    caught_up = True
    for _ in range(_STATEMENTS_PER_PASS):
        async with store.statements() as db:
            count = await db.prune_ended_job_inputs(retention_seconds=settings.job_inputs_retention_seconds, batch_size=_INPUTS_BATCH)
        report.inputs_pruned += count
        if count < _INPUTS_BATCH:
            break
    else:
        caught_up = False
    for _ in range(_STATEMENTS_PER_PASS):
        async with store.statements() as db:
            count = await db.prune_ended_jobs(retention_seconds=settings.job_retention_seconds, batch_size=_JOBS_BATCH)
        report.jobs_pruned += count
        if count < _JOBS_BATCH:
            break
    else:
        caught_up = False
    for action, count in dataclasses.asdict(report).items():
        if count:
            telemetry.metrics.sweep_rows.add(count, {"action": action})
    if report.inputs_pruned or report.jobs_pruned:
        log.info("pruned ended jobs past their retention", extra=dataclasses.asdict(report))
    return report, caught_up


class Pruner:
    """The pruner as a maintenance service: its pass runs after every read of the sweep (it
    reports its own rows: `inputs_pruned`, `jobs_pruned`), every QUEUE_PRUNE_INTERVAL_SECONDS
    (default 60 s: a minute's lateness is nothing against retentions of a day and a month, and
    it spares the database the pruner's index scans at most sweeper passes; Oban's pruner and
    River's job cleaner run every 30 s on their own loops) or at every pass while it is behind."""

    action = None

    def __init__(self, store: Store, settings: PruneSettings) -> None:
        self._store = store
        self._settings = settings
        # Whether the previous run deleted all that was past the retentions (a failed run counts
        # as caught up: its next try waits the interval, as a failed pass did before).
        self._caught_up = True

    @property
    def interval_seconds(self) -> float:
        return self._settings.prune_interval_seconds if self._caught_up else EVERY_PASS

    async def find(self, db: Statements) -> Work:
        async def work() -> int:
            _, self._caught_up = await guarded(prune_ended_jobs(self._store, self._settings), (PruneReport(), True))
            return 0

        return work
