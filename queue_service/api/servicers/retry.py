"""OperatorService.RetryJob and RetryJobs: a FAILED or CANCELED job admitted again, as its user,
through the admission (the same checks and charge as AnalysisQueueService.Admit).

One retry per ended job unless the operator asks for another. A plain retry's idempotency key is
derived from the ended job alone (`retry:<job>`), so every plain retry of one job, however many
clicks, operators or concurrent calls, is one admit: the existing idempotency answers the job
the first one admitted, charged once, race-safe. A plain retry of a job that was retried in any
way already (a further retry, or a retry of an earlier version keyed by its click) answers the
newest retry, `admitted_now` false. A further retry (`another_retry`) is keyed by the ended job
and the caller's retry key, so repeating it with the same key finds the job it admitted.

Every retry's key begins `retry:<ended job id>` (`model.retry_idempotency_key`), and the admit
carries the lineage itself: the new job's `retry_of_job_id` is the ended job, written by the
admit's INSERT (functions/queue_admit_job_v2.sql); an adoption after a failover reads it back from
the key the core kept (`model.retried_job_id`). The job view lists a job's retries
(`retried_as_job_ids`). The charge's ledger entry records the operator as its actor
(`audit`: the call's caller), and one log line ties the new job to the one it retries.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence

from queue_service import audit, errors, telemetry
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.api.servicers import validation
from queue_service.engine import Admission, JobReads, each_at_most, request_digest
from queue_service.model import AdmitRequest, JobInputs, JobStatus, JobView, retry_idempotency_key

log = logging.getLogger(__name__)

RETRYABLE = frozenset({JobStatus.FAILED, JobStatus.CANCELED})
# A bulk retry retries at most this many jobs per call, this many at once (each is an admit,
# with its CreateRun at the core).
MAX_BULK_RETRY = validation.MAX_BULK_JOB_IDS
_BULK_RETRY_CONCURRENCY = 8


def _admit_request(inputs: JobInputs, sources: tuple[tuple[str, str], ...]) -> queue_pb2.AdmitRequest:
    """The admit the job was made by, as Admit's digest sees it (without its key)."""
    return queue_pb2.AdmitRequest(
        user_id=inputs.user_id,
        document=job_pb2.Document(uri=inputs.document_uri, title=inputs.document_title),
        sources=[job_pb2.Source(doi=doi, citation=citation) for doi, citation in sources],
        delta_of_job_id=str(inputs.delta_of_job_id) if inputs.delta_of_job_id else "",
    )


async def retry_job(
    admission: Admission, reads: JobReads, job_id: uuid.UUID, *, another_retry: bool = False, retry_key: str = ""
) -> tuple[JobView, bool]:
    """Admits the job again (a further time only with `another_retry`, keyed by `retry_key`); the
    new job's view (or the retry admitted before) and whether this call admitted it."""
    with telemetry.tracer.start_as_current_span("retry_job") as span:
        span.set_attribute("queue.retry_of_job_id", str(job_id))
        span.set_attribute("queue.retry.another", another_retry)
        try:
            view, admitted = await _retry(admission, reads, job_id, retry_key if another_retry else "")
        except errors.QueueError as error:
            span.set_attribute("queue.retry.reason", error.reason)
            telemetry.metrics.retries.add(1, {"outcome": "rejected", "reason": error.reason})
            raise
        span.set_attribute("queue.job_id", str(view.job_id))
        span.set_attribute("queue.retry.admitted_now", admitted)
        telemetry.metrics.retries.add(1, {"outcome": "admitted" if admitted else "repeated", "reason": "OK"})
        return view, admitted


async def _retry(admission: Admission, reads: JobReads, job_id: uuid.UUID, retry_key: str) -> tuple[JobView, bool]:
    inputs = await reads.inputs(job_id)
    if inputs is None:
        raise _not_found(job_id)
    metadata = {"jobId": str(job_id), "status": inputs.status.upper()}
    if inputs.status not in RETRYABLE:
        raise errors.JobNotRetryable(f"job {job_id} is {inputs.status}; only a failed or canceled job can be retried", metadata=metadata)
    if not retry_key and inputs.newest_retry_job_id is not None:
        # Retried already: one retry per job unless another is asked for explicitly.
        return await _estimated_view(reads, inputs.newest_retry_job_id), False
    if inputs.sources is None and inputs.sources_pruned:
        raise errors.JobInputsPruned(
            f"job {job_id} ended longer ago than its sources are kept (QUEUE_JOB_INPUTS_RETENTION_SECONDS); admit it again from the web app",
            metadata=metadata,
        )
    if inputs.sources is None:
        raise errors.JobNotRetryable(
            f"job {job_id} was admitted before the queue stored its document and sources; admit it again from the web app",
            metadata=metadata,
        )
    request = _admit_request(inputs, inputs.sources)
    result = await admission.admit(
        AdmitRequest(
            user_id=inputs.user_id,
            idempotency_key=retry_idempotency_key(job_id, retry_key),
            document_uri=inputs.document_uri,
            document_title=inputs.document_title,
            sources=inputs.sources,
            delta_of_job_id=inputs.delta_of_job_id,
            request_digest=request_digest(request.SerializeToString(deterministic=True)),
            # The operator's remedy after an incident: never refused by the user's free-work limit.
            operator_retry=True,
            retry_of_job_id=job_id,
        )
    )
    view = await _estimated_view(reads, result.job_id, result.view)
    log.info(
        "job retried",
        extra={
            "job_id": view.job_id,
            "retry_of_job_id": job_id,
            "user_id": inputs.user_id,
            "actor": audit.actor_for("retry"),
            "duplicate": result.duplicate,
        },
    )
    return view, not result.duplicate


async def _estimated_view(reads: JobReads, job_id: uuid.UUID, view: JobView | None = None) -> JobView:
    """The retry's view (read when not given), with its start estimate."""
    view = view if view is not None else await reads.one(job_id)
    if view is None:
        raise errors.Internal(f"the retried job {job_id} vanished", metadata={"jobId": str(job_id)})
    return (await reads.estimated([view]))[0]


@dataclasses.dataclass(frozen=True)
class BulkRetryChoice:
    """The jobs a bulk retry chose, sorted: the ones it retries (oldest admitted first), the ones
    retried already (skipped: one retry per job), and the ones it cannot retry, with why."""

    to_retry: tuple[JobView, ...]
    already_retried: tuple[uuid.UUID, ...]
    refused: tuple[tuple[uuid.UUID, errors.QueueError], ...]


def choose_for_bulk_retry(views: Sequence[JobView], missing: Sequence[uuid.UUID] = ()) -> BulkRetryChoice:
    """Sorts the chosen jobs' views (and the ids that named no job) as a plain retry of each would."""
    to_retry, already, refused = [], [], [(job_id, _not_found(job_id)) for job_id in missing]
    for view in views:
        if view.status not in RETRYABLE:
            refused.append(
                (
                    view.job_id,
                    errors.JobNotRetryable(
                        f"job {view.job_id} is {view.status}; only a failed or canceled job can be retried",
                        metadata={"jobId": str(view.job_id), "status": view.status.upper()},
                    ),
                )
            )
        elif view.retried_as_job_ids:
            already.append(view.job_id)
        else:
            to_retry.append(view)
    to_retry.sort(key=lambda view: (view.create_time, view.job_id))
    return BulkRetryChoice(tuple(to_retry), tuple(already), tuple(refused))


async def retry_each(
    admission: Admission, reads: JobReads, views: Sequence[JobView]
) -> list[tuple[uuid.UUID, tuple[JobView, bool] | errors.QueueError]]:
    """A plain retry of each job, a few at once: per job, its retry and whether this call admitted
    it (False: retried meanwhile by someone else), or the refusal."""
    with telemetry.tracer.start_as_current_span("retry_jobs") as span:
        span.set_attribute("queue.retry.jobs", len(views))
        outcomes = await each_at_most(_BULK_RETRY_CONCURRENCY, views, lambda view: retry_job(admission, reads, view.job_id))
    return [(view.job_id, outcome) for view, outcome in zip(views, outcomes, strict=True)]


def _not_found(job_id: uuid.UUID) -> errors.QueueError:
    return errors.JobNotFound(f"job {job_id} does not exist", metadata={"jobId": str(job_id)})
