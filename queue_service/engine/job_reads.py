"""The API view of jobs: database rows to `acurio.queue.v1.Job`, with positions and estimates.

The estimated start of a queued job comes from the mean judging time of recent first-pass jobs
(cached briefly per replica, so reads stay cheap): the active job's expected end, plus one mean
per full round of the user's slots ahead of it.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

from psycopg_pool import AsyncConnectionPool

from queue_service.store import store as repo
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service.store.pool import connection

_STATUS = {
    "queued": job_pb2.JOB_STATUS_QUEUED,
    "pending": job_pb2.JOB_STATUS_PENDING,
    "running": job_pb2.JOB_STATUS_RUNNING,
    "succeeded": job_pb2.JOB_STATUS_SUCCEEDED,
    "failed": job_pb2.JOB_STATUS_FAILED,
    "canceled": job_pb2.JOB_STATUS_CANCELED,
}
STATUS_NAMES = {value: name for name, value in _STATUS.items()}

_ESTIMATE_CACHE_SECONDS = 10.0


class JobViews:
    def __init__(self, pool: AsyncConnectionPool, default_max_active: int) -> None:
        self._pool = pool
        self._default_max_active = default_max_active
        self._mean_judging: float | None = None
        self._mean_read_at = float("-inf")

    async def mean_judging_seconds(self, conn: Any) -> float | None:
        if time.monotonic() - self._mean_read_at > _ESTIMATE_CACHE_SECONDS:
            self._mean_judging = await repo.recent_judging_seconds(conn)
            self._mean_read_at = time.monotonic()
        return self._mean_judging

    async def by_ids(self, job_ids: list[uuid.UUID]) -> list[job_pb2.Job]:
        async with connection(self._pool) as conn:
            rows = await repo.job_views_by_ids(conn, job_ids=job_ids)
            mean = await self.mean_judging_seconds(conn)
        by_id = {row["job_id"]: row for row in rows}
        return [self.to_proto(by_id[job_id], mean) for job_id in job_ids if job_id in by_id]

    async def from_row(self, row: dict[str, Any]) -> job_pb2.Job:
        """The proto of a view row read elsewhere (the estimate's mean refreshed if stale)."""
        if time.monotonic() - self._mean_read_at > _ESTIMATE_CACHE_SECONDS:
            async with connection(self._pool) as conn:
                await self.mean_judging_seconds(conn)
        return self.to_proto(row, self._mean_judging)

    async def one(self, job_id: uuid.UUID) -> job_pb2.Job | None:
        jobs = await self.by_ids([job_id])
        return jobs[0] if jobs else None

    def to_proto(self, row: dict[str, Any], mean_judging: float | None) -> job_pb2.Job:
        job = job_pb2.Job(
            job_id=str(row["job_id"]),
            user_id=row["user_id"],
            run_id=str(row["run_id"]),
            status=_STATUS[row["status"]],
            queue_position=int(row["queue_position"]),
            delta_of_job_id=str(row["delta_of_job_id"]) if row["delta_of_job_id"] else "",
            release_attempts=row["release_attempts"],
            last_error=row["last_error"],
            price=row["price"],
            refunded=row["refunded"],
        )
        for field in ("create_time", "promote_time", "start_time", "end_time"):
            if row[field] is not None:
                getattr(job, field).FromDatetime(row[field])
        if row["status"] == "queued":
            if row["waiting_for_job_id"] is not None:
                job.waiting_for_job_id = str(row["waiting_for_job_id"])
            estimate = self._estimate_start(row, mean_judging)
            if estimate is not None:
                job.estimated_start_time.FromDatetime(estimate)
        return job

    def _estimate_start(self, row: dict[str, Any], mean_judging: float | None) -> dt.datetime | None:
        if mean_judging is None:
            return None
        now = dt.datetime.now(dt.timezone.utc)
        mean = dt.timedelta(seconds=mean_judging)
        active_since = row["active_since"]
        first_free = max(now, active_since + mean) if active_since is not None else now
        slots = row["max_active_override"] or self._default_max_active
        rounds_ahead = (int(row["queue_position"]) - 1) // slots
        return first_free + rounds_ahead * mean
