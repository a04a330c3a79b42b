"""What the pruners empty or delete past its retention (`sql/queries/retention.sql`)."""

from __future__ import annotations

from queue_service.store.statements.base import StatementRunner


class RetentionStatements(StatementRunner):
    """The pruners' deletes."""

    async def prune_ended_job_inputs(self, *, retention_seconds: float, batch_size: int) -> int:
        """Empties the full sources of up to `batch_size` jobs ended before the retention; how many."""
        cursor = await self._send("prune_ended_job_inputs", {"retention_seconds": float(retention_seconds), "batch_size": batch_size})
        return max(0, cursor.rowcount)

    async def prune_ended_jobs(self, *, retention_seconds: float, batch_size: int) -> int:
        """Deletes up to `batch_size` jobs ended before the retention; how many."""
        row = await self._one("prune_ended_jobs", {"retention_seconds": float(retention_seconds), "batch_size": batch_size})
        return int(row["pruned"]) if row else 0

    async def forget_abandoned_runs(self, *, retention_seconds: float, batch_size: int) -> int:
        cursor = await self._send("forget_abandoned_runs", {"retention_seconds": retention_seconds, "batch_size": batch_size})
        return max(0, cursor.rowcount)
