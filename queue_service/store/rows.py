"""Every row the store reads, turned into the model's types: no row leaves `store/`.

By column name, so a column a newer schema adds is ignored; statuses become `JobStatus`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from queue_service.model import (
    AdmitState,
    AuditEvent,
    CapacityGrant,
    CapacityState,
    ClaimedReconciliation,
    ClaimedRelease,
    ClaimedReservation,
    ClaimedSettlement,
    DatabaseIdentity,
    ExpiredRelease,
    JobRef,
    JobStatus,
    JobView,
    LedgerEntry,
    LedgerKind,
    Overview,
    PauseInForce,
    Promoted,
    ReleasePause,
    ReplicationStance,
    ScheduledRetry,
    SettingChange,
    UserSettings,
)
from queue_service.store.feed import JobChange

# Re-exported: the codecs of the JSON columns were read from here before they had a module.
from queue_service.store.json_values import core_health_of_json as core_health_of_json
from queue_service.store.json_values import core_health_to_json as core_health_to_json
from queue_service.store.json_values import sources_of_json

Row = dict[str, Any]


def job_view(row: Row) -> JobView:
    """From a row of `analysis_job_views`, by name: a column a newer schema adds is ignored."""
    return JobView(
        job_id=row["job_id"],
        user_id=row["user_id"],
        run_id=row["run_id"],
        status=JobStatus(row["status"]),
        delta_of_job_id=row["delta_of_job_id"],
        release_attempts=int(row["release_attempts"]),
        last_error=row["last_error"],
        create_time=row["create_time"],
        promote_time=row["promote_time"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        price=int(row["price"]),
        refunded=bool(row["refunded"]),
        queue_seq=int(row["queue_seq"]),
        queue_position=int(row["queue_position"]),
        waiting_for_job_id=row["waiting_for_job_id"],
        active_since=row["active_since"],
        max_active_override=row["max_active_override"],
        waiting_for_capacity=bool(row.get("waiting_for_capacity", False)),
        capacity_wait_since=row.get("capacity_wait_since"),
        document_uri=row.get("document_uri") or "",
        document_title=row.get("document_title") or "",
        source_count=int(row.get("source_count") or 0),
        sources_preview=sources_of_json(row.get("sources_preview")),
        retry_of_job_id=row.get("retry_of_job_id"),
        retried_as_job_ids=tuple(row.get("retried_as_job_ids") or ()),
        canceled_by=row.get("canceled_by") or "",
    )


def job_ref(row: Row) -> JobRef:
    return JobRef(
        job_id=row["job_id"],
        user_id=row["user_id"],
        run_id=row["run_id"],
        status=JobStatus(row["status"]),
        delta_of_job_id=row["delta_of_job_id"],
        run_unsettled=bool(row.get("run_unsettled", False)),
        cancel_requested=bool(row.get("cancel_requested", False)),
        canceled_by=row.get("canceled_by") or "",
        release_attempts=int(row.get("release_attempts") or 0),
        waiting_for_capacity=bool(row.get("waiting_for_capacity", False)),
    )


def view_ref(view: JobView, row: Row) -> JobRef:
    return JobRef(view.job_id, view.user_id, view.run_id, view.status, view.delta_of_job_id, run_unsettled=bool(row["run_unsettled"]))


def promoted(rows: list[Row]) -> tuple[Promoted, ...]:
    return tuple(
        Promoted(
            row["job_id"],
            row["user_id"],
            row["run_id"],
            waiting=bool(row.get("waiting_for_capacity", False)),
            history_reconciled=row.get("history_reconciled"),
        )
        for row in rows
        if row["row_kind"] == "promoted"
    )


def claimed_release(row: Row) -> ClaimedRelease:
    return ClaimedRelease(
        job_id=row["job_id"],
        user_id=row["user_id"],
        run_id=row["run_id"],
        attempt=row["release_attempts"],
        cancel_requested=bool(row.get("cancel_requested", False)),
        history_reconciled=row.get("history_reconciled"),
        delta=bool(row.get("delta", False)),
    )


def admit_state(row: Row) -> AdmitState:
    return AdmitState(
        existing_job_id=row["existing_job_id"],
        existing_digest=row["existing_digest"],
        queued_count=int(row["queued_count"]),
        running_deltas=int(row["running_deltas"]),
        balance=int(row["balance"]),
        base_user_id=row["base_user_id"],
        base_status=None if row["base_status"] is None else JobStatus(row["base_status"]),
        base_run_id=row["base_run_id"],
        capacity_limited=bool(row.get("capacity_limited", False)),
        free_admits_last_hour=int(row["free_admits_last_hour"]),
        free_admit_frees_in_seconds=row["free_admit_frees_in_seconds"],
    )


def ledger_entry(row: Row) -> LedgerEntry:
    return LedgerEntry(
        entry_id=int(row["entry_id"]),
        create_time=row["create_time"],
        user_id=row["user_id"],
        kind=LedgerKind(row["kind"]),
        amount=int(row["amount"]),
        job_id=row["job_id"],
        idempotency_key=row["idempotency_key"],
        actor=row["actor"],
        reason=row["reason"],
        note=row.get("note") or "",
    )


def pause_in_force(row: Row) -> PauseInForce:
    return PauseInForce(row["user_id"], ReleasePause(since=row["paused_at"], paused_by=row["paused_by"], note=row["note"] or ""))


def audit_event(row: Row) -> AuditEvent:
    return AuditEvent(
        occurred_at=row["occurred_at"],
        event_key=row["event_key"],
        kind=row["kind"],
        actor=row["actor"],
        user_id=row["user_id"] or "",
        job_id=row["job_id"],
        retry_of_job_id=row["retry_of_job_id"],
        old_value=int(row["old_value"] or 0),
        new_value=int(row["new_value"] or 0),
        amount=int(row["amount"] or 0),
        note=row["note"] or "",
        outcome=row["outcome"] or "",
    )


def setting_change(row: Row) -> SettingChange:
    return SettingChange(
        change_id=int(row["change_id"]),
        setting=row["setting"],
        user_id=row["user_id"],
        old_value=row["old_value"],
        new_value=row["new_value"],
        actor=row["actor"],
        create_time=row["create_time"],
        note=row.get("note") or "",
    )


def claimed_settlement(row: Row) -> ClaimedSettlement:
    return ClaimedSettlement(row["job_id"], row["user_id"], row["run_id"], row["run_settle_attempts"])


def claimed_reservation(row: Row) -> ClaimedReservation:
    return ClaimedReservation(row["run_id"], row["cancel_attempts"])


def scheduled_retry(row: Row) -> ScheduledRetry:
    return ScheduledRetry(next_release_at=row["next_release_at"], window_over=row["window_over"])


def expired_release(row: Row) -> ExpiredRelease:
    return ExpiredRelease(row["job_id"], row["user_id"], row["release_attempts"])


def claimed_reconciliation(row: Row) -> ClaimedReconciliation:
    return ClaimedReconciliation(row["job_id"], row["user_id"], row["run_id"], cancel_requested=bool(row["cancel_requested"]))


def capacity_state(row: Row) -> CapacityState:
    return CapacityState(
        capacity=int(row["capacity"]),
        core_limit=row["core_limit"],
        in_use=int(row["in_use"]),
        waiting_jobs=int(row["waiting_jobs"]),
        waiting_users=int(row["waiting_users"]),
        oldest_wait_since=row["oldest_wait_since"],
        core_refusals=int(row["core_refusals"]),
        updated_by=row["updated_by"] or "",
        updated_at=row["updated_at"],
        fleet_pause=release_pause(row["fleet_paused_at"], row["fleet_paused_by"], row["fleet_pause_note"]),
        paused_users=int(row["paused_users"]),
        paused_user_ids=frozenset(row["paused_user_ids"]) if len(row["paused_user_ids"]) == int(row["paused_users"]) else None,
    )


def release_pause(since: dt.datetime | None, paused_by: str | None, note: str | None) -> ReleasePause | None:
    return None if since is None else ReleasePause(since=since, paused_by=paused_by or "", note=note or "")


def user_settings(user_id: str, row: Row) -> UserSettings:
    return UserSettings(
        user_id=user_id,
        max_active=int(row["max_active"]),
        max_active_is_default=bool(row["max_active_is_default"]),
        own_pause=release_pause(row["paused_at"], row["paused_by"], row["pause_note"]),
        fleet_paused=row["fleet_paused_at"] is not None,
    )


def capacity_grant_json(rows: list[Row]) -> list[Row]:
    """A grant's rows as the completions' statement returns them (one JSON array,
    `locks.locked_sections_of_runs_then_grant`): the ids back to UUIDs."""
    return [{**row, "job_id": _uuid_or_none(row["job_id"]), "run_id": _uuid_or_none(row["run_id"])} for row in rows]


def _uuid_or_none(value: str | None) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(value)


def capacity_grant(rows: list[Row]) -> CapacityGrant:
    """A grant's rows (`queue_grant_capacity`): a 'granted' row per release it claimed, one 'state' row."""
    claims = tuple(
        (
            ClaimedRelease(
                row["job_id"],
                row["user_id"],
                row["run_id"],
                row["release_attempts"],
                cancel_requested=bool(row["cancel_requested"]),
                probe=bool(row["probe"]),
                history_reconciled=row.get("history_reconciled"),
                delta=bool(row.get("delta", False)),
            ),
            float(row["capacity_waited_seconds"] or 0.0),
        )
        for row in rows
        if row["row_kind"] == "granted"
    )
    state = next(row for row in rows if row["row_kind"] == "state")
    return CapacityGrant(claims, bool(state["limited"]), in_use=int(state["in_use"] or 0), limit=state["capacity_limit"])


def overview(row: Row, admits: list[Row], *, window_minutes: int) -> Overview:
    return Overview(
        queued=row["queued"],
        pending=row["pending"],
        running=row["running"],
        succeeded_in_window=row["succeeded_in_window"],
        failed_in_window=row["failed_in_window"],
        canceled_in_window=row["canceled_in_window"],
        users_waiting=row["users_waiting"],
        releases_retrying=row["releases_retrying"],
        runs_reconciling=row["runs_reconciling"],
        oldest_queued_create_time=row["oldest_queued_create_time"],
        read_time=row["read_time"],
        admits_per_minute=tuple(int(r["admits"]) for r in admits),
        window_minutes=window_minutes,
    )


def job_change(row: Row) -> JobChange:
    """A row of the job-change feed (`job_feed_since`)."""
    return JobChange(
        change_id=int(row["change_id"]),
        job_id=row["job_id"],
        user_id=row["user_id"],
        status=JobStatus(row["status"]),
        old_status=None if row["old_status"] is None else JobStatus(row["old_status"]),
        release_claimed=bool(row["release_claimed"]),
        lag_seconds=max(0.0, float(row["lag_seconds"])),
    )


def database_identity(row: Row) -> DatabaseIdentity:
    return DatabaseIdentity(row["system_identifier"], row["timeline_id"], reconciled=bool(row["reconciled"]))


def replication_stance(row: Row) -> ReplicationStance:
    """What this replica's commits wait for, from the settings and the standbys' sync state."""
    commit = str(row["synchronous_commit"])
    names = str(row["synchronous_standby_names"]).strip()
    standbys, synchronous, hidden = int(row["standbys"]), int(row["synchronous_standbys"]), int(row["standbys_hidden"])
    waits = commit in ("on", "remote_write", "remote_apply") and bool(names)
    if row["in_recovery"]:
        mode = "standby"
    elif waits and synchronous > 0:
        mode = "synchronous"
    elif waits and hidden > 0:
        mode = "unknown"
    elif waits:
        mode = "synchronous_without_standby"
    elif standbys > 0:
        mode = "asynchronous"
    else:
        mode = "single_node"
    return ReplicationStance(
        mode=mode, synchronous_commit=commit, synchronous_standby_names=names, standbys=standbys, synchronous_standbys=synchronous
    )
