"""A user's jobs as the API reads them, and the figures estimates and gauges read
(`sql/queries/job_reads.sql`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from queue_service.model import JobStatus, JobView
from queue_service.store.statements.base import StatementRunner, status_values


class JobReadStatements(StatementRunner):
    """A user's jobs as the API reads them, and the estimates' and gauges' figures."""

    async def job_views_by_ids(self, *, job_ids: list[uuid.UUID]) -> list[JobView]:
        return await self._views("job_views_by_ids", {"job_ids": job_ids})

    async def list_job_views(
        self, *, user_id: str, after_job_id: uuid.UUID | None, before_seq: int | None, statuses: Iterable[JobStatus], limit: int
    ) -> list[JobView]:
        return await self._views(
            "list_job_views",
            {
                "user_id": user_id,
                "after_job_id": after_job_id,
                "before_seq": before_seq,
                "statuses": status_values(statuses),
                "limit": limit,
            },
        )

    async def watch_resync_views(
        self, *, user_id: str, seqs: list[int], newest_known_seq: int, after_seq: int, limit: int
    ) -> list[JobView]:
        return await self._views(
            "watch_resync_views",
            {"user_id": user_id, "seqs": seqs, "newest_known_seq": newest_known_seq, "after_seq": after_seq, "limit": limit},
        )

    async def newest_seq_of_user(self, *, user_id: str) -> int:
        row = await self._one("newest_seq_of_user", {"user_id": user_id})
        assert row is not None
        return int(row["seq"])

    async def active_job_views_of_user(self, *, user_id: str, after_seq: int, limit: int) -> list[JobView]:
        return await self._views("active_job_views_of_user", {"user_id": user_id, "after_seq": after_seq, "limit": limit})

    async def queued_job_views_of_user(self, *, user_id: str) -> list[JobView]:
        return await self._views("queued_job_views_of_user", {"user_id": user_id})

    async def recent_judging_seconds(self) -> float | None:
        row = await self._one("recent_judging_seconds", {})
        return None if row is None or row["seconds"] is None else float(row["seconds"])

    async def queue_depth(self) -> dict[str, int]:
        row = await self._one("queue_depth", {})
        assert row is not None
        return {name: int(value) for name, value in row.items()}
