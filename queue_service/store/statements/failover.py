"""The core's runs as the second copy and the database's history (`sql/queries/failover.sql`,
engine/core_reconciliation.py); an adoption is `Store.adopt_run` (`store/sections.py`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence

import psycopg

from queue_service.model import DatabaseIdentity, JobStatus, LostRun, UnlistedRun
from queue_service.store import rows as from_row
from queue_service.store.statements.base import StatementRunner


class FailoverStatements(StatementRunner):
    """The queue's side of the core's runs, and which database history it writes."""

    async def runs_unknown_to_queue(self, *, run_ids: Sequence[uuid.UUID], judging_first_pass: Sequence[uuid.UUID] = ()) -> set[uuid.UUID]:
        """Of these runs, those no job owns and no admit has reserved; of `judging_first_pass`
        (first-pass runs the core judges), those no job owns, reserved or not."""
        params = {"run_ids": list(run_ids), "judging_first_pass": list(judging_first_pass)}
        return {row["run_id"] for row in await self._all("runs_unknown_to_queue", params)}

    async def database_clock(self) -> dt.datetime:
        """The database's clock now (what a listing of the core's runs is fenced with)."""
        row = await self._one("database_clock", {})
        assert row is not None
        now: dt.datetime = row["now"]
        return now

    async def jobs_with_runs_not_listed(
        self, *, run_ids: Sequence[uuid.UUID], listed_after: dt.datetime, batch_size: int
    ) -> list[UnlistedRun]:
        """Active jobs admitted before `listed_after` whose run is not among `run_ids` (the core's
        live runs as listed from then on), oldest first."""
        params = {"run_ids": list(run_ids), "listed_after": listed_after, "batch_size": batch_size}
        return [
            UnlistedRun(row["job_id"], row["user_id"], row["run_id"], JobStatus(row["status"]), int(row["release_attempts"]))
            for row in await self._all("jobs_with_runs_not_listed", params)
        ]

    async def run_to_probe_at_the_core(self) -> uuid.UUID | None:
        """One active job's run the core must know (None without active jobs)."""
        row = await self._one("run_to_probe_at_the_core", {})
        return None if row is None else row["run_id"]

    async def runs_taking_a_slot(self, *, run_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Of these judging runs, those that take their user's slot as far as the queue can tell
        (their job holds it, or no job owns them, whatever their reservation)."""
        return {row["run_id"] for row in await self._all("runs_taking_a_slot", {"run_ids": list(run_ids)})}

    async def user_slot_limit(self, *, user_id: str, default_max_active: int) -> int:
        """The user's first-pass limit (her own, or the default)."""
        row = await self._one("user_slot_limit", {"user_id": user_id, "default_max_active": default_max_active})
        assert row is not None
        return int(row["max_active"])

    async def record_lost_run(self, lost: LostRun) -> bool:
        """Records a run reconciliation could not adopt; False when it was recorded before."""
        return await self._one("record_lost_run", dataclasses.asdict(lost)) is not None

    async def reconcile_running_jobs_now(self) -> int:
        """Makes every RUNNING job due for reconciliation with the core now; how many."""
        row = await self._one("reconcile_running_jobs_now", {})
        return 0 if row is None else int(row["jobs"])

    async def database_identity(self) -> DatabaseIdentity:
        """The database's system identifier and timeline (None where the role may not read them)."""
        try:
            row = await self._one("database_identity", {})
        except psycopg.errors.InsufficientPrivilege:
            return DatabaseIdentity(None, None)
        assert row is not None
        return from_row.database_identity(row)

    async def commit_probe_reading_identity(self) -> DatabaseIdentity | None:
        """Health's durable write, with the database's identity read on the way; None (and the
        write made alone) where the role may not read the identity."""
        try:
            row = await self._one("commit_probe_reading_identity", {})
        except psycopg.errors.InsufficientPrivilege:
            await self._send("commit_probe", {})
            return None
        assert row is not None
        return from_row.database_identity(row)

    async def history_reconciled(self) -> bool:
        """Whether the history the primary writes now has been reconciled with the core's runs
        (False where the role may not read the database's identity: the function checks)."""
        row = await self._one("history_reconciled", {})
        return row is not None and bool(row["reconciled"])

    async def record_reconciled_history(self, identity: DatabaseIdentity) -> bool:
        """Records that a reconciliation went through whole on `identity`, if the database still
        writes that history; whether it is recorded now."""
        params = {"system_identifier": identity.system_identifier, "timeline_id": identity.timeline_id}
        row = await self._one("record_reconciled_history", params)
        return row is not None and bool(row["recorded"])
