"""What the maintenance services ask of the rooms around them, a Protocol each (the loops depend
on what they ask for, not on the rooms that answer)."""

from __future__ import annotations

import uuid
from typing import Protocol

from queue_service.model import Cause, ClaimedReservation, ClaimedSettlement, Promoted


class Recovering(Protocol):
    """What the sweeper asks of the engine: `engine.recovery.Recovery` in the service."""

    @property
    def cancel_recheck_seconds(self) -> float: ...

    async def promote(self, user_id: str, *, cause: Cause) -> tuple[Promoted, ...]: ...

    async def give_up_release(self, job_id: uuid.UUID, user_id: str, reason: str, *, attempts: int) -> bool: ...

    async def reconcile(self, job_id: uuid.UUID, user_id: str, run_id: uuid.UUID, *, cancel_requested: bool = False) -> bool: ...

    async def attempt_run_settlement(self, claim: ClaimedSettlement) -> bool: ...

    async def cancel_reserved_run(self, claim: ClaimedReservation) -> bool: ...

    async def cancel_waiting_job(self, job_id: uuid.UUID, user_id: str) -> bool: ...


class Reconciliation(Protocol):
    """What one reconciliation did (`core_reconciliation.ReconcileReport`)."""

    adopted: int
    lost: int
    forgotten: int
    trigger: str


class Reconciling(Protocol):
    """What the sweeper asks of the reconciliation of the core's live runs with the jobs:
    `engine.core_reconciliation.CoreReconciler` in the service."""

    async def database_replaced(self) -> bool: ...

    @property
    def reconcile_owed(self) -> bool: ...

    async def reconcile(self, *, trigger: str = "periodic") -> Reconciliation: ...

    async def reconcile_if_due(self) -> Reconciliation | None: ...

    async def probe_if_due(self) -> bool: ...
