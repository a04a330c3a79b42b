"""OperatorService: the overview, the job search across users, live overview and bulk cancel.

The same adapters as the other servicers: validate, read through the repository (index-driven
queries of migration 0005), build responses, raise domain errors only. Bulk cancel goes
through `QueueEngine.cancel`, one job at a time, so each job is canceled, refunded and its
user's next job promoted exactly as a single CancelJob does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from queue_service import errors
from queue_service.store import store as repo
from queue_service.api import validation
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as pb, operator_service_pb2_grpc as pb_grpc
from queue_service.store.pool import connection
from queue_service.engine.engine import QueueEngine
from queue_service.api.queue import _status_filter
from queue_service.engine.job_reads import JobViews

_DEFAULT_WINDOW_MINUTES = 60
_MAX_WINDOW_MINUTES = 1440
_DEFAULT_INTERVAL_MS = 1000
_MIN_INTERVAL_MS, _MAX_INTERVAL_MS = 250, 60_000
# A watched overview is re-sent at least this often, so ages ("oldest wait") stay current.
_HEARTBEAT_SECONDS = 15.0
# A bulk cancel counts and cancels at most this many jobs per call.
MAX_BULK_CANCEL = 1000
_CANCELABLE = ["queued", "pending", "running"]
# Bulk cancels run this many single cancels at once (each may call the core).
_CANCEL_CONCURRENCY = 8


class OperatorServicer(pb_grpc.OperatorServiceServicer):
    def __init__(self, engine: QueueEngine, views: JobViews, draining: asyncio.Event) -> None:
        self._engine = engine
        self._views = views
        self._draining = draining

    async def GetOverview(self, request: pb.GetOverviewRequest, context: Any) -> pb.GetOverviewResponse:
        window = _window(request.window_minutes)
        return pb.GetOverviewResponse(overview=await self._overview(window))

    async def _overview(self, window_minutes: int) -> pb.Overview:
        async with connection(self._engine.pool) as conn:
            row = await repo.operator_overview(
                conn, window_minutes=window_minutes, reconcile_after_seconds=self._engine.config.reconcile_after_seconds
            )
            admits = await repo.admits_per_minute(conn, window_minutes=window_minutes)
        overview = pb.Overview(
            queued=row["queued"],
            pending=row["pending"],
            running=row["running"],
            succeeded_in_window=row["succeeded_in_window"],
            failed_in_window=row["failed_in_window"],
            canceled_in_window=row["canceled_in_window"],
            users_waiting=row["users_waiting"],
            releases_retrying=row["releases_retrying"],
            runs_reconciling=row["runs_reconciling"],
            admits_per_minute=admits,
            window_minutes=window_minutes,
        )
        if row["oldest_queued_create_time"] is not None:
            overview.oldest_queued_create_time.FromDatetime(row["oldest_queued_create_time"])
        overview.read_time.FromDatetime(row["read_time"])
        return overview

    async def WatchOverview(self, request: pb.WatchOverviewRequest, context: Any) -> AsyncIterator[pb.WatchOverviewResponse]:
        v = validation.Violations()
        window = _window(request.window_minutes, v)
        interval_ms = request.interval_ms or _DEFAULT_INTERVAL_MS
        if not _MIN_INTERVAL_MS <= interval_ms <= _MAX_INTERVAL_MS:
            v.add("interval_ms", f"interval_ms must be between {_MIN_INTERVAL_MS} and {_MAX_INTERVAL_MS}; 0 means {_DEFAULT_INTERVAL_MS}")
        v.raise_if_any()
        if self._draining.is_set():
            raise errors.ShuttingDown("this replica is draining; reconnect to another")
        last_figures: bytes | None = None
        last_sent = float("-inf")
        while True:
            overview = await self._overview(window)
            figures = _figures(overview)
            if figures != last_figures or time.monotonic() - last_sent >= _HEARTBEAT_SECONDS:
                yield pb.WatchOverviewResponse(overview=overview)
                last_figures, last_sent = figures, time.monotonic()
            try:
                await asyncio.wait_for(self._draining.wait(), interval_ms / 1000)
            except TimeoutError:
                continue
            raise errors.ShuttingDown("this replica is draining; reconnect to another")

    async def SearchJobs(self, request: pb.SearchJobsRequest, context: Any) -> pb.SearchJobsResponse:
        page_size = validation.validate_page_size(request.page_size)
        search, filter_key = _search(request.filter)
        position = _decode_page_token(request.page_token, filter_key)
        if position is not None and (search.upper_time is None or (position[0], position[1]) < (search.upper_time, search.upper_job_id)):
            search = repo.JobSearch(**{**search.__dict__, "upper_time": position[0], "upper_job_id": position[1]})
        async with connection(self._engine.pool) as conn:
            rows = await repo.search_job_views(conn, search, limit=page_size + 1)
            mean = await self._views.mean_judging_seconds(conn)
        page, more = rows[:page_size], len(rows) > page_size
        token = _encode_page_token(page[-1]["create_time"], page[-1]["job_id"], filter_key) if more else ""
        return pb.SearchJobsResponse(jobs=[self._views.to_proto(r, mean) for r in page], next_page_token=token)

    async def CancelJobs(self, request: pb.CancelJobsRequest, context: Any) -> pb.CancelJobsResponse:
        search, _ = _search(request.filter)
        statuses = search.statuses or _CANCELABLE
        v = validation.Violations()
        if not set(statuses) & set(_CANCELABLE):
            v.add("filter.statuses", "only QUEUED, PENDING and RUNNING jobs can be canceled; leave statuses empty for all three")
        if not request.dry_run and not 1 <= request.max_jobs <= MAX_BULK_CANCEL:
            v.add("max_jobs", f"max_jobs must be between 1 and {MAX_BULK_CANCEL}: the number of jobs you confirmed (count them with dry_run)")
        v.raise_if_any()
        async with connection(self._engine.pool) as conn:
            rows = await repo.active_jobs_matching(
                conn,
                statuses=[s for s in statuses if s in _CANCELABLE],
                user_id=search.user_id,
                created_after=search.created_after,
                created_before=search.upper_time,
                has_error=search.has_error,
                limit=MAX_BULK_CANCEL + 1,
            )
        matched = rows[:MAX_BULK_CANCEL]
        response = pb.CancelJobsResponse(matched=len(matched), more_than_counted=len(rows) > MAX_BULK_CANCEL)
        if request.dry_run:
            return response
        slots = asyncio.Semaphore(_CANCEL_CONCURRENCY)

        async def cancel_one(row: dict[str, Any]) -> pb.CancelFailure | None:
            async with slots:
                try:
                    await self._engine.cancel(row["job_id"], row["user_id"])
                except errors.JobAlreadyFinished:
                    return None  # it ended meanwhile: nothing left to cancel
                except errors.QueueError as error:
                    return pb.CancelFailure(job_id=str(row["job_id"]), reason=error.reason, message=error.message)
            return None

        outcomes = await asyncio.gather(*(cancel_one(row) for row in matched[: request.max_jobs]))
        failures = [f for f in outcomes if f is not None]
        response.canceled = len(outcomes) - len(failures)
        response.failures.extend(failures)
        return response


def _window(window_minutes: int, v: validation.Violations | None = None) -> int:
    window = window_minutes or _DEFAULT_WINDOW_MINUTES
    if not 1 <= window <= _MAX_WINDOW_MINUTES:
        violations = v or validation.Violations()
        violations.add("window_minutes", f"window_minutes must be between 1 and {_MAX_WINDOW_MINUTES}; 0 means {_DEFAULT_WINDOW_MINUTES}")
        if v is None:
            violations.raise_if_any()
    return window


def _figures(overview: pb.Overview) -> bytes:
    """The overview without its read time, to tell whether anything changed."""
    copy = pb.Overview()
    copy.CopyFrom(overview)
    copy.ClearField("read_time")
    return copy.SerializeToString(deterministic=True)


# The smallest job id: `(t, _MIN_JOB_ID)` is the keyset position just below every job admitted at t.
_MIN_JOB_ID = uuid.UUID(int=0)


def _search(job_filter: pb.JobFilter) -> tuple[repo.JobSearch, str]:
    """Validates a filter; returns the search (its upper bound from `created_before`) and a key
    that ties page tokens to the filter."""
    v = validation.Violations()
    if job_filter.user_id:
        v.check_id("filter.user_id", job_filter.user_id)
    after = job_filter.created_after.ToDatetime(dt.timezone.utc) if job_filter.HasField("created_after") else None
    before = job_filter.created_before.ToDatetime(dt.timezone.utc) if job_filter.HasField("created_before") else None
    if after is not None and before is not None and after >= before:
        v.add("filter.created_before", "created_before must be later than created_after")
    v.raise_if_any()
    try:
        statuses = _status_filter(list(job_filter.statuses))
    except errors.InvalidRequest as error:
        raise errors.InvalidRequest(
            error.message.replace("statuses", "filter.statuses"),
            field_violations=[("filter." + f, d) for f, d in error.field_violations],
        ) from None
    search = repo.JobSearch(
        user_id=job_filter.user_id,
        statuses=statuses,
        created_after=after,
        upper_time=before,
        upper_job_id=_MIN_JOB_ID if before is not None else None,
        has_error=job_filter.has_error,
    )
    key_source = json.dumps([search.user_id, statuses, str(after), str(before), search.has_error])
    return search, hashlib.sha256(key_source.encode()).hexdigest()[:16]


def _encode_page_token(create_time: dt.datetime, job_id: uuid.UUID, filter_key: str) -> str:
    micros = int(create_time.timestamp()) * 1_000_000 + create_time.microsecond
    raw = json.dumps({"t": micros, "j": str(job_id), "f": filter_key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_page_token(token: str, filter_key: str) -> tuple[dt.datetime, uuid.UUID] | None:
    if not token:
        return None
    invalid = errors.InvalidRequest(
        "page_token is not valid for this request; pass the next_page_token of a SearchJobs call with the same filter",
        field_violations=[("page_token", "unknown or issued for another filter")],
    )
    if len(token) > 300:
        raise invalid
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        micros, job_id, key = data["t"], uuid.UUID(data["j"]), data["f"]
        if key != filter_key or not isinstance(micros, int) or isinstance(micros, bool):
            raise ValueError
        moment = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=micros)
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError, OverflowError, AttributeError):
        raise invalid from None
    return moment, job_id

