import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_QUEUED: _ClassVar[JobStatus]
    JOB_STATUS_PENDING: _ClassVar[JobStatus]
    JOB_STATUS_RUNNING: _ClassVar[JobStatus]
    JOB_STATUS_SUCCEEDED: _ClassVar[JobStatus]
    JOB_STATUS_FAILED: _ClassVar[JobStatus]
    JOB_STATUS_CANCELED: _ClassVar[JobStatus]
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_QUEUED: JobStatus
JOB_STATUS_PENDING: JobStatus
JOB_STATUS_RUNNING: JobStatus
JOB_STATUS_SUCCEEDED: JobStatus
JOB_STATUS_FAILED: JobStatus
JOB_STATUS_CANCELED: JobStatus

class Document(_message.Message):
    __slots__ = ("uri", "title")
    URI_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    uri: str
    title: str
    def __init__(self, uri: _Optional[str] = ..., title: _Optional[str] = ...) -> None: ...

class Source(_message.Message):
    __slots__ = ("doi", "citation")
    DOI_FIELD_NUMBER: _ClassVar[int]
    CITATION_FIELD_NUMBER: _ClassVar[int]
    doi: str
    citation: str
    def __init__(self, doi: _Optional[str] = ..., citation: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "user_id", "run_id", "status", "queue_position", "delta_of_job_id", "release_attempts", "last_error", "create_time", "promote_time", "start_time", "end_time", "waiting_for_job_id", "estimated_start_time", "price", "refunded")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    DELTA_OF_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_START_TIME_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    REFUNDED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    user_id: str
    run_id: str
    status: JobStatus
    queue_position: int
    delta_of_job_id: str
    release_attempts: int
    last_error: str
    create_time: _timestamp_pb2.Timestamp
    promote_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    waiting_for_job_id: str
    estimated_start_time: _timestamp_pb2.Timestamp
    price: int
    refunded: bool
    def __init__(self, job_id: _Optional[str] = ..., user_id: _Optional[str] = ..., run_id: _Optional[str] = ..., status: _Optional[_Union[JobStatus, str]] = ..., queue_position: _Optional[int] = ..., delta_of_job_id: _Optional[str] = ..., release_attempts: _Optional[int] = ..., last_error: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., promote_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., waiting_for_job_id: _Optional[str] = ..., estimated_start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., price: _Optional[int] = ..., refunded: _Optional[bool] = ...) -> None: ...
