"""OperatorService.RetryJob: a FAILED or CANCELED job admitted again, as its user, through the
admission (the same checks and charge as AnalysisQueueService.Admit).

The new job's idempotency key is derived from the ended job and the caller's retry key, so a
retry repeated with the same retry key (a lost answer, a double click) finds the job the first
one admitted instead of admitting twice. The charge's ledger entry records the operator as its
actor (`audit`: the call's caller), and one log line ties the new job to the one it retries.
"""

from __future__ import annotations

import hashlib
import logging
import uuid

from queue_service import audit, errors, telemetry
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.api.servicers import validation
from queue_service.engine import Admission, JobReads, request_digest
from queue_service.model import AdmitRequest, JobInputs, JobStatus, JobView

log = logging.getLogger(__name__)

RETRYABLE = frozenset({JobStatus.FAILED, JobStatus.CANCELED})
# Marks the keys retries admit with; Admit refuses keys with this prefix, so no caller's key is
# ever a retry's.
RETRY_KEY_PREFIX = validation.RETRY_KEY_PREFIX


def retry_idempotency_key(job_id: uuid.UUID, retry_key: str) -> str:
    """The new job's key: the same for the same job and retry key, and at most 75 characters
    (within the 128 an idempotency key may have), whatever the retry key's length."""
    digest = hashlib.sha256(f"{job_id}\x00{retry_key}".encode()).hexdigest()[:32]
    return f"{RETRY_KEY_PREFIX}{job_id}:{digest}"


def _admit_request(inputs: JobInputs, sources: tuple[tuple[str, str], ...]) -> queue_pb2.AdmitRequest:
    """The admit the job was made by, as Admit's digest sees it (without its key)."""
    return queue_pb2.AdmitRequest(
        user_id=inputs.user_id,
        document=job_pb2.Document(uri=inputs.document_uri, title=inputs.document_title),
        sources=[job_pb2.Source(doi=doi, citation=citation) for doi, citation in sources],
        delta_of_job_id=str(inputs.delta_of_job_id) if inputs.delta_of_job_id else "",
    )


async def retry_job(admission: Admission, reads: JobReads, job_id: uuid.UUID, retry_key: str) -> tuple[JobView, bool]:
    """Admits the job again; the new job's view and whether this call admitted it."""
    with telemetry.tracer.start_as_current_span("retry_job") as span:
        span.set_attribute("queue.retry_of_job_id", str(job_id))
        try:
            view, admitted = await _retry(admission, reads, job_id, retry_key)
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
        raise errors.JobNotFound(f"job {job_id} does not exist", metadata={"jobId": str(job_id)})
    metadata = {"jobId": str(job_id), "status": inputs.status.upper()}
    if inputs.status not in RETRYABLE:
        raise errors.JobNotRetryable(f"job {job_id} is {inputs.status}; only a failed or canceled job can be retried", metadata=metadata)
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
        )
    )
    view = result.view if result.view is not None else await reads.one(result.job_id)
    if view is None:
        raise errors.Internal(f"the retried job {result.job_id} vanished", metadata={"jobId": str(result.job_id)})
    view = (await reads.estimated([view]))[0]
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
