from queue_service._gen.acurio.queue.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_OUTCOME_UNSPECIFIED: _ClassVar[RunOutcome]
    RUN_OUTCOME_SUCCEEDED: _ClassVar[RunOutcome]
    RUN_OUTCOME_FAILED: _ClassVar[RunOutcome]
RUN_OUTCOME_UNSPECIFIED: RunOutcome
RUN_OUTCOME_SUCCEEDED: RunOutcome
RUN_OUTCOME_FAILED: RunOutcome

class CompleteRunRequest(_message.Message):
    __slots__ = ("run_id", "outcome", "refund_credit", "message")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REFUND_CREDIT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    outcome: RunOutcome
    refund_credit: bool
    message: str
    def __init__(self, run_id: _Optional[str] = ..., outcome: _Optional[_Union[RunOutcome, str]] = ..., refund_credit: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class CompleteRunResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _job_pb2.Job
    def __init__(self, job: _Optional[_Union[_job_pb2.Job, _Mapping]] = ...) -> None: ...
