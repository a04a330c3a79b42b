"""The durable retries (`sql/queries/claims.sql`, `model.ClaimKind`): claiming each kind for one
attempt, what an attempt records, and scheduling the next one, one table for every kind.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from typing import overload

from queue_service.model import ClaimedReconciliation, ClaimedRelease, ClaimedReservation, ClaimedSettlement, ClaimKind, ScheduledRetry
from queue_service.store import rows as from_row
from queue_service.store.statements.base import StatementRunner


@dataclasses.dataclass(frozen=True)
class _RetrySchedule:
    """What differs between the kinds of claim when one is scheduled again: its statement, the
    parameter the claim's key binds, and whether the statement answers (a release's next attempt
    and whether its window is over; the job changed, so the feed is told)."""

    statement: str
    key_param: str
    answers: bool = False


# Every durable retry that backs off, by kind. A reconciliation has none: its claim pushed its next
# look ahead, and nothing its attempt writes needs scheduling.
_RETRY_SCHEDULES: dict[ClaimKind, _RetrySchedule] = {
    ClaimKind.RELEASE: _RetrySchedule("schedule_release_retry", "job_id", answers=True),
    ClaimKind.RUN_SETTLEMENT: _RetrySchedule("schedule_run_settle_retry", "job_id"),
    ClaimKind.RESERVATION_CANCEL: _RetrySchedule("schedule_run_reservation_retry", "run_id"),
}


class ClaimStatements(StatementRunner):
    """Claims of every kind, what their attempts record, and their next attempts."""

    async def claim_due_releases(self, *, lease_seconds: float, batch_size: int) -> list[ClaimedRelease]:
        # The due releases a pause holds are taken out first (rows of kind 'held'), in the same call.
        rows = await self._all("claim_due_releases", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
        if rows:
            self._committed()
        return [from_row.claimed_release(row) for row in rows if row["row_kind"] == "claimed"]

    async def claim_release_of_job(self, *, job_id: uuid.UUID, lease_seconds: float) -> ClaimedRelease | None:
        row = await self._one("claim_release_of_job", {"job_id": job_id, "lease_seconds": float(lease_seconds)})
        if row is None:
            return None
        self._committed()
        return from_row.claimed_release(row)

    async def mark_released(self, releases: Iterable[ClaimedRelease], *, reconcile_after_seconds: float) -> set[uuid.UUID]:
        """Marks RUNNING every job whose release the core accepted, in one statement; returns
        those it marked (a job released again by a later attempt meanwhile is left to it)."""
        in_lock_order = sorted(releases, key=lambda release: release.job_id)
        rows = await self._all(
            "mark_released",
            {
                "job_ids": [release.job_id for release in in_lock_order],
                "attempts": [release.attempt for release in in_lock_order],
                "reconcile_after_seconds": float(reconcile_after_seconds),
            },
        )
        if rows:
            self._committed()
        return {row["job_id"] for row in rows}

    @overload
    async def schedule_retry(
        self, claim: ClaimedRelease, *, backoff_seconds: float, last_error: str, sent: bool = True
    ) -> ScheduledRetry | None: ...

    @overload
    async def schedule_retry(self, claim: ClaimedSettlement | ClaimedReservation, *, backoff_seconds: float) -> None: ...

    async def schedule_retry(
        self,
        claim: ClaimedRelease | ClaimedSettlement | ClaimedReservation,
        *,
        backoff_seconds: float,
        last_error: str = "",
        sent: bool = True,
    ) -> ScheduledRetry | None:
        """The claim's next attempt, due after `backoff_seconds`: one shape for every durable retry
        (each kind has its named statement, `_RETRY_SCHEDULES`; every one is fenced by the claim's
        attempt). A release's answers when its next attempt is due and whether its window is over
        (None when the job is no longer this attempt's); a reconciliation is never scheduled, its
        claim pushed its next look ahead. `sent`: whether the release attempt reached for the core (one
        held back before it was sent keeps the job's turn unsent, `release_turn_attempt`)."""
        schedule = _RETRY_SCHEDULES[claim.kind]
        params = {"attempt": claim.attempt, "backoff_seconds": float(backoff_seconds), schedule.key_param: claim.key}
        if not schedule.answers:
            await self._send(schedule.statement, params)
            return None
        row = await self._one(schedule.statement, {**params, "last_error": last_error, "sent": sent})
        if row is None:
            return None
        self._committed()
        return from_row.scheduled_retry(row)

    async def next_release_due_in(self) -> float | None:
        """Seconds until the earliest pending release is due, in the database's clock (None: none)."""
        row = await self._one("next_release_due_in", {})
        return None if row is None or row["seconds"] is None else max(0.0, float(row["seconds"]))

    async def claim_due_run_settlements(self, *, lease_seconds: float, batch_size: int) -> list[ClaimedSettlement]:
        rows = await self._all("claim_due_run_settlements", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
        return [from_row.claimed_settlement(r) for r in rows]

    async def claim_run_reservation(self, *, run_id: uuid.UUID, lease_seconds: float) -> ClaimedReservation | None:
        row = await self._one("claim_run_reservation", {"run_id": run_id, "lease_seconds": float(lease_seconds)})
        return None if row is None else from_row.claimed_reservation(row)

    async def claim_due_run_reservations(self, *, lease_seconds: float, batch_size: int) -> list[ClaimedReservation]:
        rows = await self._all("claim_due_run_reservations", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
        return [from_row.claimed_reservation(r) for r in rows]

    async def drop_run_reservation(self, *, run_id: uuid.UUID) -> None:
        await self._send("drop_run_reservation", {"run_id": run_id})

    async def settle_run_reservation(self, *, run_id: uuid.UUID) -> None:
        """Remembers a failed admit's run, confirmed settled at the core, as abandoned."""
        await self._send("settle_run_reservation", {"run_id": run_id})

    async def reservation_of_an_earlier_timeline(self, *, run_id: uuid.UUID) -> bool:
        row = await self._one("reservation_of_an_earlier_timeline", {"run_id": run_id})
        return bool(row and row["earlier"])

    async def run_abandoned(self, *, run_id: uuid.UUID) -> bool:
        """Whether the run was a failed admit's, confirmed settled: never to be adopted."""
        row = await self._one("run_abandoned", {"run_id": run_id})
        return bool(row and row["abandoned"])

    async def claim_due_reconciliations(
        self, *, recheck_seconds: float, cancel_recheck_seconds: float, batch_size: int
    ) -> list[ClaimedReconciliation]:
        params = {
            "recheck_seconds": float(recheck_seconds),
            "cancel_recheck_seconds": float(cancel_recheck_seconds),
            "batch_size": batch_size,
        }
        rows = await self._all("claim_due_reconciliations", params)
        return [from_row.claimed_reconciliation(r) for r in rows]
