"""The model: named transitions (from where, to what, refund, slot, fencing), the start estimate, and a
retry's key and the lineage read back from it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import pytest

from queue_service.model import (
    ACTIVE,
    LIVE,
    Cause,
    CoreRun,
    JobStatus,
    JobView,
    RunFate,
    RunReport,
    Transition,
    estimate_start,
    retried_job_id,
    retry_idempotency_key,
)

PENDING = frozenset({JobStatus.PENDING})
RUNNING = frozenset({JobStatus.RUNNING})
QUEUED = frozenset({JobStatus.QUEUED})


def report(fate: RunFate, message: str = "") -> RunReport:
    return RunReport(fate, message)


# -- named transitions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fate", "to", "refund"),
    [
        (RunFate.CANCELED, JobStatus.CANCELED, True),
        (RunFate.FAILED, JobStatus.FAILED, True),
        (RunFate.SUCCEEDED, JobStatus.SUCCEEDED, False),
    ],
)
def test_a_cancel_made_at_a_release_attempt_ends_a_pending_job_as_the_core_answered(fate: RunFate, to: JobStatus, refund: bool) -> None:
    transition = Transition.canceled_instead_of_released(report(fate), attempt=3)
    assert (transition.from_statuses, transition.to, transition.refund) == (PENDING, to, refund)
    assert (transition.cause, transition.expected_attempts, transition.run_unsettled) == (Cause.CANCEL, 3, False)


def test_a_refund_an_ending_did_not_ask_for_is_the_recorded_cancels() -> None:
    assert Transition.completed(succeeded=False, refund=False, message="").refund_cause is Cause.CANCEL
    assert Transition.completed(succeeded=False, refund=True, message="").refund_cause is Cause.COMPLETION
    assert Transition.reconciled(report(RunFate.FAILED)).refund_cause is Cause.RECONCILE


def test_a_completion_ends_an_active_job_as_the_core_says() -> None:
    succeeded = Transition.completed(succeeded=True, refund=False, message="ignored")
    assert succeeded == Transition(Cause.COMPLETION, ACTIVE, JobStatus.SUCCEEDED)
    failed = Transition.completed(succeeded=False, refund=True, message="source unreachable")
    assert failed == Transition(Cause.COMPLETION, ACTIVE, JobStatus.FAILED, "source unreachable", refund=True)
    assert Transition.completed(succeeded=False, refund=False, message="").last_error == "the core reported a failure"


def test_a_cancel_of_a_queued_job_refunds_and_keeps_the_run_to_settle() -> None:
    assert Transition.canceled_while_queued(by="web:web-backend") == Transition(
        Cause.CANCEL, QUEUED, JobStatus.CANCELED, "canceled by the user", refund=True, run_unsettled=True
    )


@pytest.mark.parametrize(
    ("actor", "message"),
    [
        ("web:web-backend", "canceled by the user"),
        ("operator:alice", "canceled by operator alice"),
        ("system:cancel", "canceled by the service"),
        ("anonymous", "canceled by anonymous"),
        ("", "canceled"),
    ],
)
def test_a_canceled_job_names_who_asked(actor: str, message: str) -> None:
    assert Transition.canceled_while_queued(by=actor).last_error == message


@pytest.mark.parametrize("fate", [RunFate.CANCELED, RunFate.UNKNOWN_TO_CORE])
def test_a_cancel_of_an_active_job_the_core_stopped_is_canceled_and_refunded(fate: RunFate) -> None:
    assert Transition.canceled(report(fate, "whatever the core said"), by="web:web-backend") == Transition(
        Cause.CANCEL, ACTIVE, JobStatus.CANCELED, "canceled by the user", refund=True
    )


def test_a_cancel_that_meets_a_finished_run_ends_as_the_run_did() -> None:
    assert Transition.canceled(report(RunFate.SUCCEEDED)).to is JobStatus.SUCCEEDED
    failed = Transition.canceled(report(RunFate.FAILED, "bad pdf"))
    assert failed == Transition(Cause.CANCEL, ACTIVE, JobStatus.FAILED, "bad pdf", refund=True)


def test_giving_up_a_release_fails_refunds_keeps_the_slot_and_is_fenced_to_the_attempt() -> None:
    assert Transition.given_up("release window passed", attempts=7) == Transition(
        Cause.RELEASE_GIVE_UP,
        PENDING,
        JobStatus.FAILED,
        "release window passed",
        refund=True,
        run_unsettled=True,
        expected_attempts=7,
    )


@pytest.mark.parametrize(
    ("fate", "to", "last_error", "refund", "run_unsettled"),
    [
        (RunFate.SUCCEEDED, JobStatus.SUCCEEDED, "", False, False),
        (RunFate.FAILED, JobStatus.FAILED, "bad pdf", True, False),
        (RunFate.CANCELED, JobStatus.CANCELED, "release refused by the core: bad pdf", True, False),
        (RunFate.UNKNOWN_TO_CORE, JobStatus.FAILED, "release refused by the core: bad pdf", True, True),
    ],
)
def test_a_release_answered_with_an_ended_run_is_fenced_to_its_attempt(
    fate: RunFate, to: JobStatus, last_error: str, refund: bool, run_unsettled: bool
) -> None:
    transition = Transition.release_answered(report(fate, "bad pdf"), attempt=3)
    assert transition == Transition(Cause.RELEASE, PENDING, to, last_error, refund, run_unsettled, expected_attempts=3)


# What `_as_reported` makes of every fate, with the core's message and without one.
AS_REPORTED: dict[RunFate, tuple[JobStatus, str, bool, bool] | None] = {
    RunFate.SUCCEEDED: (JobStatus.SUCCEEDED, "", False, False),
    RunFate.FAILED: (JobStatus.FAILED, "the core reported a failure", True, False),
    RunFate.CANCELED: (JobStatus.CANCELED, "the run was canceled at the core", True, False),
    # The core may learn of the run late (its CreateRun still in flight): the slot stays taken.
    RunFate.UNKNOWN_TO_CORE: (JobStatus.FAILED, "the core does not know this run", True, True),
    RunFate.HELD: None,
    RunFate.JUDGING: None,
}


def test_the_table_names_every_fate() -> None:
    assert set(AS_REPORTED) == set(RunFate)


@pytest.mark.parametrize("fate", list(RunFate))
@pytest.mark.parametrize("message", ["", "the core's words"])
def test_a_reconciled_job_ends_as_its_run_is_reported(fate: RunFate, message: str) -> None:
    expected = AS_REPORTED[fate]
    if expected is None:
        assert not fate.settled
        with pytest.raises(ValueError, match=f"a {fate.value} run has not ended"):
            Transition.reconciled(report(fate, message))
        with pytest.raises(ValueError):
            Transition.release_answered(report(fate, message), attempt=1)
        return
    assert fate.settled
    to, default_error, refund, run_unsettled = expected
    last_error = (message or default_error) if to is not JobStatus.SUCCEEDED else ""
    assert Transition.reconciled(report(fate, message)) == Transition(
        Cause.RECONCILE, RUNNING, to, last_error, refund=refund, run_unsettled=run_unsettled
    )


def every_transition() -> list[Transition]:
    settled = [f for f in RunFate if f.settled]
    return [
        Transition.completed(succeeded=True, refund=False, message=""),
        Transition.completed(succeeded=False, refund=True, message=""),
        Transition.canceled_while_queued(),
        *(Transition.canceled(report(f)) for f in settled),
        Transition.given_up("window", attempts=1),
        *(Transition.release_answered(report(f), attempt=1) for f in settled),
        *(Transition.reconciled(report(f)) for f in settled),
    ]


@pytest.mark.parametrize("transition", every_transition(), ids=lambda t: f"{t.cause}-{t.to}")
def test_every_transition_ends_a_live_job_and_a_failure_says_why(transition: Transition) -> None:
    assert transition.from_statuses and transition.from_statuses <= LIVE
    assert not transition.to.is_live
    assert transition.to not in transition.from_statuses
    if transition.to is JobStatus.SUCCEEDED:
        assert transition.last_error == ""
    else:
        assert transition.last_error
    # A refunded ending did not deliver; a success is never refunded by the queue itself.
    if transition.to in (JobStatus.FAILED, JobStatus.CANCELED) and transition.cause is not Cause.COMPLETION:
        assert transition.refund


def test_a_release_outcome_is_fenced_and_no_other_ending_is() -> None:
    fenced = {t.cause for t in every_transition() if t.expected_attempts is not None}
    assert fenced == {Cause.RELEASE, Cause.RELEASE_GIVE_UP}


def test_statuses_by_kind() -> None:
    assert {s for s in JobStatus if s.is_active} == {JobStatus.PENDING, JobStatus.RUNNING}
    assert {s for s in JobStatus if s.is_live} == {JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING}
    assert {s for s in JobStatus if s.is_finished} == {JobStatus.SUCCEEDED, JobStatus.FAILED}
    assert {f for f in RunFate if not f.settled} == {RunFate.HELD, RunFate.JUDGING}


# -- the start estimate -------------------------------------------------------------------------

NOW = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def queued(**changes: Any) -> JobView:
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
        queue_seq=1,
        queue_position=1,
        waiting_for_job_id=None,
        active_since=None,
        max_active_override=None,
    )
    return dataclasses.replace(base, **changes)


def estimate(view: JobView, *, mean_minutes: float | None = 10, slots: int = 1) -> dt.datetime | None:
    mean = None if mean_minutes is None else mean_minutes * 60
    return estimate_start(view, mean_judging_seconds=mean, default_max_active=slots, now=NOW)


def test_no_estimate_without_a_recent_mean_or_for_a_job_past_the_queue() -> None:
    assert estimate(queued(), mean_minutes=None) is None
    for status in JobStatus:
        if status is not JobStatus.QUEUED:
            assert estimate(queued(status=status)) is None


def test_first_in_line_starts_when_the_active_job_is_expected_to_end() -> None:
    assert estimate(queued(active_since=NOW - 4 * MINUTE)) == NOW + 6 * MINUTE


def test_first_in_line_with_nothing_active_or_an_overdue_active_job_starts_now() -> None:
    assert estimate(queued(active_since=None)) == NOW
    assert estimate(queued(active_since=NOW - 60 * MINUTE)) == NOW  # never in the past


def test_each_full_round_of_slots_ahead_adds_one_mean_judging_time() -> None:
    since = NOW - 4 * MINUTE  # the active job ends in 6 minutes
    assert estimate(queued(queue_position=3, active_since=since)) == NOW + 26 * MINUTE
    assert estimate(queued(queue_position=3, active_since=since), slots=2) == NOW + 16 * MINUTE
    assert estimate(queued(queue_position=3, active_since=since, max_active_override=3), slots=1) == NOW + 6 * MINUTE


def test_a_position_or_slot_count_below_one_counts_as_one() -> None:
    assert estimate(queued(queue_position=0, active_since=NOW)) == NOW + 10 * MINUTE
    assert estimate(queued(queue_position=2), slots=0) == NOW + 10 * MINUTE


# -- a retry's key and its lineage ---------------------------------------------------------------


def test_a_retrys_key_names_the_job_it_retries_and_no_other_key_does() -> None:
    job_id = uuid.uuid4()
    plain, further = retry_idempotency_key(job_id), retry_idempotency_key(job_id, "x" * 128)
    assert plain == f"retry:{job_id}" and further.startswith(f"retry:{job_id}:") and len(further) == 75
    assert retried_job_id(plain) == retried_job_id(further) == job_id
    # As the previous version's trigger reads it: the prefix exactly, then a job id as str() writes it.
    for key in ("retry:", "retry:anything", f"Retry:{job_id}", f" retry:{job_id}", f"retry:{str(job_id).upper()}", str(job_id), ""):
        assert retried_job_id(key) is None, key


def test_an_adopted_runs_lineage_is_read_from_the_key_the_core_kept() -> None:
    job_id = uuid.uuid4()
    run = CoreRun(uuid.uuid4(), RunFate.JUDGING, "u", "s3://d", None, uuid.uuid4(), retry_idempotency_key(job_id, "k"), b"d", 1)
    assert run.retry_of_job_id == job_id
    assert dataclasses.replace(run, idempotency_key="a-click").retry_of_job_id is None
