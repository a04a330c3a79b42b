"""What the operator reads: the audit timeline, the job search and a bulk cancel's filter, the
overview, the users with work, the queue's history and the replicas' reports.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

from queue_service.model.capacity import CapacityState
from queue_service.model.core_health import CoreHealth, CoreHealthReport
from queue_service.model.jobs import JobStatus


@dataclasses.dataclass(frozen=True)
class AuditEvent:
    """One thing someone did, as the audit timeline shows it (OperatorService.ListAuditEvents):
    `kind` is `capacity`, `user_limit`, `pause`, `resume`, `grant`, `cancel`, `retry`,
    `promote`, `release` or `check_with_core`. `event_key` orders events of one instant and is
    the keyset position with `occurred_at`."""

    occurred_at: dt.datetime
    event_key: str
    kind: str
    actor: str
    user_id: str
    job_id: uuid.UUID | None = None
    retry_of_job_id: uuid.UUID | None = None
    old_value: int = 0
    new_value: int = 0
    amount: int = 0
    note: str = ""
    outcome: str = ""


@dataclasses.dataclass(frozen=True)
class AuditQuery:
    """Which audit events: by actor and by user ('' for either: all), below a keyset position."""

    actor: str = ""
    user_id: str = ""
    before_time: dt.datetime | None = None
    before_key: str = ""


@dataclasses.dataclass(frozen=True)
class JobSearch:
    """A job search across users; `upper_*` is the keyset position to continue below."""

    user_id: str
    statuses: tuple[JobStatus, ...]
    created_after: dt.datetime | None
    upper_time: dt.datetime | None
    upper_job_id: uuid.UUID | None
    has_error: bool
    inputs: JobInputsSearch = dataclasses.field(default_factory=lambda: JobInputsSearch())


@dataclasses.dataclass(frozen=True)
class JobInputsSearch:
    """A search in what jobs judge; an empty field matches every job. Values are trimmed, and
    `source_doi` lowercased, as the keys of migration 0029 are stored."""

    document_uri_prefix: str = ""
    title_words: str = ""
    source_doi: str = ""

    def __bool__(self) -> bool:
        return bool(self.document_uri_prefix or self.title_words or self.source_doi)


@dataclasses.dataclass(frozen=True)
class LiveJobFilter:
    """Which queued, pending or running jobs a bulk cancel matches (OperatorService.CancelJobs)."""

    statuses: tuple[JobStatus, ...]
    user_id: str
    created_after: dt.datetime | None
    created_before: dt.datetime | None
    has_error: bool
    inputs: JobInputsSearch = dataclasses.field(default_factory=lambda: JobInputsSearch())


@dataclasses.dataclass(frozen=True)
class Overview:
    """The operator's figures: the queue now and the endings of the last window."""

    queued: int
    pending: int
    running: int
    succeeded_in_window: int
    failed_in_window: int
    canceled_in_window: int
    users_waiting: int
    releases_retrying: int
    runs_reconciling: int
    oldest_queued_create_time: dt.datetime | None
    read_time: dt.datetime
    admits_per_minute: tuple[int, ...]
    window_minutes: int
    # The core's capacity, fleet-wide (None before the first read of it).
    capacity: CapacityState | None = None
    # The core's health, fleet-wide, from the replicas' fresh heartbeats (None before read).
    core_health: CoreHealth | None = None


@dataclasses.dataclass(frozen=True)
class UserWork:
    """One user's jobs in flight, for the operator's list of users with work."""

    user_id: str
    queued: int
    pending: int
    running: int
    oldest_queued_create_time: dt.datetime | None
    oldest_create_time: dt.datetime


@dataclasses.dataclass(frozen=True)
class QueueMinute:
    """The queue in one minute: depth at its end, admits and endings during it."""

    minute: dt.datetime
    queued: int
    active: int
    admitted: int
    ended: int


@dataclasses.dataclass(frozen=True)
class ReplicaReport:
    """What a replica reports about itself in its heartbeat row (OperatorService.ListReplicas)."""

    replica_id: str
    host: str
    start_time: dt.datetime
    draining: bool
    calls_in_flight: int
    watch_streams: int
    overview_streams: int
    # The core's calls since the replica started: answered, refused, outcome unknown.
    core_answered: int
    core_refused: int
    core_unknown: int
    core_last_unknown_at: dt.datetime | None
    # The core's recent health as this replica reads it (None from a replica of an older version).
    core_health: CoreHealthReport | None = None
    # When the row was last written (set by the database; None in a report not yet written).
    heartbeat_time: dt.datetime | None = None
