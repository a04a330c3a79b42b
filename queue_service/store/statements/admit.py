"""What an admit reads before it asks the core (`sql/queries/admit.sql`); the locked admit itself is
`Store.admit_job` (`store/sections.py`).
"""

from __future__ import annotations

import uuid

from queue_service.model import AdmitState
from queue_service.store import rows as from_row
from queue_service.store.statements.base import StatementRunner


class AdmitStatements(StatementRunner):
    """The admit's reads: its state, with or without the run's reservation."""

    async def reserve_run_and_read_admit_state(
        self,
        *,
        run_id: uuid.UUID,
        user_id: str,
        idempotency_key: str,
        delta_of_job_id: uuid.UUID | None,
        grace_seconds: float,
        max_free_admits: int,
    ) -> tuple[bool, AdmitState]:
        """Reserves the run for this admit and reads what the admit checks, in one statement.
        Returns whether the run was reserved (False: the key already has a job) and the state."""
        row = await self._one(
            "reserve_run_and_read_admit_state",
            {
                "run_id": run_id,
                "user_id": user_id,
                "idempotency_key": idempotency_key,
                "delta_of_job_id": delta_of_job_id,
                "grace_seconds": float(grace_seconds),
                "max_free_admits": max_free_admits,
            },
        )
        assert row is not None
        return bool(row["reserved"]), from_row.admit_state(row)

    async def admit_state(
        self, *, user_id: str, idempotency_key: str, delta_of_job_id: uuid.UUID | None, max_free_admits: int
    ) -> AdmitState:
        row = await self._one(
            "admit_state",
            {
                "user_id": user_id,
                "idempotency_key": idempotency_key,
                "delta_of_job_id": delta_of_job_id,
                "max_free_admits": max_free_admits,
            },
        )
        assert row is not None
        return from_row.admit_state(row)
