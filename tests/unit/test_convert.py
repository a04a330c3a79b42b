"""Model values to protos and back: the status filter, statuses, job views and the overview."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import pytest
from google.protobuf import timestamp_pb2

from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service.api.servicers import convert
from queue_service.errors import InvalidRequest
from queue_service.model import JobStatus, JobView, Overview

NOW = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)


def view(**changes: Any) -> JobView:
    base = JobView(
        job_id=uuid.uuid4(),
        user_id="ada",
        run_id=uuid.uuid4(),
        status=JobStatus.QUEUED,
        delta_of_job_id=None,
        release_attempts=0,
        last_error="",
        create_time=NOW,
        promote_time=None,
        start_time=None,
        end_time=None,
        price=1,
        refunded=False,
        queue_seq=3,
        queue_position=2,
        waiting_for_job_id=uuid.uuid4(),
        active_since=None,
        max_active_override=None,
        estimated_start_time=NOW + dt.timedelta(minutes=5),
    )
    return dataclasses.replace(base, **changes)


def test_every_status_has_exactly_one_proto_value_and_back() -> None:
    assert set(convert.PROTO_OF_STATUS) == set(JobStatus)
    assert len(set(convert.PROTO_OF_STATUS.values())) == len(JobStatus)
    for status in JobStatus:
        assert convert.STATUS_OF_PROTO[convert.PROTO_OF_STATUS[status]] is status
        assert job_pb2.JobStatus.Name(convert.PROTO_OF_STATUS[status]) == f"JOB_STATUS_{status.name}"


def test_the_status_filter_sorts_and_drops_repeats() -> None:
    chosen = convert.status_filter([job_pb2.JOB_STATUS_RUNNING, job_pb2.JOB_STATUS_QUEUED, job_pb2.JOB_STATUS_RUNNING])
    assert chosen == tuple(sorted({JobStatus.RUNNING, JobStatus.QUEUED}))
    assert convert.status_filter([]) == ()


@pytest.mark.parametrize("value", [job_pb2.JOB_STATUS_UNSPECIFIED, 99, -1])
def test_the_status_filter_names_the_entry_that_is_not_a_status(value: int) -> None:
    with pytest.raises(InvalidRequest) as refused:
        convert.status_filter([job_pb2.JOB_STATUS_QUEUED, value], field="filter.statuses")
    assert refused.value.field_violations[0][0] == "filter.statuses[1]"
    assert refused.value.message == "filter.statuses[1] is not a job status"


def test_the_status_filter_refuses_a_long_list_before_reading_it() -> None:
    assert len(convert.status_filter([job_pb2.JOB_STATUS_QUEUED] * convert.MAX_STATUS_FILTERS)) == 1
    with pytest.raises(InvalidRequest) as refused:
        convert.status_filter([job_pb2.JOB_STATUS_QUEUED] * (convert.MAX_STATUS_FILTERS + 1))
    assert refused.value.metadata == {"maxStatuses": "16"}
    assert refused.value.field_violations == [("statuses", "at most 16 entries")]


def test_a_queued_job_carries_what_it_waits_for_and_its_estimate() -> None:
    queued = view()
    job = convert.job_to_proto(queued)
    assert job.job_id == str(queued.job_id) and job.run_id == str(queued.run_id) and job.user_id == "ada"
    assert job.status == job_pb2.JOB_STATUS_QUEUED and job.queue_position == 2
    assert job.waiting_for_job_id == str(queued.waiting_for_job_id)
    assert job.estimated_start_time.ToDatetime(dt.UTC) == NOW + dt.timedelta(minutes=5)
    assert job.create_time.ToDatetime(dt.UTC) == NOW
    assert job.delta_of_job_id == ""
    for unset in ("promote_time", "start_time", "end_time"):
        assert not job.HasField(unset)


def test_a_job_past_the_queue_carries_no_wait_and_no_estimate_but_its_times() -> None:
    base = uuid.uuid4()
    ended = view(
        status=JobStatus.FAILED,
        delta_of_job_id=base,
        promote_time=NOW + dt.timedelta(seconds=1),
        start_time=NOW + dt.timedelta(seconds=2),
        end_time=NOW + dt.timedelta(seconds=3),
        last_error="the core reported a failure",
        release_attempts=2,
        refunded=True,
    )
    job = convert.job_to_proto(ended)
    assert job.status == job_pb2.JOB_STATUS_FAILED
    assert job.waiting_for_job_id == "" and not job.HasField("estimated_start_time")
    assert job.delta_of_job_id == str(base)
    assert job.end_time.ToDatetime(dt.UTC) == NOW + dt.timedelta(seconds=3)
    assert (job.last_error, job.release_attempts, job.refunded, job.price) == ("the core reported a failure", 2, True, 1)


def test_a_queued_job_without_an_estimate_leaves_the_field_unset() -> None:
    job = convert.job_to_proto(view(estimated_start_time=None, waiting_for_job_id=None))
    assert not job.HasField("estimated_start_time") and job.waiting_for_job_id == ""


def test_the_overview() -> None:
    overview = Overview(
        queued=4,
        pending=1,
        running=2,
        succeeded_in_window=10,
        failed_in_window=1,
        canceled_in_window=3,
        users_waiting=2,
        releases_retrying=1,
        runs_reconciling=0,
        oldest_queued_create_time=NOW,
        read_time=NOW + dt.timedelta(seconds=9),
        admits_per_minute=(1, 0, 5),
        window_minutes=60,
    )
    message = convert.overview_to_proto(overview)
    assert (message.queued, message.pending, message.running, message.canceled_in_window) == (4, 1, 2, 3)
    assert list(message.admits_per_minute) == [1, 0, 5] and message.window_minutes == 60
    assert message.oldest_queued_create_time.ToDatetime(dt.UTC) == NOW
    assert message.read_time.ToDatetime(dt.UTC) == NOW + dt.timedelta(seconds=9)
    empty = convert.overview_to_proto(dataclasses.replace(overview, oldest_queued_create_time=None))
    assert not empty.HasField("oldest_queued_create_time")


@pytest.mark.parametrize(
    "moment",
    [
        dt.datetime(2026, 12, 3, 12, 39, 49, 123456, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 3, 12, 39, 49, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))),
        dt.datetime(2026, 12, 3, 12, 39, 49, 999999),  # naive: read as UTC
        dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=dt.UTC),  # before the epoch
        dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    ],
)
def test_set_timestamp_gives_what_from_datetime_gives(moment: dt.datetime) -> None:
    expected, converted = timestamp_pb2.Timestamp(), timestamp_pb2.Timestamp()
    expected.FromDatetime(moment)
    convert.set_timestamp(converted, moment)
    assert converted == expected
