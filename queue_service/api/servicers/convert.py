"""Model values to protos and back: job statuses, job views, the operator's overview, ledger entries."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from google.protobuf import timestamp_pb2

from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as operator_pb2
from queue_service.errors import InvalidRequest
from queue_service.model import (
    AuditEvent,
    CapacityState,
    CoreHealth,
    CoreState,
    JobStatus,
    JobView,
    LedgerEntry,
    LedgerKind,
    Overview,
    PauseInForce,
    QueueMinute,
    ReplicaReport,
    SettingChange,
    UserSettings,
    UserWork,
    combined_core_health,
)

PROTO_OF_STATUS: dict[JobStatus, job_pb2.JobStatus.ValueType] = {
    JobStatus.QUEUED: job_pb2.JOB_STATUS_QUEUED,
    JobStatus.PENDING: job_pb2.JOB_STATUS_PENDING,
    JobStatus.RUNNING: job_pb2.JOB_STATUS_RUNNING,
    JobStatus.SUCCEEDED: job_pb2.JOB_STATUS_SUCCEEDED,
    JobStatus.FAILED: job_pb2.JOB_STATUS_FAILED,
    JobStatus.CANCELED: job_pb2.JOB_STATUS_CANCELED,
}
# Keyed by plain int: any int may arrive on the wire, so a lookup must accept one.
STATUS_OF_PROTO: dict[int, JobStatus] = {value: status for status, value in PROTO_OF_STATUS.items()}

# A status filter has at most this many entries: there are six statuses; a longer list is a
# mistake or an attack (each entry costs event-loop time).
MAX_STATUS_FILTERS = 16


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NAIVE_EPOCH = dt.datetime(1970, 1, 1)


def set_timestamp(message: timestamp_pb2.Timestamp, moment: dt.datetime) -> None:
    """`message.FromDatetime(moment)` (a naive moment read as UTC), in integer arithmetic: the
    library's goes through a time tuple and calendar.timegm, a good share of a job's conversion,
    and every answer and watched change converts one to four."""
    since = moment - (_EPOCH if moment.tzinfo is not None else _NAIVE_EPOCH)
    message.seconds = since.days * 86_400 + since.seconds
    message.nanos = since.microseconds * 1000


def status_filter(statuses: Iterable[int], *, field: str = "statuses") -> tuple[JobStatus, ...]:
    """The statuses a request filters by (sorted, without repeats); INVALID_ARGUMENT names the
    entry that is not a status."""
    given = list(statuses)
    if len(given) > MAX_STATUS_FILTERS:
        raise InvalidRequest(
            f"{field} lists {len(given)} entries; at most {MAX_STATUS_FILTERS} (there are six statuses)",
            metadata={"maxStatuses": str(MAX_STATUS_FILTERS)},
            field_violations=[(field, f"at most {MAX_STATUS_FILTERS} entries")],
        )
    chosen = set()
    for index, value in enumerate(given):
        status = STATUS_OF_PROTO.get(value)
        if status is None:
            raise InvalidRequest(
                f"{field}[{index}] is not a job status",
                field_violations=[(f"{field}[{index}]", "use JOB_STATUS_QUEUED .. JOB_STATUS_CANCELED")],
            )
        chosen.add(status)
    return tuple(sorted(chosen))


def job_to_proto(view: JobView) -> job_pb2.Job:
    job = job_pb2.Job(
        job_id=str(view.job_id),
        user_id=view.user_id,
        run_id=str(view.run_id),
        status=PROTO_OF_STATUS[view.status],
        queue_position=view.queue_position,
        delta_of_job_id=str(view.delta_of_job_id) if view.delta_of_job_id else "",
        release_attempts=view.release_attempts,
        last_error=view.last_error,
        price=view.price,
        refunded=view.refunded,
        source_count=view.source_count,
        retry_of_job_id=str(view.retry_of_job_id) if view.retry_of_job_id else "",
        retried_as_job_ids=[str(job_id) for job_id in view.retried_as_job_ids],
        canceled_by=view.canceled_by,
        run_overdue=view.run_overdue,
        behind_overdue_run=view.behind_overdue_run,
    )
    if view.document_uri or view.document_title:
        job.document.uri = view.document_uri
        job.document.title = view.document_title
    for doi, citation in view.sources_preview:
        job.sources.add(doi=doi, citation=citation)
    set_timestamp(job.create_time, view.create_time)
    for field, moment in (("promote_time", view.promote_time), ("start_time", view.start_time), ("end_time", view.end_time)):
        if moment is not None:
            set_timestamp(getattr(job, field), moment)
    if view.status is JobStatus.QUEUED:
        if view.waiting_for_job_id is not None:
            job.waiting_for_job_id = str(view.waiting_for_job_id)
        if view.estimated_start_time is not None:
            set_timestamp(job.estimated_start_time, view.estimated_start_time)
    elif view.status is JobStatus.PENDING and view.waiting_for_capacity:
        job.capacity_position = view.capacity_position
        if view.estimated_start_time is not None:
            set_timestamp(job.estimated_start_time, view.estimated_start_time)
    return job


def overview_to_proto(overview: Overview) -> operator_pb2.Overview:
    message = operator_pb2.Overview(
        queued=overview.queued,
        pending=overview.pending,
        running=overview.running,
        succeeded_in_window=overview.succeeded_in_window,
        failed_in_window=overview.failed_in_window,
        canceled_in_window=overview.canceled_in_window,
        users_waiting=overview.users_waiting,
        releases_retrying=overview.releases_retrying,
        runs_reconciling=overview.runs_reconciling,
        admits_per_minute=overview.admits_per_minute,
        window_minutes=overview.window_minutes,
    )
    if overview.oldest_queued_create_time is not None:
        set_timestamp(message.oldest_queued_create_time, overview.oldest_queued_create_time)
    set_timestamp(message.read_time, overview.read_time)
    if overview.capacity is not None:
        capacity_to_proto(overview.capacity, message)
    if overview.core_health is not None:
        message.core_health.CopyFrom(core_health_to_proto(overview.core_health))
    return message


PROTO_OF_CORE_STATE: dict[CoreState, operator_pb2.CoreState.ValueType] = {
    CoreState.UNKNOWN: operator_pb2.CORE_STATE_UNKNOWN,
    CoreState.HEALTHY: operator_pb2.CORE_STATE_HEALTHY,
    CoreState.DEGRADED: operator_pb2.CORE_STATE_DEGRADED,
    CoreState.UNREACHABLE: operator_pb2.CORE_STATE_UNREACHABLE,
    CoreState.REFUSING: operator_pb2.CORE_STATE_REFUSING,
}


def core_health_to_proto(health: CoreHealth) -> operator_pb2.CoreHealth:
    message = operator_pb2.CoreHealth(
        state=PROTO_OF_CORE_STATE[health.state],
        last_failure_reason=health.last_failure_reason,
        window_minutes=health.window_minutes,
        answered=health.answered,
        refused=health.refused,
        unknown=health.unknown,
        admits_unavailable=health.admits_unavailable,
        latency_p50_ms=health.latency_p50_ms or 0.0,
        latency_p99_ms=health.latency_p99_ms or 0.0,
        replicas_reporting=health.replicas_reporting,
        replicas_reaching=health.replicas_reaching,
    )
    if health.last_success_at is not None:
        set_timestamp(message.last_success_time, health.last_success_at)
    if health.last_failure_at is not None:
        set_timestamp(message.last_failure_time, health.last_failure_at)
    for calls in health.methods:
        method = message.methods.add(
            method=calls.method,
            answered=calls.answered,
            refused=calls.refused,
            unknown=calls.unknown,
            last_failure_reason=calls.last_failure_reason,
        )
        if calls.last_failure_at is not None:
            set_timestamp(method.last_failure_time, calls.last_failure_at)
    return message


def capacity_to_proto(capacity: CapacityState, message: operator_pb2.Overview) -> None:
    """The capacity figures of an overview."""
    message.capacity_in_use = capacity.in_use
    message.capacity_limit = capacity.capacity
    message.capacity_waiting_jobs = capacity.waiting_jobs
    message.capacity_waiting_users = capacity.waiting_users
    message.core_limit = capacity.core_limit or 0
    message.core_refusals = capacity.core_refusals
    if capacity.oldest_wait_since is not None:
        set_timestamp(message.oldest_capacity_wait_time, capacity.oldest_wait_since)
    message.releases_paused = capacity.fleet_pause is not None
    message.paused_users = capacity.paused_users
    if capacity.fleet_pause is not None:
        set_timestamp(message.releases_paused_since, capacity.fleet_pause.since)
        message.releases_paused_by = capacity.fleet_pause.paused_by
        message.releases_paused_note = capacity.fleet_pause.note


def user_settings_to_proto(settings: UserSettings) -> operator_pb2.GetUserSettingsResponse:
    message = operator_pb2.GetUserSettingsResponse(
        user_id=settings.user_id,
        max_active=settings.max_active,
        max_active_is_default=settings.max_active_is_default,
        releases_paused=settings.own_pause is not None,
        fleet_releases_paused=settings.fleet_paused,
    )
    if settings.own_pause is not None:
        set_timestamp(message.releases_paused_since, settings.own_pause.since)
        message.releases_paused_by = settings.own_pause.paused_by
        message.releases_paused_note = settings.own_pause.note
    return message


def setting_change_to_proto(change: SettingChange) -> operator_pb2.SettingChange:
    message = operator_pb2.SettingChange(
        change_id=change.change_id,
        setting=change.setting,
        user_id=change.user_id or "",
        old_value=change.old_value or 0,
        new_value=change.new_value or 0,
        actor=change.actor,
        note=change.note,
    )
    set_timestamp(message.create_time, change.create_time)
    return message


def pause_to_proto(pause: PauseInForce) -> operator_pb2.ReleasePause:
    message = operator_pb2.ReleasePause(user_id=pause.user_id, paused_by=pause.pause.paused_by, note=pause.pause.note)
    set_timestamp(message.paused_since, pause.pause.since)
    return message


def audit_event_to_proto(event: AuditEvent) -> operator_pb2.AuditEvent:
    message = operator_pb2.AuditEvent(
        kind=event.kind,
        actor=event.actor,
        user_id=event.user_id,
        job_id=str(event.job_id) if event.job_id else "",
        retry_of_job_id=str(event.retry_of_job_id) if event.retry_of_job_id else "",
        old_value=event.old_value,
        new_value=event.new_value,
        amount=event.amount,
        note=event.note,
        outcome=event.outcome,
    )
    set_timestamp(message.create_time, event.occurred_at)
    return message


PROTO_OF_LEDGER_KIND: dict[LedgerKind, operator_pb2.LedgerEntryKind.ValueType] = {
    LedgerKind.GRANT: operator_pb2.LEDGER_ENTRY_KIND_GRANT,
    LedgerKind.CHARGE: operator_pb2.LEDGER_ENTRY_KIND_CHARGE,
    LedgerKind.REFUND: operator_pb2.LEDGER_ENTRY_KIND_REFUND,
}


def ledger_entry_to_proto(entry: LedgerEntry) -> operator_pb2.LedgerEntry:
    message = operator_pb2.LedgerEntry(
        entry_id=entry.entry_id,
        user_id=entry.user_id,
        kind=PROTO_OF_LEDGER_KIND[entry.kind],
        amount=entry.amount,
        job_id=str(entry.job_id) if entry.job_id is not None else "",
        idempotency_key=entry.idempotency_key or "",
        actor=entry.actor,
        reason=entry.reason,
        note=entry.note,
    )
    set_timestamp(message.create_time, entry.create_time)
    return message


def user_work_to_proto(user: UserWork) -> operator_pb2.UserWork:
    message = operator_pb2.UserWork(user_id=user.user_id, queued=user.queued, pending=user.pending, running=user.running)
    if user.oldest_queued_create_time is not None:
        set_timestamp(message.oldest_queued_create_time, user.oldest_queued_create_time)
    set_timestamp(message.oldest_create_time, user.oldest_create_time)
    return message


def queue_minute_to_proto(minute: QueueMinute) -> operator_pb2.QueueMinute:
    message = operator_pb2.QueueMinute(queued=minute.queued, active=minute.active, admitted=minute.admitted, ended=minute.ended)
    set_timestamp(message.minute, minute.minute)
    return message


def replica_to_proto(replica: ReplicaReport) -> operator_pb2.Replica:
    message = operator_pb2.Replica(
        replica_id=replica.replica_id,
        host=replica.host,
        draining=replica.draining,
        calls_in_flight=replica.calls_in_flight,
        watch_streams=replica.watch_streams,
        overview_streams=replica.overview_streams,
        core_calls=operator_pb2.CoreCalls(answered=replica.core_answered, refused=replica.core_refused, unknown=replica.core_unknown),
    )
    if replica.core_health is not None:
        # As the replica read the core at its heartbeat (its window ends there).
        at = replica.heartbeat_time or dt.datetime.now(dt.UTC)
        message.core_health.CopyFrom(core_health_to_proto(combined_core_health([replica.core_health], at)))
    set_timestamp(message.start_time, replica.start_time)
    if replica.heartbeat_time is not None:
        set_timestamp(message.heartbeat_time, replica.heartbeat_time)
    if replica.core_last_unknown_at is not None:
        set_timestamp(message.core_calls.last_unknown_time, replica.core_last_unknown_at)
    return message
