"""The core's capacity, fleet-wide, and the operator's settings around it: a grant, the state
now, the pauses of releases, the settings' change log and one user's settings in force.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from queue_service.model.claims import ClaimedRelease


@dataclasses.dataclass(frozen=True)
class CapacityGrant:
    """What one grant of the core's capacity did: the releases it claimed for this replica (each
    with how long its job waited) and whether the fleet's capacity is limited now."""

    claims: tuple[tuple[ClaimedRelease, float], ...]
    limited: bool
    in_use: int = 0
    # The limit the grant used (None: unlimited).
    limit: int | None = None


# The most users paused on their own (SetReleasesPaused with a user id) whom the capacity's state
# names, for the estimates to leave out; beyond it every estimate is left out while they are paused.
PAUSED_USERS_NAMED_AT_MOST = 1000


@dataclasses.dataclass(frozen=True)
class CapacityState:
    """The core's capacity now, fleet-wide: the setting (0: unlimited), the limit the core taught
    us by refusing (None: none), what is in use and who waits for it."""

    capacity: int
    core_limit: int | None
    in_use: int
    waiting_jobs: int
    waiting_users: int
    oldest_wait_since: dt.datetime | None
    core_refusals: int
    updated_by: str
    updated_at: dt.datetime | None
    # The fleet-wide pause of releases in force (None: releases go on), and how many users'
    # releases are paused on their own (migration 0028).
    fleet_pause: ReleasePause | None = None
    paused_users: int = 0
    # Which users those are, when the read could name them all (PAUSED_USERS_NAMED_AT_MOST);
    # None when more are paused than a read names.
    paused_user_ids: frozenset[str] | None = frozenset()

    def releases_paused_for(self, user_id: str) -> bool:
        """Whether the user's held runs wait for a resume now: the fleet's pause, her own, or (more
        users paused on their own than a read names) possibly hers."""
        if self.fleet_pause is not None:
            return True
        if self.paused_users == 0:
            return False
        return self.paused_user_ids is None or user_id in self.paused_user_ids

    @property
    def effective_limit(self) -> int | None:
        """The most runs granted at once now (None: unlimited)."""
        limits = [limit for limit in (self.capacity or None, self.core_limit) if limit is not None]
        return min(limits) if limits else None


@dataclasses.dataclass(frozen=True)
class ReleasePause:
    """A pause of releases in force (the fleet's or one user's): since when, by whom and why."""

    since: dt.datetime
    paused_by: str
    note: str


@dataclasses.dataclass(frozen=True)
class SettingChange:
    """One change of a fleet setting (`core_capacity`, `user_max_active`, `releases_paused`) and
    who made it, with the operator's note (pauses)."""

    change_id: int
    setting: str
    user_id: str | None
    old_value: int | None
    new_value: int | None
    actor: str
    create_time: dt.datetime
    note: str = ""


@dataclasses.dataclass(frozen=True)
class PauseInForce:
    """One pause of releases in force, whose: the fleet's (`user_id` '') or one user's."""

    user_id: str
    pause: ReleasePause


@dataclasses.dataclass(frozen=True)
class UserSettings:
    """One user's settings in force: her first-pass limit (her own, or the service's default)
    and the pauses holding her runs back."""

    user_id: str
    max_active: int
    max_active_is_default: bool
    own_pause: ReleasePause | None
    fleet_paused: bool
