"""The operator's settings and their change log (`sql/queries/settings.sql`); a pause of releases is
`Store.set_releases_paused` (`store/sections.py`), under the capacity lock.
"""

from __future__ import annotations

from queue_service import audit
from queue_service.model import PauseInForce, SettingChange, UserSettings
from queue_service.store import rows as from_row
from queue_service.store.statements.base import StatementRunner


class SettingStatements(StatementRunner):
    """The operator's settings and their change log."""

    async def set_core_capacity(self, *, capacity: int) -> SettingChange:
        """Sets the fleet's capacity, recorded with the current actor (`audit`)."""
        actor = audit.actor_for("core_capacity")
        row = await self._one("set_core_capacity", {"capacity": capacity, "actor": actor})
        assert row is not None
        return from_row.setting_change(row)

    async def set_user_queue_limit(self, *, user_id: str, max_active: int) -> SettingChange:
        """Sets a user's slots (0: the default), recorded with the current actor (`audit`)."""
        actor = audit.actor_for("user_max_active")
        row = await self._one("set_user_queue_limit", {"user_id": user_id, "max_active": max_active, "actor": actor})
        assert row is not None
        return from_row.setting_change(row)

    async def user_settings(self, *, user_id: str, default_max_active: int) -> UserSettings:
        row = await self._one("user_settings", {"user_id": user_id, "default_max_active": default_max_active})
        assert row is not None
        return from_row.user_settings(user_id, row)

    async def setting_changes(self, *, before_change_id: int | None, limit: int) -> list[SettingChange]:
        rows = await self._all("setting_changes", {"before_change_id": before_change_id, "limit": limit})
        return [from_row.setting_change(row) for row in rows]

    async def release_pauses(self, *, limit: int) -> tuple[list[PauseInForce], int]:
        """The pauses in force (the fleet's first, then users', the longest paused first) and how
        many users are paused."""
        rows = await self._all("release_pauses", {"limit": limit})
        return [from_row.pause_in_force(row) for row in rows], int(rows[0]["paused_users"]) if rows else 0
