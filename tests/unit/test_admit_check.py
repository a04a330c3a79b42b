"""The admit's pre-check (`Admission._check_admit_state`) and the cancel's answer for an ended
job, decided on state already read: no database, no core. The state is the `AdmitState` the
store's pre-check read hands over; the collaborators that would do I/O are stand-ins that fail
on any use, so a decision that reached for the database would fail here."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, cast

import pytest

from queue_service import errors
from queue_service.config import Config
from queue_service.engine.admission import Admission, AdmissionSettings
from queue_service.engine.engine import _already_finished
from queue_service.engine.parts import SharedParts
from queue_service.model import AdmitRequest, AdmitResult, AdmitState, JobStatus, Transition

USER = "alice"
KEY_DIGEST = b"digest-of-this-request"


class Unreachable:
    """A collaborator the decision must not touch."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the pre-check used {name!r} of the store, the core or recovery")


def admission(**settings: Any) -> Admission:
    config = Config.from_env({}, **settings)
    unreachable = cast(Any, Unreachable())
    parts = SharedParts(
        store=unreachable,
        core=unreachable,
        tasks=unreachable,
        capacity=unreachable,
        starter=unreachable,
        owed_releases=unreachable,
        wake_dispatcher=unreachable,
    )
    return Admission(unreachable, parts, AdmissionSettings.from_config(config))


def state(**fields: Any) -> AdmitState:
    """A user with room, credit and no earlier job under the key; `fields` change that."""
    values: dict[str, Any] = {
        "existing_job_id": None,
        "existing_digest": None,
        "queued_count": 0,
        "running_deltas": 0,
        "balance": 10,
        "base_user_id": None,
        "base_status": None,
        "base_run_id": None,
    }
    return AdmitState(**(values | fields))


def request(*, delta_of: uuid.UUID | None = None) -> AdmitRequest:
    return AdmitRequest(
        user_id=USER,
        idempotency_key="click-1",
        document_uri="s3://papers/thesis.pdf",
        sources=(("doi", "10.1000/1"),),
        delta_of_job_id=delta_of,
        request_digest=KEY_DIGEST,
    )


def check(state: AdmitState, *, price: int = 1, delta_of: uuid.UUID | None = None, **settings: Any) -> AdmitResult | None:
    return admission(**settings)._check_admit_state(state, request(delta_of=delta_of), price, delta_of is not None)


def test_a_user_with_room_and_credit_passes() -> None:
    assert check(state()) is None


def test_a_repeated_key_with_the_same_request_answers_the_earlier_job() -> None:
    earlier = uuid.uuid4()
    # Whatever else the state shows: the earlier answer stands, no limit applies to a repeat.
    result = check(state(existing_job_id=earlier, existing_digest=KEY_DIGEST, queued_count=10**6, balance=0))
    assert result == AdmitResult(earlier, duplicate=True)


def test_a_repeated_key_with_another_request_is_refused_naming_the_earlier_job() -> None:
    earlier = uuid.uuid4()
    with pytest.raises(errors.IdempotencyKeyReused) as refused:
        check(state(existing_job_id=earlier, existing_digest=b"another request"))
    assert refused.value.metadata == {"jobId": str(earlier)}


def test_a_full_queue_is_refused_with_its_limit() -> None:
    with pytest.raises(errors.UserQueueFull) as refused:
        check(state(queued_count=3), max_queued_per_user=3)
    assert refused.value.metadata == {"maxQueued": "3", "queued": "3"}
    assert check(state(queued_count=2), max_queued_per_user=3) is None


def test_credit_short_of_the_price_is_refused_with_balance_and_price() -> None:
    with pytest.raises(errors.InsufficientCredits) as refused:
        check(state(balance=1), price=2)
    assert refused.value.metadata == {"balance": "1", "required": "2"}
    assert check(state(balance=2), price=2) is None
    assert check(state(balance=0), price=0) is None


def test_free_work_at_its_limit_is_refused_with_when_to_retry() -> None:
    with pytest.raises(errors.UserFreeWorkLimit) as refused:
        check(state(free_admits_last_hour=5, free_admit_frees_in_seconds=42.4), max_free_admits_per_user_per_hour=5)
    assert refused.value.metadata == {"maxFreeAdmitsPerHour": "5", "retryAfterSeconds": "42"}
    assert refused.value.retry_delay_seconds == 42.4
    assert check(state(free_admits_last_hour=4), max_free_admits_per_user_per_hour=5) is None


def test_free_work_retry_is_at_least_a_second() -> None:
    with pytest.raises(errors.UserFreeWorkLimit) as refused:
        check(state(free_admits_last_hour=5, free_admit_frees_in_seconds=None), max_free_admits_per_user_per_hour=5)
    assert refused.value.retry_delay_seconds == 1.0


def test_an_operators_retry_is_never_refused_by_the_free_work_limit() -> None:
    retry = dataclasses.replace(request(), operator_retry=True)
    at_limit = state(free_admits_last_hour=5, free_admit_frees_in_seconds=42.4)
    assert admission(max_free_admits_per_user_per_hour=5)._check_admit_state(at_limit, retry, 1, False) is None
    # Its other limits still hold.
    with pytest.raises(errors.InsufficientCredits):
        admission(max_free_admits_per_user_per_hour=5)._check_admit_state(dataclasses.replace(at_limit, balance=0), retry, 1, False)


def test_free_work_is_checked_before_the_queue_and_the_credit() -> None:
    with pytest.raises(errors.UserFreeWorkLimit):
        check(state(free_admits_last_hour=5, queued_count=3, balance=0), max_free_admits_per_user_per_hour=5, max_queued_per_user=3)


def test_a_delta_needs_a_base_of_this_user() -> None:
    base = uuid.uuid4()
    for missing in (state(), state(base_user_id="mallory", base_status=JobStatus.SUCCEEDED)):
        with pytest.raises(errors.DeltaBaseNotFound) as refused:
            check(missing, delta_of=base)
        assert refused.value.metadata == {"deltaOfJobId": str(base)}


@pytest.mark.parametrize("status", [s for s in JobStatus if s is not JobStatus.SUCCEEDED])
def test_a_delta_needs_a_succeeded_base(status: JobStatus) -> None:
    base = uuid.uuid4()
    with pytest.raises(errors.DeltaBaseNotFinished) as refused:
        check(state(base_user_id=USER, base_status=status), delta_of=base)
    assert refused.value.metadata == {"deltaOfJobId": str(base), "baseStatus": status.upper()}


def test_a_delta_counts_against_the_delta_limit_not_the_queue() -> None:
    base = uuid.uuid4()
    ready = {"base_user_id": USER, "base_status": JobStatus.SUCCEEDED}
    with pytest.raises(errors.UserDeltaLimit) as refused:
        check(state(running_deltas=2, **ready), delta_of=base, max_active_deltas_per_user=2)
    assert refused.value.metadata == {"maxActiveDeltas": "2", "activeDeltas": "2"}
    # A full first-pass queue does not stop a re-check.
    assert (
        check(state(running_deltas=1, queued_count=3, **ready), delta_of=base, max_active_deltas_per_user=2, max_queued_per_user=3) is None
    )


def test_a_delta_pays_its_own_price() -> None:
    ready = {"base_user_id": USER, "base_status": JobStatus.SUCCEEDED}
    with pytest.raises(errors.InsufficientCredits):
        check(state(balance=0, **ready), delta_of=uuid.uuid4(), price=1)
    assert check(state(balance=0, **ready), delta_of=uuid.uuid4(), price=0) is None


# -- the cancel: what an ended job answers, and how a job waiting for capacity ends -----------------


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.FAILED])
def test_a_cancel_of_an_ended_job_names_its_status(status: JobStatus) -> None:
    job_id = uuid.uuid4()
    answer = _already_finished(job_id, status)
    assert isinstance(answer, errors.JobAlreadyFinished)
    assert answer.metadata == {"jobId": str(job_id), "status": status.upper()}


def test_a_cancel_of_a_job_waiting_for_capacity_ends_it_refunded_and_fenced_without_the_core() -> None:
    transition = Transition.canceled_while_waiting_for_capacity(attempts=4)
    assert transition.from_statuses == frozenset({JobStatus.PENDING})
    assert (transition.to, transition.refund, transition.run_unsettled, transition.expected_attempts) == (
        JobStatus.CANCELED,
        True,
        True,
        4,
    )
