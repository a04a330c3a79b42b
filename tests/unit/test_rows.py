"""Rows leave the store as the model's types: a job-change row of the feed becomes a `JobChange`
whose statuses are `JobStatus`es (an inserted job has no old status); the capacity's state says
whose releases are paused."""

from __future__ import annotations

import datetime as dt
import uuid

from queue_service.model import JobStatus
from queue_service.store.rows import capacity_state, job_change


def _row(status: str, old_status: str | None, release_claimed: bool) -> dict[str, object]:
    return {
        "change_id": 7,
        "job_id": uuid.uuid4(),
        "user_id": "user-1",
        "status": status,
        "old_status": old_status,
        "release_claimed": release_claimed,
        "lag_seconds": -0.001,
    }


def test_a_feed_row_becomes_a_typed_change() -> None:
    change = job_change(_row("pending", None, False))
    assert change.status is JobStatus.PENDING and change.old_status is None
    assert change.left_unclaimed_pending
    assert change.lag_seconds == 0.0  # clocks a hair apart never make a negative lag


def test_a_claimed_or_other_change_is_not_left_unclaimed() -> None:
    assert not job_change(_row("pending", "queued", True)).left_unclaimed_pending
    running = job_change(_row("running", "pending", False))
    assert running.old_status is JobStatus.PENDING and not running.left_unclaimed_pending


def _capacity_row(paused_users: int, named: list[str], fleet_paused: bool = False) -> dict[str, object]:
    return {
        "capacity": 0,
        "core_limit": None,
        "in_use": 0,
        "waiting_jobs": 0,
        "waiting_users": 0,
        "oldest_wait_since": None,
        "core_refusals": 0,
        "updated_by": None,
        "updated_at": None,
        "fleet_paused_at": dt.datetime.now(dt.UTC) if fleet_paused else None,
        "fleet_paused_by": "operator:alice" if fleet_paused else None,
        "fleet_pause_note": None,
        "paused_users": paused_users,
        "paused_user_ids": named,
    }


def test_whose_releases_are_paused_is_known_only_when_the_read_named_every_paused_user() -> None:
    nobody = capacity_state(_capacity_row(0, []))
    assert not nobody.releases_paused_for("u-1")
    named = capacity_state(_capacity_row(2, ["u-1", "u-2"]))
    assert named.releases_paused_for("u-1") and not named.releases_paused_for("u-3")
    # More users paused than the read names (PAUSED_USERS_NAMED_AT_MOST): anyone may be one of them.
    unnamed = capacity_state(_capacity_row(3, ["u-1", "u-2"]))
    assert unnamed.paused_user_ids is None and unnamed.releases_paused_for("u-3")
    # The fleet's pause holds everyone's.
    assert capacity_state(_capacity_row(0, [], fleet_paused=True)).releases_paused_for("u-3")
