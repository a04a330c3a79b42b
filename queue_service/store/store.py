"""The repository: one method per named query of `sql/queries.sql`.

Handlers and the queue logic call these with typed arguments on a connection that `db` or
`locks` opened; nothing else in the service runs SQL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import uuid
from functools import cache
from importlib import resources
from typing import Any

from psycopg import AsyncConnection, AsyncCursor

_BLOCK = re.compile(r"^-- name: (?P<name>\w+)\n(?P<body>.*?)(?=^-- name: |\Z)", re.MULTILINE | re.DOTALL)


@cache
def queries() -> dict[str, str]:
    """The named queries, loaded once, without their leading description comments (so a span
    or a log of the statement starts with its verb)."""
    text = resources.files("queue_service.store").joinpath("sql/queries.sql").read_text()
    return {m["name"]: _without_leading_comments(m["body"]) for m in _BLOCK.finditer(text)}


def _without_leading_comments(body: str) -> str:
    lines = body.strip().splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    return "\n".join(lines).strip()


async def _all(conn: AsyncConnection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cursor = await conn.execute(queries()[name], params)  # type: ignore[arg-type]
    return await cursor.fetchall()  # type: ignore[return-value]


async def _one(conn: AsyncConnection, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    rows = await _all(conn, name, params)
    return rows[0] if rows else None


@dataclasses.dataclass(frozen=True)
class AdmitState:
    existing_job_id: uuid.UUID | None
    existing_digest: bytes | None
    queued_count: int
    running_deltas: int
    balance: int
    base_user_id: str | None
    base_status: str | None
    base_run_id: uuid.UUID | None


@dataclasses.dataclass(frozen=True)
class NewJob:
    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    idempotency_key: str
    request_digest: bytes
    delta_of_job_id: uuid.UUID | None
    price: int


@dataclasses.dataclass(frozen=True)
class ClaimedRelease:
    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    attempt: int
    release_deadline: dt.datetime
    promote_time: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class JobRef:
    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    status: str
    delta_of_job_id: uuid.UUID | None
    # The job has ended but the core has not yet confirmed its run settled (see finish_job).
    run_unsettled: bool = False


@dataclasses.dataclass(frozen=True)
class RunOwner:
    """Who owns a run: a job, or (no job yet) an admit that reserved the run and has not committed."""

    job: JobRef | None
    reserved: bool


@dataclasses.dataclass(frozen=True)
class ClaimedSettlement:
    """An ended job whose run must be confirmed settled, claimed for one attempt."""

    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    attempt: int


@dataclasses.dataclass(frozen=True)
class ClaimedReservation:
    """A reserved run whose admit is gone, claimed for one CancelRun attempt."""

    run_id: uuid.UUID
    attempt: int


async def reserve_run(
    conn: AsyncConnection, *, run_id: uuid.UUID, user_id: str, idempotency_key: str, grace_seconds: float
) -> AsyncCursor[Any]:
    """Sends reserve_run without waiting (pipelined with admit_state); fetch to learn whether
    the run was reserved."""
    return await conn.execute(
        queries()["reserve_run"],  # type: ignore[arg-type]
        {"run_id": run_id, "user_id": user_id, "idempotency_key": idempotency_key, "grace_seconds": float(grace_seconds)},
    )


async def admit_state(
    conn: AsyncConnection, *, user_id: str, idempotency_key: str, delta_of_job_id: uuid.UUID | None
) -> AdmitState:
    row = await _one(
        conn,
        "admit_state",
        {"user_id": user_id, "idempotency_key": idempotency_key, "delta_of_job_id": delta_of_job_id},
    )
    assert row is not None
    return AdmitState(**row)


async def insert_admitted_job(
    conn: AsyncConnection,
    job: NewJob,
    *,
    default_max_active: int,
    max_queued: int,
    max_running_deltas: int,
    release_window_seconds: float,
    reconcile_after_seconds: float,
) -> str | None:
    """Returns the new job's status, or None when the key is taken, the balance is short, the
    queue or delta limit is full, or the run's reservation is gone."""
    row = await _one(
        conn,
        "insert_admitted_job",
        {
            **dataclasses.asdict(job),
            "is_delta": job.delta_of_job_id is not None,
            "default_max_active": default_max_active,
            "max_queued": max_queued,
            "max_running_deltas": max_running_deltas,
            "release_window_seconds": float(release_window_seconds),
            "reconcile_after_seconds": float(reconcile_after_seconds),
        },
    )
    return None if row is None else row["status"]


@dataclasses.dataclass(frozen=True)
class Promoted:
    job_id: uuid.UUID
    run_id: uuid.UUID
    more_slots_free: bool


async def promote_next_queued_job(
    conn: AsyncConnection, *, user_id: str, default_max_active: int, release_window_seconds: float
) -> Promoted | None:
    row = await _one(
        conn,
        "promote_next_queued_job",
        {
            "user_id": user_id,
            "default_max_active": default_max_active,
            "release_window_seconds": float(release_window_seconds),
        },
    )
    return None if row is None else Promoted(row["job_id"], row["run_id"], row["more_slots_free"])


async def finish_job(
    conn: AsyncConnection,
    *,
    job_id: uuid.UUID,
    status: str,
    from_statuses: list[str],
    last_error: str = "",
    expected_attempts: int | None = None,
    run_unsettled: bool = False,
) -> JobRef | None:
    row = await _one(
        conn,
        "finish_job",
        {
            "job_id": job_id,
            "status": status,
            "from_statuses": from_statuses,
            "last_error": last_error,
            "expected_attempts": expected_attempts,
            "run_unsettled": run_unsettled,
        },
    )
    return None if row is None else JobRef(**row)


async def settle_job_run(conn: AsyncConnection, *, job_id: uuid.UUID) -> bool:
    """Marks an ended job's run settled; False when it already was."""
    return await _one(conn, "settle_job_run", {"job_id": job_id}) is not None


async def claim_due_run_settlements(conn: AsyncConnection, *, lease_seconds: float, batch_size: int) -> list[ClaimedSettlement]:
    rows = await _all(conn, "claim_due_run_settlements", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
    return [ClaimedSettlement(r["job_id"], r["user_id"], r["run_id"], r["run_settle_attempts"]) for r in rows]


async def schedule_run_settle_retry(conn: AsyncConnection, *, job_id: uuid.UUID, attempt: int, backoff_seconds: float) -> None:
    await conn.execute(
        queries()["schedule_run_settle_retry"],  # type: ignore[arg-type]
        {"job_id": job_id, "attempt": attempt, "backoff_seconds": float(backoff_seconds)},
    )


async def claim_run_reservation(conn: AsyncConnection, *, run_id: uuid.UUID, lease_seconds: float) -> ClaimedReservation | None:
    row = await _one(conn, "claim_run_reservation", {"run_id": run_id, "lease_seconds": float(lease_seconds)})
    return None if row is None else ClaimedReservation(row["run_id"], row["cancel_attempts"])


async def claim_due_run_reservations(conn: AsyncConnection, *, lease_seconds: float, batch_size: int) -> list[ClaimedReservation]:
    rows = await _all(conn, "claim_due_run_reservations", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
    return [ClaimedReservation(r["run_id"], r["cancel_attempts"]) for r in rows]


async def schedule_run_reservation_retry(conn: AsyncConnection, *, run_id: uuid.UUID, attempt: int, backoff_seconds: float) -> None:
    await conn.execute(
        queries()["schedule_run_reservation_retry"],  # type: ignore[arg-type]
        {"run_id": run_id, "attempt": attempt, "backoff_seconds": float(backoff_seconds)},
    )


async def drop_run_reservation(conn: AsyncConnection, *, run_id: uuid.UUID) -> None:
    await conn.execute(queries()["drop_run_reservation"], {"run_id": run_id})  # type: ignore[arg-type]


async def refund_job_charge(conn: AsyncConnection, *, job_id: uuid.UUID) -> int:
    """Returns the refunded amount (0 when there was no charge or it was already refunded)."""
    row = await _one(conn, "refund_job_charge", {"job_id": job_id})
    return 0 if row is None else int(row["amount"])


async def job_by_id(conn: AsyncConnection, *, job_id: uuid.UUID) -> JobRef | None:
    row = await _one(conn, "job_by_id", {"job_id": job_id})
    return None if row is None else JobRef(**row)


async def run_owner(conn: AsyncConnection, *, run_id: uuid.UUID) -> RunOwner:
    row = await _one(conn, "job_by_run_id", {"run_id": run_id})
    assert row is not None
    reserved = bool(row.pop("reserved"))
    return RunOwner(job=JobRef(**row) if row["job_id"] is not None else None, reserved=reserved)


def _claims(rows: list[dict[str, Any]]) -> list[ClaimedRelease]:
    return [
        ClaimedRelease(
            job_id=r["job_id"],
            user_id=r["user_id"],
            run_id=r["run_id"],
            attempt=r["release_attempts"],
            release_deadline=r["release_deadline"],
            promote_time=r["promote_time"],
        )
        for r in rows
    ]


async def claim_due_releases(conn: AsyncConnection, *, lease_seconds: float, batch_size: int) -> list[ClaimedRelease]:
    rows = await _all(conn, "claim_due_releases", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
    return _claims(rows)


async def claim_release_of_job(conn: AsyncConnection, *, job_id: uuid.UUID, lease_seconds: float) -> ClaimedRelease | None:
    rows = await _all(conn, "claim_release_of_job", {"job_id": job_id, "lease_seconds": float(lease_seconds)})
    claims = _claims(rows)
    return claims[0] if claims else None


async def mark_released(conn: AsyncConnection, *, job_id: uuid.UUID, attempt: int, reconcile_after_seconds: float) -> bool:
    row = await _one(
        conn,
        "mark_released",
        {"job_id": job_id, "attempt": attempt, "reconcile_after_seconds": float(reconcile_after_seconds)},
    )
    return row is not None


@dataclasses.dataclass(frozen=True)
class ScheduledRetry:
    next_release_at: dt.datetime
    window_over: bool


async def schedule_release_retry(
    conn: AsyncConnection, *, job_id: uuid.UUID, attempt: int, backoff_seconds: float, last_error: str
) -> ScheduledRetry | None:
    """None when the job is no longer this attempt's (fenced)."""
    row = await _one(
        conn,
        "schedule_release_retry",
        {"job_id": job_id, "attempt": attempt, "backoff_seconds": float(backoff_seconds), "last_error": last_error},
    )
    return None if row is None else ScheduledRetry(**row)


async def next_release_due_in(conn: AsyncConnection) -> float | None:
    """Seconds until the earliest pending release is due, in the database's clock (None: none)."""
    row = await _one(conn, "next_release_due_in", {})
    return None if row is None or row["seconds"] is None else float(row["seconds"])


async def users_needing_promotion(conn: AsyncConnection, *, default_max_active: int, batch_size: int) -> list[str]:
    rows = await _all(conn, "users_needing_promotion", {"default_max_active": default_max_active, "batch_size": batch_size})
    return [r["user_id"] for r in rows]


async def expired_pending_releases(conn: AsyncConnection, *, batch_size: int) -> list[dict[str, Any]]:
    return await _all(conn, "expired_pending_releases", {"batch_size": batch_size})


async def claim_due_reconciliations(conn: AsyncConnection, *, recheck_seconds: float, batch_size: int) -> list[dict[str, Any]]:
    return await _all(conn, "claim_due_reconciliations", {"recheck_seconds": float(recheck_seconds), "batch_size": batch_size})


async def job_views_by_ids(conn: AsyncConnection, *, job_ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    return await _all(conn, "job_views_by_ids", {"job_ids": job_ids})


async def send_job_views_by_ids(conn: AsyncConnection, *, job_ids: list[uuid.UUID]) -> AsyncCursor[Any]:
    """Sends job_views_by_ids without waiting for it: on a pipelined connection it travels with
    the COMMIT. Fetch the cursor's rows after the transaction."""
    return await conn.execute(queries()["job_views_by_ids"], {"job_ids": job_ids})  # type: ignore[arg-type]


async def list_job_views(
    conn: AsyncConnection,
    *,
    user_id: str,
    after_job_id: uuid.UUID | None,
    before_seq: int | None,
    statuses: list[str],
    limit: int,
) -> list[dict[str, Any]]:
    return await _all(
        conn,
        "list_job_views",
        {"user_id": user_id, "after_job_id": after_job_id, "before_seq": before_seq, "statuses": statuses, "limit": limit},
    )


async def watch_resync_views(
    conn: AsyncConnection, *, user_id: str, job_ids: list[uuid.UUID], after_seq: int
) -> list[dict[str, Any]]:
    return await _all(conn, "watch_resync_views", {"user_id": user_id, "job_ids": job_ids, "after_seq": after_seq})


async def newest_seq_of_user(conn: AsyncConnection, *, user_id: str) -> int:
    row = await _one(conn, "newest_seq_of_user", {"user_id": user_id})
    assert row is not None
    return int(row["seq"])


async def active_job_views_of_user(conn: AsyncConnection, *, user_id: str) -> list[dict[str, Any]]:
    return await _all(conn, "active_job_views_of_user", {"user_id": user_id})


async def queued_job_views_of_user(conn: AsyncConnection, *, user_id: str) -> list[dict[str, Any]]:
    return await _all(conn, "queued_job_views_of_user", {"user_id": user_id})


async def recent_judging_seconds(conn: AsyncConnection) -> float | None:
    row = await _one(conn, "recent_judging_seconds", {})
    return None if row is None else row["seconds"]


async def queue_depth(conn: AsyncConnection) -> dict[str, int]:
    row = await _one(conn, "queue_depth", {})
    assert row is not None
    return {name: int(value) for name, value in row.items()}


async def grant_credits(conn: AsyncConnection, *, user_id: str, amount: int, idempotency_key: str) -> int | None:
    """Returns the new balance, or None when the key was used before."""
    row = await _one(conn, "grant_credits", {"user_id": user_id, "amount": amount, "idempotency_key": idempotency_key})
    return None if row is None else int(row["balance"])


async def grant_by_key(conn: AsyncConnection, *, user_id: str, idempotency_key: str) -> int | None:
    row = await _one(conn, "grant_by_key", {"user_id": user_id, "idempotency_key": idempotency_key})
    return None if row is None else int(row["amount"])


async def balance_of_user(conn: AsyncConnection, *, user_id: str) -> int:
    row = await _one(conn, "balance_of_user", {"user_id": user_id})
    assert row is not None
    return int(row["balance"])


async def operator_overview(conn: AsyncConnection, *, window_minutes: int, reconcile_after_seconds: float) -> dict[str, Any]:
    row = await _one(
        conn,
        "operator_overview",
        {"window_minutes": window_minutes, "reconcile_after_seconds": float(reconcile_after_seconds)},
    )
    assert row is not None
    return row


async def admits_per_minute(conn: AsyncConnection, *, window_minutes: int) -> list[int]:
    rows = await _all(conn, "admits_per_minute", {"window_minutes": window_minutes})
    return [int(r["admits"]) for r in rows]


@dataclasses.dataclass(frozen=True)
class JobSearch:
    """A job search across users; `upper_*` is the keyset position to continue below."""

    user_id: str
    statuses: list[str]
    created_after: dt.datetime | None
    upper_time: dt.datetime | None
    upper_job_id: uuid.UUID | None
    has_error: bool


async def search_job_views(conn: AsyncConnection, search: JobSearch, *, limit: int) -> list[dict[str, Any]]:
    """Picks the query shape whose index fits the filter: one user, one status, or all."""
    params: dict[str, Any] = {**dataclasses.asdict(search), "limit": limit}
    if search.user_id:
        return await _all(conn, "search_job_views_of_user", params)
    if len(search.statuses) == 1:
        return await _all(conn, "search_job_views_in_status", {**params, "status": search.statuses[0]})
    return await _all(conn, "search_job_views", params)


async def active_jobs_matching(
    conn: AsyncConnection,
    *,
    statuses: list[str],
    user_id: str,
    created_after: dt.datetime | None,
    created_before: dt.datetime | None,
    has_error: bool,
    limit: int,
) -> list[dict[str, Any]]:
    return await _all(
        conn,
        "active_jobs_matching",
        {
            "statuses": statuses,
            "user_id": user_id,
            "created_after": created_after,
            "created_before": created_before,
            "has_error": has_error,
            "limit": limit,
        },
    )
