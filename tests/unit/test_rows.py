"""Rows leave the store as the model's types: a job-change row of the feed becomes a `JobChange`
whose statuses are `JobStatus`es (an inserted job has no old status)."""

from __future__ import annotations

import uuid

from queue_service.model import JobStatus
from queue_service.store.rows import job_change


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
