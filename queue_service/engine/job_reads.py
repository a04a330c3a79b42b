"""Reading jobs as callers see them: views from the store, with the estimated start of queued jobs.

The estimate comes from the mean judging time of recent first-pass jobs (`model.estimate_start`),
cached briefly per replica so reads stay cheap, and, while the fleet's capacity at the core is
limited, from the wait for it (the capacity's state, cached for a second). A PENDING job waiting
for capacity gets its place in the fleet-wide order (`capacity_position`), read when it is shown.
From a heartbeat of this replica that read the core as unreachable until the core's next answer,
no estimate is made: no start can be promised then. Nor for a job whose releases are paused (the
fleet's pause or her own, as of the capacity's state read within the second).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable

from queue_service import deadline, errors, telemetry
from queue_service.model import (
    AuditEvent,
    AuditQuery,
    CapacityState,
    JobInputs,
    JobSearch,
    JobStatus,
    JobView,
    LiveJobFilter,
    Overview,
    PauseInForce,
    QueueMinute,
    ReplicaReport,
    UserSettings,
    UserWork,
    combined_core_health,
    estimate_start,
)
from queue_service.store import Statements, Store

log = logging.getLogger(__name__)

_ESTIMATE_CACHE_SECONDS = 10.0
# A committed change's answer reads its estimates within this share of what is left of the call,
# so that the answer still goes out when the read does not come back.
_ANSWER_READ_SHARE = 0.5
_CAPACITY_CACHE_SECONDS = 1.0
# While no first-pass job has succeeded yet (no mean judging time), a queued job's estimate reads
# the mean again at most this often, and at once after a run judged on this replica: another
# replica's first completion shows within this time, and admits under load do not each pay a read
# of a mean that is not there (one statement and a pool checkout per queued admit).
_UNKNOWN_MEAN_RETRY_SECONDS = 1.0
# A replica's report of the core counts in the Overview while its heartbeat is this fresh: three
# heartbeats (a replica that stopped beating says nothing of the core now).
CORE_REPORT_FRESH_SECONDS = 15.0
# A RUNNING job is overdue (its run unconfirmed, no start promised behind it) after judging this
# many times the recent mean judging time, and at least OVERDUE_AT_LEAST_SECONDS; without a recent
# mean, after QUEUE_RECONCILE_AFTER_SECONDS (when the sweeper asks the core about it).
OVERDUE_MEAN_FACTOR = 3.0
OVERDUE_AT_LEAST_SECONDS = 60.0
# A watched overview is re-sent at least this often, so ages ("oldest wait") stay current.
_HEARTBEAT_SECONDS = 15.0


class JobReads:
    def __init__(
        self,
        store: Store,
        *,
        default_max_active: int,
        reconcile_after_seconds: float,
        core_reachable: Callable[[], bool] = lambda: True,
    ) -> None:
        self._store = store
        # False while this replica reads the core as unreachable: no start at the core can be
        # promised then, and estimates are left out.
        self._core_reachable = core_reachable
        self._default_max_active = default_max_active
        self._reconcile_after_seconds = reconcile_after_seconds
        self._mean_judging: float | None = None
        self._mean_read_at = float("-inf")
        # A run judged here since the mean was last read: a mean still unknown is read again at once.
        self._judged_since_read = False
        self._capacity: CapacityState | None = None
        self._capacity_read_at = float("-inf")
        # A read of the figure under way: the calls meanwhile answer from the figure in hand (at
        # most a read's length older than the cache allows) instead of each reading it again. At
        # 64 admits at once, the capacity's state cached for a second was read five times a second.
        self._mean_reading = False
        self._capacity_reading = False

    def run_judged(self) -> None:
        """A run judged on this replica (a first-pass job may have succeeded): a mean judging time
        still unknown is read again at the next estimate, not after `_UNKNOWN_MEAN_RETRY_SECONDS`."""
        self._judged_since_read = True

    def _unknown_mean_due(self, now: float) -> bool:
        """No mean judging time yet, and one may have come: a run judged here since the last read,
        or `_UNKNOWN_MEAN_RETRY_SECONDS` passed (another replica's completion)."""
        return self._mean_judging is None and (self._judged_since_read or now - self._mean_read_at > _UNKNOWN_MEAN_RETRY_SECONDS)

    def _mean_due(self, now: float, *, unknown_is_stale: bool) -> bool:
        """The mean judging time is to be read: stale, or (with `unknown_is_stale`) still unknown
        and one may have come; and no read of it is under way, unless none has landed yet."""
        if self._mean_reading and self._mean_read_at > float("-inf"):
            return False
        return now - self._mean_read_at > _ESTIMATE_CACHE_SECONDS or (unknown_is_stale and self._unknown_mean_due(now))

    def _capacity_due(self, now: float) -> bool:
        """The capacity's state is to be read: never read, or stale and no read of it under way."""
        if self._capacity is None:
            return True
        return not self._capacity_reading and now - self._capacity_read_at > _CAPACITY_CACHE_SECONDS

    async def _mean_judging_seconds(self, db: Statements, *, unknown_is_stale: bool = False) -> float | None:
        """The recent mean judging time, read at most every _ESTIMATE_CACHE_SECONDS; with
        `unknown_is_stale`, read again while there is none yet (an estimate must not wait out the
        cache for the first completion a read for overdue runs cached as none), when one may have
        come (`_unknown_mean_due`). One read at a time (`_mean_due`)."""
        if self._mean_due(time.monotonic(), unknown_is_stale=unknown_is_stale):
            # Cleared before the read: a run judged while it is under way is read by the next one.
            self._judged_since_read = False
            self._mean_reading = True
            try:
                self._mean_judging = await db.recent_judging_seconds()
            except BaseException:
                self._judged_since_read = True  # still to be read: the read did not happen
                raise
            finally:
                self._mean_reading = False
            self._mean_read_at = time.monotonic()
        return self._mean_judging

    def estimate_basis(self) -> tuple[float | None, int | None]:
        """What the latest estimates were made from besides each job's own place: the mean judging
        time and the capacity's limit."""
        capacity = self._capacity
        return self._mean_judging, capacity.effective_limit if capacity is not None else None

    def _with_estimates(self, views: Iterable[JobView], positions: dict[uuid.UUID, int]) -> list[JobView]:
        now = dt.datetime.now(dt.UTC)
        mean = self._mean_judging
        capacity = self._capacity
        limit = capacity.effective_limit if capacity is not None else None
        waiting = capacity.waiting_jobs if capacity is not None else 0
        if not self._core_reachable():
            mean = None  # the core neither answers nor takes runs: no start can be promised
        overdue_after = self._overdue_after(self._mean_judging)
        shown = []
        for view in views:
            if view.status is JobStatus.RUNNING and view.start_time is not None and now - view.start_time > overdue_after:
                view = dataclasses.replace(view, run_overdue=True)
            if view.status is JobStatus.QUEUED and view.active_since is not None and now - view.active_since > overdue_after:
                # The job it waits behind judges far longer than usual: whether that run still goes
                # on is unconfirmed, so no start can be promised.
                shown.append(dataclasses.replace(view, behind_overdue_run=True, estimated_start_time=None))
                continue
            if view.waiting_for_capacity:
                view = dataclasses.replace(view, capacity_position=positions.get(view.job_id, 0))
            if view.status is JobStatus.QUEUED or view.waiting_for_capacity:
                # Held by a pause (the fleet's or hers): no start until a resume, which no
                # estimate can know of.
                paused = capacity is not None and capacity.releases_paused_for(view.user_id)
                view = dataclasses.replace(
                    view,
                    estimated_start_time=None
                    if paused
                    else estimate_start(
                        view,
                        mean_judging_seconds=mean,
                        default_max_active=self._default_max_active,
                        now=now,
                        capacity_limit=limit,
                        capacity_waiting=waiting,
                    ),
                )
            shown.append(view)
        return shown

    def _overdue_after(self, mean_judging_seconds: float | None) -> dt.timedelta:
        """How long a run judges before it is overdue (module constants above)."""
        if mean_judging_seconds is None:
            return dt.timedelta(seconds=self._reconcile_after_seconds)
        seconds = max(OVERDUE_AT_LEAST_SECONDS, OVERDUE_MEAN_FACTOR * mean_judging_seconds)
        return dt.timedelta(seconds=min(seconds, self._reconcile_after_seconds))

    def _reads_due(self, views: list[JobView]) -> bool:
        """Whether showing the views reads the database: the mean judging time or the capacity's
        state is due to be read again, or a view waits for capacity (its place in line)."""
        now = time.monotonic()
        if not any(view.status is JobStatus.QUEUED or view.waiting_for_capacity for view in views):
            return self._mean_due(now, unknown_is_stale=False)  # running jobs only: the mean says whether one is overdue
        return self._mean_due(now, unknown_is_stale=True) or self._capacity_due(now) or any(view.waiting_for_capacity for view in views)

    async def _refresh(self, views: list[JobView], db: Statements) -> dict[uuid.UUID, int]:
        """Refreshes what the estimates read, when stale; the capacity positions of waiting jobs."""
        if any(view.status is JobStatus.RUNNING for view in views):
            await self._mean_judging_seconds(db)  # whether a run is overdue
        if any(view.status is JobStatus.QUEUED or view.waiting_for_capacity for view in views):
            await self._mean_judging_seconds(db, unknown_is_stale=True)
            if self._capacity_due(time.monotonic()):
                self._capacity_reading = True
                try:
                    self._capacity = await db.capacity_state()
                finally:
                    self._capacity_reading = False
                self._capacity_read_at = time.monotonic()
        waiting = [view.job_id for view in views if view.waiting_for_capacity]
        return await db.capacity_positions(job_ids=waiting) if waiting else {}

    async def estimated(self, views: list[JobView], db: Statements | None = None) -> list[JobView]:
        """The views with estimates and places in line (read on `db`, or on a connection of its
        own only when something is to be read: a queued job's estimate from fresh figures needs
        none, which spares most admits' answers a pool checkout)."""
        needs_reads = any(view.status in (JobStatus.QUEUED, JobStatus.RUNNING) or view.waiting_for_capacity for view in views)
        if not needs_reads:
            return list(views)
        if db is not None:
            positions = await self._refresh(views, db)
        elif self._reads_due(views):
            async with self._store.statements() as own:
                positions = await self._refresh(views, own)
        else:
            positions = {}
        return self._with_estimates(views, positions)

    async def estimated_after_commit(self, view: JobView) -> JobView:
        """The view a committed change answers with, its estimates read if the database answers
        in time (within half of what is left of the call). The change committed: a failed read
        must not turn its answer into an error that says otherwise (an admit answered
        DATABASE_UNAVAILABLE beside its charged job), so the view then goes out with the
        estimates last read (none if never), and without its place in the capacity line."""
        if not self._reads_due([view]):
            return self._with_estimates([view], {})[0]  # from the figures in hand: nothing to wait for
        try:
            with deadline.share_of_remaining(_ANSWER_READ_SHARE):
                return (await self.estimated([view]))[0]
        except errors.QueueError as exc:
            telemetry.metrics.estimates_left_out.add(1, {"reason": exc.reason})
            log.warning(
                "a committed change is answered without fresh estimates (%s)",
                exc.reason,
                extra={"job_id": view.job_id, "user_id": view.user_id, "reason": exc.message},
            )
            return self._with_estimates([view], {})[0]

    async def by_ids(self, job_ids: list[uuid.UUID]) -> list[JobView]:
        """The jobs' views in the order asked; unknown ids are left out."""
        async with self._store.statements() as db:
            views = await db.job_views_by_ids(job_ids=job_ids)
            by_id = {view.job_id: view for view in await self.estimated(views, db)}
        return [by_id[job_id] for job_id in job_ids if job_id in by_id]

    async def one(self, job_id: uuid.UUID) -> JobView | None:
        views = await self.by_ids([job_id])
        return views[0] if views else None

    async def page_of_user(
        self, user_id: str, *, after_job_id: uuid.UUID | None, before_seq: int | None, statuses: Iterable[JobStatus], limit: int
    ) -> list[JobView]:
        async with self._store.statements() as db:
            views = await db.list_job_views(
                user_id=user_id, after_job_id=after_job_id, before_seq=before_seq, statuses=statuses, limit=limit
            )
            return await self.estimated(views, db)

    async def search(self, search: JobSearch, *, limit: int) -> list[JobView]:
        async with self._store.statements() as db:
            views = await db.search_job_views(search, limit=limit)
            return await self.estimated(views, db)

    async def live_jobs_matching(self, live_filter: LiveJobFilter, *, limit: int) -> list[tuple[uuid.UUID, str]]:
        """(job_id, user_id) of the live jobs a bulk cancel matches, oldest first."""
        async with self._store.statements() as db:
            return await db.live_jobs_matching(live_filter, limit=limit)

    async def overview(self, window_minutes: int) -> Overview:
        async with self._store.statements() as db:
            overview = await db.operator_overview(window_minutes=window_minutes, reconcile_after_seconds=self._reconcile_after_seconds)
            capacity = await db.capacity_state()
            core_reports, read_time = await db.fresh_core_health_reports(fresh_seconds=CORE_REPORT_FRESH_SECONDS)
        return dataclasses.replace(overview, capacity=capacity, core_health=combined_core_health(core_reports, read_time))

    async def watch_overview(self, window_minutes: int, interval_seconds: float, *, until: asyncio.Event) -> AsyncIterator[Overview]:
        """The overview every interval when its figures changed (or a heartbeat is due), until
        `until` is set (the replica drains: the watcher hears SHUTTING_DOWN)."""
        last_figures: Overview | None = None
        last_sent = float("-inf")
        while True:
            overview = await self.overview(window_minutes)
            figures = _figures(overview)
            if figures != last_figures or time.monotonic() - last_sent >= _HEARTBEAT_SECONDS:
                yield overview
                last_figures, last_sent = figures, time.monotonic()
            try:
                await asyncio.wait_for(until.wait(), interval_seconds)
            except TimeoutError:
                continue
            raise errors.ShuttingDown("this replica is draining; reconnect to another")

    async def users_with_work(self, *, limit: int) -> tuple[list[UserWork], int]:
        async with self._store.statements() as db:
            return await db.users_with_work(limit=limit)

    async def queue_history(self, *, window_minutes: int) -> list[QueueMinute]:
        async with self._store.statements() as db:
            return await db.queue_history(window_minutes=window_minutes)

    async def replicas(self) -> tuple[list[ReplicaReport], dt.datetime | None]:
        async with self._store.statements() as db:
            return await db.replicas()

    async def inputs(self, job_id: uuid.UUID) -> JobInputs | None:
        """What the job was admitted with, in full (for a retry)."""
        async with self._store.statements() as db:
            return await db.job_inputs(job_id=job_id)

    async def user_settings(self, user_id: str) -> UserSettings:
        """The user's first-pass limit in force (her own or the default) and her pauses."""
        async with self._store.statements() as db:
            return await db.user_settings(user_id=user_id, default_max_active=self._default_max_active)

    async def release_pauses(self, *, limit: int) -> tuple[list[PauseInForce], int]:
        """The pauses of releases in force (the fleet's first) and how many users are paused."""
        async with self._store.statements() as db:
            return await db.release_pauses(limit=limit)

    async def audit_events(self, query: AuditQuery, *, limit: int) -> list[AuditEvent]:
        """One page of the audit timeline, newest first."""
        async with self._store.statements() as db:
            return await db.audit_events(query, limit=limit)

    async def capacity(self) -> CapacityState:
        async with self._store.statements() as db:
            return await db.capacity_state()


_NO_READ_TIME = dt.datetime.min.replace(tzinfo=dt.UTC)


def _figures(overview: Overview) -> Overview:
    """The overview without its read time (nor who changed the capacity setting last, which the
    overview does not show), to tell whether anything shown changed."""
    capacity = overview.capacity and dataclasses.replace(overview.capacity, updated_by="", updated_at=None)
    return dataclasses.replace(overview, read_time=_NO_READ_TIME, capacity=capacity)
