"""The core's capacity, fleet-wide (`sql/queries/capacity.sql`): a refusal, a probe taken, the seed, a
claimed release held for a pause, and the capacity's state and line; the grant itself is
`Store.grant_capacity` (`store/sections.py`).
"""

from __future__ import annotations

import uuid

from queue_service.model import PAUSED_USERS_NAMED_AT_MOST, CapacityState
from queue_service.store import rows as from_row
from queue_service.store.statements.base import StatementRunner


class CapacityStatements(StatementRunner):
    """The fleet's capacity outside the grant: refusals, probes, the seed, pauses of a claimed release, reads."""

    async def capacity_refused(self, *, job_id: uuid.UUID, attempt: int, probe_interval_seconds: float) -> int | None | bool:
        """The core refused the release ("not now"): the job waits again with its place. The
        limit the core taught us (None: none), or False when the attempt was fenced."""
        row = await self._one(
            "capacity_refused", {"job_id": job_id, "attempt": attempt, "probe_interval_seconds": float(probe_interval_seconds)}
        )
        return False if row is None else row["core_limit"]

    async def hold_release_if_paused(self, *, job_id: uuid.UUID, attempt: int) -> bool | None:
        """Holds a claimed release when its releases are paused: True when the job waits for a
        grant again (the claim opened its turn: nothing was sent since it last waited), False
        when it keeps its capacity (an earlier attempt may have been applied) and only its retry
        is held; None when not paused (or the attempt was overtaken)."""
        row = await self._one("hold_release_if_paused", {"job_id": job_id, "attempt": attempt})
        return None if row is None else bool(row["waits_again"])

    async def capacity_probe_taken(self) -> None:
        await self._send("capacity_probe_taken", {})

    async def seed_capacity(self, *, capacity: int) -> tuple[int, str]:
        """Seeds a fresh database's capacity; returns the capacity in force and who set it
        (`system:seed`, or an operator's actor)."""
        row = await self._one("seed_capacity", {"capacity": capacity})
        assert row is not None
        return int(row["capacity"]), str(row["updated_by"] or "")

    async def capacity_state(self) -> CapacityState:
        row = await self._one("capacity_state", {"paused_users_named": PAUSED_USERS_NAMED_AT_MOST})
        assert row is not None
        return from_row.capacity_state(row)

    async def capacity_positions(self, *, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
        rows = await self._all("capacity_positions", {"job_ids": job_ids})
        return {row["job_id"]: int(row["capacity_position"]) for row in rows}
