"""What the lifecycle reads and records outside the locked sections (`sql/queries/lifecycle.sql`):
one job's row, a recorded cancel, the waiting cancels, and the sweeper's finds.
"""

from __future__ import annotations

import uuid

from queue_service import audit
from queue_service.model import Cause, ExpiredRelease, JobRef
from queue_service.store import rows as from_row
from queue_service.store.statements.base import StatementRunner


class LifecycleStatements(StatementRunner):
    """One job's row, recorded cancels, and the sweeper's finds."""

    async def job_by_id(self, *, job_id: uuid.UUID) -> JobRef | None:
        row = await self._one("job_by_id", {"job_id": job_id})
        return None if row is None else from_row.job_ref(row)

    async def waiting_jobs_to_cancel(self, *, batch_size: int) -> list[tuple[uuid.UUID, str]]:
        """Jobs waiting for capacity whose user's cancel is recorded: (job, user) each."""
        rows = await self._all("waiting_jobs_to_cancel", {"batch_size": batch_size})
        return [(row["job_id"], str(row["user_id"])) for row in rows]

    async def record_cancel_request(self, *, job_id: uuid.UUID, cancel_recheck_seconds: float) -> bool:
        """Records that the caller (`audit`: the current actor, kept as `canceled_by`) asked to
        cancel the job (a RUNNING one is reconciled, so asked to cancel again, after
        `cancel_recheck_seconds`); False when it is no longer PENDING or RUNNING (fenced)."""
        params = {"job_id": job_id, "cancel_recheck_seconds": float(cancel_recheck_seconds), "actor": audit.actor_for(Cause.CANCEL)}
        return await self._one("record_cancel_request", params) is not None

    async def users_needing_promotion(self, *, default_max_active: int, batch_size: int) -> list[str]:
        rows = await self._all("users_needing_promotion", {"default_max_active": default_max_active, "batch_size": batch_size})
        return [r["user_id"] for r in rows]

    async def expired_pending_releases(self, *, batch_size: int) -> list[ExpiredRelease]:
        rows = await self._all("expired_pending_releases", {"batch_size": batch_size})
        return [from_row.expired_release(r) for r in rows]
