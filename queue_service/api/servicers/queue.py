"""AnalysisQueueService: the web backend's calls (admit, list, watch, cancel) and tooling's.

Servicers only adapt: validate, call the engine or the job reads, build the response. They raise
domain errors; the interceptor turns them into statuses. When a caller gives up, gRPC cancels the
handler and psycopg cancels its running statement, so the database work stops too.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc
from opentelemetry import trace

from queue_service import audit, errors, telemetry
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2_grpc as queue_grpc
from queue_service.api.servicers import page_tokens, validation
from queue_service.api.servicers.convert import job_to_proto, status_filter
from queue_service.engine import (
    Admission,
    JobReads,
    NotificationHub,
    QueueEngine,
    Releases,
    VanishedJob,
    WatchItem,
    WatchPage,
    WatchStream,
    request_digest,
)
from queue_service.model import AdmitRequest, Cause, JobStatus, JobView


def admit_request_digest(request: queue_pb2.AdmitRequest) -> bytes:
    """The digest an idempotency key's job is checked against: the request without its key."""
    payload = queue_pb2.AdmitRequest()
    payload.CopyFrom(request)
    payload.ClearField("idempotency_key")
    return request_digest(payload.SerializeToString(deterministic=True))


class AnalysisQueueServicer(queue_grpc.AnalysisQueueServiceServicer):
    def __init__(
        self, engine: QueueEngine, admission: Admission, releases: Releases, reads: JobReads, hub: NotificationHub, draining: asyncio.Event
    ) -> None:
        self._engine = engine
        self._admission = admission
        self._releases = releases
        self._reads = reads
        self._hub = hub
        self._draining = draining

    async def _job(self, job_id: str) -> job_pb2.Job:
        """The job's view after a change this call made; it exists (jobs are never deleted)."""
        view = await self._reads.one(validation.validate_job_id(job_id))
        if view is None:
            raise errors.Internal(f"job {job_id} vanished after this call changed it", metadata={"jobId": job_id})
        return job_to_proto(view)

    async def Admit(
        self, request: queue_pb2.AdmitRequest, context: grpc.aio.ServicerContext[queue_pb2.AdmitRequest, queue_pb2.AdmitResponse]
    ) -> queue_pb2.AdmitResponse:
        with telemetry.tracer.start_as_current_span("admit") as span:
            try:
                view = await self._admit(request, span)
            except errors.QueueError as error:
                span.set_attribute("queue.admit.reason", error.reason)
                telemetry.metrics.admits.add(1, {"outcome": "rejected", "reason": error.reason})
                raise
            outcome = "queued" if view.status is JobStatus.QUEUED else "started"
            telemetry.metrics.admits.add(1, {"outcome": outcome, "reason": "OK"})
            return queue_pb2.AdmitResponse(job=job_to_proto(view))

    async def _admit(self, request: queue_pb2.AdmitRequest, span: trace.Span) -> JobView:
        delta_of = validation.validate_admit(request)
        span.set_attribute("queue.user_id", request.user_id)
        result = await self._admission.admit(
            AdmitRequest(
                user_id=request.user_id,
                idempotency_key=request.idempotency_key,
                document_uri=request.document.uri,
                document_title=request.document.title,
                sources=tuple((s.doi, s.citation) for s in request.sources),
                delta_of_job_id=delta_of,
                request_digest=admit_request_digest(request),
            )
        )
        if result.view is not None:
            view = await self._reads.estimated_after_commit(result.view)
        else:
            found = await self._reads.one(result.job_id)
            if found is None:
                raise errors.Internal(f"the admitted job {result.job_id} vanished", metadata={"jobId": str(result.job_id)})
            view = found
        if span.is_recording():  # the attributes' texts are made only for a span that keeps them
            span.set_attribute("queue.job_id", str(view.job_id))
            span.set_attribute("queue.admit.decision", str(view.status))
            span.set_attribute("queue.admit.duplicate", result.duplicate)
            span.set_attribute("queue.position", view.queue_position)
        return view

    async def Promote(
        self, request: queue_pb2.PromoteRequest, context: grpc.aio.ServicerContext[queue_pb2.PromoteRequest, queue_pb2.PromoteResponse]
    ) -> queue_pb2.PromoteResponse:
        validation.validate_user_id(request.user_id)
        promoted = await self._engine.promote(request.user_id, cause=Cause.TOOLING)
        # The operator's tooling leaves an entry in the audit timeline (OperatorService.ListAuditEvents).
        if not promoted:
            await self._engine.record_operator_action("promote", user_id=request.user_id, job_id=None, outcome="nothing to promote")
            return queue_pb2.PromoteResponse()
        job = await self._job(str(promoted[0].job_id))
        outcome = f"promoted {len(promoted)} job{'s' if len(promoted) > 1 else ''}"
        await self._engine.record_operator_action("promote", user_id=request.user_id, job_id=promoted[0].job_id, outcome=outcome)
        return queue_pb2.PromoteResponse(job=job)

    async def Release(
        self, request: queue_pb2.ReleaseRequest, context: grpc.aio.ServicerContext[queue_pb2.ReleaseRequest, queue_pb2.ReleaseResponse]
    ) -> queue_pb2.ReleaseResponse:
        job_id = validation.validate_job_id(request.job_id)
        await self._releases.release_now(job_id)
        job = await self._job(str(job_id))
        status = job_pb2.JobStatus.Name(job.status).removeprefix("JOB_STATUS_").lower()
        await self._engine.record_operator_action("release", user_id=job.user_id, job_id=job_id, outcome=status)
        return queue_pb2.ReleaseResponse(job=job)

    async def ListJobs(
        self, request: queue_pb2.ListJobsRequest, context: grpc.aio.ServicerContext[queue_pb2.ListJobsRequest, queue_pb2.ListJobsResponse]
    ) -> queue_pb2.ListJobsResponse:
        validation.validate_user_id(request.user_id)
        page_size = validation.validate_page_size(request.page_size)
        statuses = status_filter(request.statuses)
        key = page_tokens.list_filter_key(request.user_id, statuses)
        after_job_id, before_seq = page_tokens.decode_list_token(request.page_token, key)
        views = await self._reads.page_of_user(
            request.user_id, after_job_id=after_job_id, before_seq=before_seq, statuses=statuses, limit=page_size + 1
        )
        page, more = views[:page_size], len(views) > page_size
        token = page_tokens.encode_list_token(page[-1].job_id, key) if more else ""
        return queue_pb2.ListJobsResponse(jobs=[job_to_proto(view) for view in page], next_page_token=token)

    async def GetJob(
        self, request: queue_pb2.GetJobRequest, context: grpc.aio.ServicerContext[queue_pb2.GetJobRequest, queue_pb2.GetJobResponse]
    ) -> queue_pb2.GetJobResponse:
        v = validation.Violations()
        job_id = v.check_uuid("job_id", request.job_id)
        if request.user_id:  # optional: scopes the read to one user, as CancelJob's does
            v.check_id("user_id", request.user_id)
        v.raise_if_any()
        assert job_id is not None
        view = await self._reads.one(job_id)
        if view is None or (request.user_id and view.user_id != request.user_id):
            raise errors.JobNotFound(f"job {job_id} does not exist", metadata={"jobId": str(job_id)})
        return queue_pb2.GetJobResponse(job=job_to_proto(view))

    async def CancelJob(
        self,
        request: queue_pb2.CancelJobRequest,
        context: grpc.aio.ServicerContext[queue_pb2.CancelJobRequest, queue_pb2.CancelJobResponse],
    ) -> queue_pb2.CancelJobResponse:
        v = validation.Violations()
        job_id = v.check_uuid("job_id", request.job_id)
        v.check_id("user_id", request.user_id)
        v.raise_if_any()
        assert job_id is not None
        await self._engine.cancel(job_id, request.user_id)
        return queue_pb2.CancelJobResponse(job=await self._job(str(job_id)))

    async def WatchJobs(
        self,
        request: queue_pb2.WatchJobsRequest,
        context: grpc.aio.ServicerContext[queue_pb2.WatchJobsRequest, queue_pb2.WatchJobsResponse],
    ) -> AsyncIterator[queue_pb2.WatchJobsResponse]:
        validation.validate_user_id(request.user_id)
        if self._draining.is_set():
            raise errors.ShuttingDown("this replica is draining; reconnect to another")
        caller = audit.current_caller() or audit.ANONYMOUS
        stream = self._hub.subscribe(request.user_id, caller=caller)
        drain = asyncio.ensure_future(self._draining.wait())
        getter: asyncio.Future[WatchItem | VanishedJob | None] | None = None
        try:
            async for message in self._catch_up(stream, resync=False):
                yield message
            while True:
                getter = asyncio.ensure_future(stream.next())
                done, _ = await asyncio.wait({getter, drain}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    raise errors.ShuttingDown("this replica is draining; reconnect to another")
                item = getter.result()
                if item is None:
                    async for message in self._catch_up(stream, resync=True):
                        yield message
                elif isinstance(item, VanishedJob):
                    stream.saw_vanish(item)
                    yield _vanished_message(item.job_id, item.user_id)
                else:
                    stream.saw(item)
                    yield _change_message(item)
        finally:
            # A caller who hangs up cancels this generator mid-wait: no task may outlive it.
            for pending in (drain, getter):
                if pending is not None and not pending.done():
                    pending.cancel()
            self._hub.unsubscribe(stream)

    async def _catch_up(self, stream: WatchStream, *, resync: bool) -> AsyncIterator[queue_pb2.WatchJobsResponse]:
        """The snapshot or resync as messages, the last one marked as its end. Read a page at a
        time and converted a message at a time: gRPC takes the next message only once the
        client's HTTP/2 window has room, so a stalled client holds one page here."""
        async with contextlib.aclosing(self._hub.catch_up(stream, resync=resync)) as pages:
            async for page in pages:
                count = len(page.items) + len(page.vanished)
                for index, message in enumerate(_page_messages(page, stream.user_id)):
                    if page.last and index == count - 1:
                        _mark_end(message, resync=resync)
                    yield message
                if page.last and not count:
                    message = queue_pb2.WatchJobsResponse()
                    _mark_end(message, resync=resync)
                    yield message


def _change_message(item: WatchItem) -> queue_pb2.WatchJobsResponse:
    """The message of a change, made once for all the streams it is offered to (never mutated
    after: each stream's write serializes the same message)."""
    message = item.rendered.get("watch_message")
    if message is None:
        message = item.rendered["watch_message"] = queue_pb2.WatchJobsResponse(job=job_to_proto(item.job))
    return message


def _page_messages(page: WatchPage, user_id: str) -> Iterator[queue_pb2.WatchJobsResponse]:
    """A page's jobs, one message each, then the jobs it found vanished (a failover lost them)."""
    for item in page.items:
        yield queue_pb2.WatchJobsResponse(job=job_to_proto(item.job))
    for job_id in page.vanished:
        yield _vanished_message(job_id, user_id)


def _vanished_message(job_id: uuid.UUID, user_id: str) -> queue_pb2.WatchJobsResponse:
    """The last message for a job that no longer exists: only its ids, and `vanished`."""
    return queue_pb2.WatchJobsResponse(job=job_pb2.Job(job_id=str(job_id), user_id=user_id), vanished=True)


def _mark_end(message: queue_pb2.WatchJobsResponse, *, resync: bool) -> None:
    if resync:
        message.resync_complete = True
    else:
        message.snapshot_complete = True
