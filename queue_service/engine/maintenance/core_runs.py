"""Core-runs reconciler: the core's live runs reconciled with the jobs when due (every
QUEUE_CORE_RECONCILE_INTERVAL_SECONDS, and at once after the database's timeline changed:
`engine.core_reconciliation`). First in the pass, so runs adopted now are promoted, released and
reconciled by the same pass."""

from __future__ import annotations

from queue_service.engine.maintenance.ports import Reconciliation, Reconciling
from queue_service.engine.maintenance.service import guarded
from queue_service.store import Store


class CoreRunsReconciler:
    def __init__(self, reconciler: Reconciling, store: Store) -> None:
        self._reconciler = reconciler
        self._store = store

    async def reconcile_if_due(self) -> Reconciliation | None:
        reconciled = await guarded(self._reconciler.reconcile_if_due(), None)
        if reconciled is not None and reconciled.trigger == "database_changed":
            # Every RUNNING job is asked about at the core by this pass.
            async with self._store.statements() as db:
                await db.reconcile_running_jobs_now()
        return reconciled
