import datetime

from queue_service._gen.acurio.queue.v1 import job_pb2 as _job_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LedgerEntryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEDGER_ENTRY_KIND_UNSPECIFIED: _ClassVar[LedgerEntryKind]
    LEDGER_ENTRY_KIND_GRANT: _ClassVar[LedgerEntryKind]
    LEDGER_ENTRY_KIND_CHARGE: _ClassVar[LedgerEntryKind]
    LEDGER_ENTRY_KIND_REFUND: _ClassVar[LedgerEntryKind]
LEDGER_ENTRY_KIND_UNSPECIFIED: LedgerEntryKind
LEDGER_ENTRY_KIND_GRANT: LedgerEntryKind
LEDGER_ENTRY_KIND_CHARGE: LedgerEntryKind
LEDGER_ENTRY_KIND_REFUND: LedgerEntryKind

class JobFilter(_message.Message):
    __slots__ = ("statuses", "user_id", "created_after", "created_before", "has_error")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    HAS_ERROR_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[_job_pb2.JobStatus]
    user_id: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    has_error: bool
    def __init__(self, statuses: _Optional[_Iterable[_Union[_job_pb2.JobStatus, str]]] = ..., user_id: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., has_error: _Optional[bool] = ...) -> None: ...

class GetOverviewRequest(_message.Message):
    __slots__ = ("window_minutes",)
    WINDOW_MINUTES_FIELD_NUMBER: _ClassVar[int]
    window_minutes: int
    def __init__(self, window_minutes: _Optional[int] = ...) -> None: ...

class GetOverviewResponse(_message.Message):
    __slots__ = ("overview",)
    OVERVIEW_FIELD_NUMBER: _ClassVar[int]
    overview: Overview
    def __init__(self, overview: _Optional[_Union[Overview, _Mapping]] = ...) -> None: ...

class Overview(_message.Message):
    __slots__ = ("queued", "pending", "running", "succeeded_in_window", "failed_in_window", "canceled_in_window", "users_waiting", "oldest_queued_create_time", "releases_retrying", "runs_reconciling", "admits_per_minute", "window_minutes", "read_time")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_IN_WINDOW_FIELD_NUMBER: _ClassVar[int]
    FAILED_IN_WINDOW_FIELD_NUMBER: _ClassVar[int]
    CANCELED_IN_WINDOW_FIELD_NUMBER: _ClassVar[int]
    USERS_WAITING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_QUEUED_CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    RELEASES_RETRYING_FIELD_NUMBER: _ClassVar[int]
    RUNS_RECONCILING_FIELD_NUMBER: _ClassVar[int]
    ADMITS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MINUTES_FIELD_NUMBER: _ClassVar[int]
    READ_TIME_FIELD_NUMBER: _ClassVar[int]
    queued: int
    pending: int
    running: int
    succeeded_in_window: int
    failed_in_window: int
    canceled_in_window: int
    users_waiting: int
    oldest_queued_create_time: _timestamp_pb2.Timestamp
    releases_retrying: int
    runs_reconciling: int
    admits_per_minute: _containers.RepeatedScalarFieldContainer[int]
    window_minutes: int
    read_time: _timestamp_pb2.Timestamp
    def __init__(self, queued: _Optional[int] = ..., pending: _Optional[int] = ..., running: _Optional[int] = ..., succeeded_in_window: _Optional[int] = ..., failed_in_window: _Optional[int] = ..., canceled_in_window: _Optional[int] = ..., users_waiting: _Optional[int] = ..., oldest_queued_create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., releases_retrying: _Optional[int] = ..., runs_reconciling: _Optional[int] = ..., admits_per_minute: _Optional[_Iterable[int]] = ..., window_minutes: _Optional[int] = ..., read_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SearchJobsRequest(_message.Message):
    __slots__ = ("filter", "page_size", "page_token")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: JobFilter
    page_size: int
    page_token: str
    def __init__(self, filter: _Optional[_Union[JobFilter, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class SearchJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_job_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_job_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchOverviewRequest(_message.Message):
    __slots__ = ("window_minutes", "interval_ms")
    WINDOW_MINUTES_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    window_minutes: int
    interval_ms: int
    def __init__(self, window_minutes: _Optional[int] = ..., interval_ms: _Optional[int] = ...) -> None: ...

class WatchOverviewResponse(_message.Message):
    __slots__ = ("overview",)
    OVERVIEW_FIELD_NUMBER: _ClassVar[int]
    overview: Overview
    def __init__(self, overview: _Optional[_Union[Overview, _Mapping]] = ...) -> None: ...

class CancelJobsRequest(_message.Message):
    __slots__ = ("filter", "dry_run", "max_jobs")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_JOBS_FIELD_NUMBER: _ClassVar[int]
    filter: JobFilter
    dry_run: bool
    max_jobs: int
    def __init__(self, filter: _Optional[_Union[JobFilter, _Mapping]] = ..., dry_run: _Optional[bool] = ..., max_jobs: _Optional[int] = ...) -> None: ...

class CancelJobsResponse(_message.Message):
    __slots__ = ("matched", "more_than_counted", "canceled", "failures")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    MORE_THAN_COUNTED_FIELD_NUMBER: _ClassVar[int]
    CANCELED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    matched: int
    more_than_counted: bool
    canceled: int
    failures: _containers.RepeatedCompositeFieldContainer[CancelFailure]
    def __init__(self, matched: _Optional[int] = ..., more_than_counted: _Optional[bool] = ..., canceled: _Optional[int] = ..., failures: _Optional[_Iterable[_Union[CancelFailure, _Mapping]]] = ...) -> None: ...

class CancelFailure(_message.Message):
    __slots__ = ("job_id", "reason", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    message: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ListLedgerEntriesRequest(_message.Message):
    __slots__ = ("user_id", "job_id", "page_size", "page_token")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    job_id: str
    page_size: int
    page_token: str
    def __init__(self, user_id: _Optional[str] = ..., job_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLedgerEntriesResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[LedgerEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[LedgerEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class LedgerEntry(_message.Message):
    __slots__ = ("entry_id", "create_time", "user_id", "kind", "amount", "job_id", "idempotency_key", "actor", "reason")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    create_time: _timestamp_pb2.Timestamp
    user_id: str
    kind: LedgerEntryKind
    amount: int
    job_id: str
    idempotency_key: str
    actor: str
    reason: str
    def __init__(self, entry_id: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., user_id: _Optional[str] = ..., kind: _Optional[_Union[LedgerEntryKind, str]] = ..., amount: _Optional[int] = ..., job_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
