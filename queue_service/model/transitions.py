"""The named ways a job ends (`Transition`): each constructor says from which statuses, to which,
and what the ending does to the credit and the slot.
"""

from __future__ import annotations

import dataclasses

from queue_service.model.jobs import ACTIVE, Cause, JobStatus, RunFate, RunReport

# The `last_error` of a job whose run the core no longer knows (`Transition.forgotten_by_core`).
FORGOTTEN_BY_CORE_MESSAGE = (
    "the core no longer knows this job's run (it restarted without its runs, or let the held run expire):"
    " nothing will judge it, so the job failed and its credits were refunded; admit it again"
)


def cancel_message(actor: str) -> str:
    """A canceled job's `last_error`, naming who asked (an actor as the ledger names it, empty
    when not known here): a user's cancel through the web app is the user's, an operator's names
    the operator, so an operator's cancel never reads as the user's."""
    role, _, name = actor.partition(":")
    if not actor:
        return "canceled"
    if role == "web":
        return "canceled by the user"
    if role == "operator":
        return f"canceled by operator {name}"
    if role == "system":
        return "canceled by the service"
    return f"canceled by {actor}"


@dataclasses.dataclass(frozen=True)
class Transition:
    """A named way for a job to end: from which statuses, to which, and what it does to the
    credit and the slot. Built only by the constructors below, so every ending has a name."""

    cause: Cause
    from_statuses: frozenset[JobStatus]
    to: JobStatus
    last_error: str = ""
    refund: bool = False
    # The core has not confirmed that the run stopped: the job keeps its slot until it does.
    run_unsettled: bool = False
    # Fences a release's outcome to the attempt that claimed it.
    expected_attempts: int | None = None

    @property
    def refund_cause(self) -> Cause:
        """Why a refund this ending made was made: its own (`refund`), or else the user's recorded
        cancel (the store refunds a FAILED ending of a job whose user asked to cancel it)."""
        return self.cause if self.refund else Cause.CANCEL

    @classmethod
    def completed(cls, *, succeeded: bool, refund: bool, message: str) -> Transition:
        """The core's CompleteRun callback for a PENDING or RUNNING job."""
        if succeeded:
            return cls(Cause.COMPLETION, ACTIVE, JobStatus.SUCCEEDED, refund=refund)
        return cls(Cause.COMPLETION, ACTIVE, JobStatus.FAILED, message or "the core reported a failure", refund=refund)

    @classmethod
    def canceled_while_queued(cls, *, by: str = "") -> Transition:
        """A cancel of a QUEUED job (asked for by the actor `by`): refunded at once; its held run is
        canceled afterwards."""
        return cls(Cause.CANCEL, frozenset({JobStatus.QUEUED}), JobStatus.CANCELED, cancel_message(by), refund=True, run_unsettled=True)

    @classmethod
    def canceled_while_waiting_for_capacity(cls, *, attempts: int, by: str = "") -> Transition:
        """A cancel of a PENDING job waiting for the fleet's capacity: its run was never released
        (only a grant releases it, and a grant counts an attempt: `attempts` fences one that came
        meanwhile), so the job ends at once, refunded, without the core; its held run is canceled
        afterwards, durably, and its slot stays taken until the core confirms that."""
        return cls(
            Cause.CANCEL,
            frozenset({JobStatus.PENDING}),
            JobStatus.CANCELED,
            cancel_message(by),
            refund=True,
            run_unsettled=True,
            expected_attempts=attempts,
        )

    @classmethod
    def canceled(cls, report: RunReport, *, by: str = "") -> Transition:
        """A cancel of an active job (asked for by the actor `by`, when known), ended as the core's
        answer to CancelRun says."""
        if report.fate in (RunFate.SUCCEEDED, RunFate.FAILED):
            return cls._as_reported(Cause.CANCEL, ACTIVE, report)
        return cls(Cause.CANCEL, ACTIVE, JobStatus.CANCELED, cancel_message(by), refund=True)

    @classmethod
    def canceled_instead_of_released(cls, report: RunReport, *, attempt: int) -> Transition:
        """A PENDING job whose user asked to cancel it while the core's answer was lost: its next
        release attempt cancels the run instead, and the answer ends the job as `canceled` does."""
        return dataclasses.replace(cls.canceled(report), from_statuses=frozenset({JobStatus.PENDING}), expected_attempts=attempt)

    @classmethod
    def given_up(cls, reason: str, *, attempts: int) -> Transition:
        """A PENDING job whose release did not succeed in its window: failed and refunded. Its run
        may judge after all (a release applied, its answer lost), so the slot stays taken."""
        return cls(
            Cause.RELEASE_GIVE_UP,
            frozenset({JobStatus.PENDING}),
            JobStatus.FAILED,
            reason,
            refund=True,
            run_unsettled=True,
            expected_attempts=attempts,
        )

    @classmethod
    def release_answered(cls, report: RunReport, *, attempt: int) -> Transition:
        """A release met a run that had ended already (or that the core does not know)."""
        transition = cls._as_reported(Cause.RELEASE, frozenset({JobStatus.PENDING}), report)
        if report.fate in (RunFate.CANCELED, RunFate.UNKNOWN_TO_CORE):
            transition = dataclasses.replace(transition, last_error=f"release refused by the core: {report.message}")
        return dataclasses.replace(transition, expected_attempts=attempt)

    @classmethod
    def reconciled(cls, report: RunReport) -> Transition:
        """A RUNNING job whose completion never arrived, ended as the core reports its run."""
        return cls._as_reported(Cause.RECONCILE, frozenset({JobStatus.RUNNING}), report)

    @classmethod
    def forgotten_by_core(cls, status: JobStatus, *, attempts: int) -> Transition:
        """An active job whose run the core no longer knows (it restarted without its runs, or let
        a held run expire): nothing will judge it, so it fails, refunded as a reconciliation is
        (the user did not cause it). `attempts` fences a release claimed meanwhile. Its run is
        canceled afterwards (a CreateRun still on its way then finds it canceled), so its seat
        frees once the core confirms that."""
        return cls(
            Cause.RECONCILE,
            frozenset({status}),
            JobStatus.FAILED,
            FORGOTTEN_BY_CORE_MESSAGE,
            refund=True,
            run_unsettled=True,
            expected_attempts=attempts,
        )

    @classmethod
    def _as_reported(cls, cause: Cause, from_statuses: frozenset[JobStatus], report: RunReport) -> Transition:
        if report.fate is RunFate.SUCCEEDED:
            return cls(cause, from_statuses, JobStatus.SUCCEEDED)
        if report.fate is RunFate.FAILED:
            return cls(cause, from_statuses, JobStatus.FAILED, report.message or "the core reported a failure", refund=True)
        if report.fate is RunFate.CANCELED:
            return cls(cause, from_statuses, JobStatus.CANCELED, report.message or "the run was canceled at the core", refund=True)
        if report.fate is RunFate.UNKNOWN_TO_CORE:
            # The core may learn of the run late (a CreateRun still in flight): not yet settled.
            return cls(
                cause,
                from_statuses,
                JobStatus.FAILED,
                report.message or "the core does not know this run",
                refund=True,
                run_unsettled=True,
            )
        raise ValueError(f"a {report.fate.value} run has not ended")
