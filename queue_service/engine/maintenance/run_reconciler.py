"""Run reconciler: a RUNNING job whose completion is overdue (its callback lost) is asked about
at the core, or its run canceled when its user's cancel went unanswered."""

from __future__ import annotations

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from queue_service import errors
from queue_service.engine.maintenance.ports import Recovering
from queue_service.engine.maintenance.service import BATCH, EVERY_PASS, Work, count_each_asking_core
from queue_service.model import ClaimedReconciliation
from queue_service.store import Statements

# A reconciliation the core or the database failed is tried this often within the pass, the
# retries about this many seconds apart (jittered, doubling).
RECONCILE_ATTEMPTS = 3
RECONCILE_RETRY_SECONDS = 0.5


class RunReconciler:
    action = "reconciled"
    interval_seconds = EVERY_PASS

    def __init__(self, recovery: Recovering, *, reconcile_after_seconds: float, batch_size: int = BATCH) -> None:
        self._recovery = recovery
        self._reconcile_after_seconds = reconcile_after_seconds
        self.batch_size = batch_size

    async def find(self, db: Statements) -> Work:
        overdue = await db.claim_due_reconciliations(
            recheck_seconds=self._reconcile_after_seconds,
            cancel_recheck_seconds=self._recovery.cancel_recheck_seconds,
            batch_size=self.batch_size,
        )

        async def work() -> int:
            return await count_each_asking_core([self.reconcile(run) for run in overdue])

        return work

    async def reconcile(self, run: ClaimedReconciliation) -> bool:
        """One claimed reconciliation, tried again within the pass when the core or the database
        failed it (a connection lost mid-failover, an answer lost): its claim pushed the job's
        next look out by QUEUE_RECONCILE_AFTER_SECONDS, so without a retry a completion the core
        has would wait that long. Each attempt is fenced (a completion applied by an attempt whose
        answer was lost leaves the next nothing to do)."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(RECONCILE_ATTEMPTS),
            wait=wait_random_exponential(multiplier=RECONCILE_RETRY_SECONDS, max=4 * RECONCILE_RETRY_SECONDS),
            retry=retry_if_exception_type(errors.QueueError),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                ended = await self._recovery.reconcile(run.job_id, run.user_id, run.run_id, cancel_requested=run.cancel_requested)
        return ended
