"""The gRPC servicers: thin adapters from requests to the engine and views, and back.

Handlers validate, call the domain, and build responses. They raise domain errors only;
`error_interceptor` turns those into statuses. When a caller gives up, gRPC cancels the
handler and psycopg cancels its running statement, so the database work stops too.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import uuid
from collections.abc import AsyncIterator

import grpc
from opentelemetry import trace

from queue_service import deadline, errors, telemetry
from queue_service.store import store as repo
from queue_service.api import validation
from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2 as callback_pb2,
    core_callback_service_pb2_grpc as callback_grpc,
    credits_service_pb2 as credits_pb2,
    credits_service_pb2_grpc as credits_grpc,
    job_pb2,
    queue_service_pb2 as queue_pb2,
    queue_service_pb2_grpc as queue_grpc,
)
from queue_service.store.pool import connection
from queue_service.engine.engine import AdmitInput, QueueEngine, request_digest
from queue_service.engine.watch import NotificationHub, WatchItem, WatchStream
from queue_service.engine.job_reads import STATUS_NAMES, JobViews



class AnalysisQueueServicer(queue_grpc.AnalysisQueueServiceServicer):
    def __init__(self, engine: QueueEngine, views: JobViews, hub: NotificationHub, draining: asyncio.Event) -> None:
        self._engine = engine
        self._views = views
        self._hub = hub
        self._draining = draining

    async def Admit(self, request: queue_pb2.AdmitRequest, context: grpc.aio.ServicerContext) -> queue_pb2.AdmitResponse:
        with telemetry.tracer.start_as_current_span("admit") as span:
            try:
                job = await self._admit(request, span)
            except errors.QueueError as error:
                span.set_attribute("queue.admit.reason", error.reason)
                telemetry.metrics.admits.add(1, {"outcome": "rejected", "reason": error.reason})
                raise
            outcome = "queued" if job.status == job_pb2.JOB_STATUS_QUEUED else "started"
            telemetry.metrics.admits.add(1, {"outcome": outcome, "reason": "OK"})
            return queue_pb2.AdmitResponse(job=job)

    async def _admit(self, request: queue_pb2.AdmitRequest, span: trace.Span) -> job_pb2.Job:
        delta_of = validation.validate_admit(request)
        span.set_attribute("queue.user_id", request.user_id)
        payload = queue_pb2.AdmitRequest()
        payload.CopyFrom(request)
        payload.ClearField("idempotency_key")
        item = AdmitInput(
            user_id=request.user_id,
            idempotency_key=request.idempotency_key,
            document_uri=request.document.uri,
            sources=tuple((s.doi, s.citation) for s in request.sources),
            delta_of_job_id=delta_of,
            request_digest=request_digest(payload.SerializeToString(deterministic=True)),
        )
        result = await self._engine.admit(item)
        if result.view is not None:
            job = await self._views.from_row(result.view)
        else:
            job = await self._views.one(result.job_id)
        if job is None:  # canceled and gone cannot happen (rows are never deleted); be explicit
            raise errors.JobNotFound(f"job {result.job_id} vanished")
        span.set_attribute("queue.job_id", job.job_id)
        span.set_attribute("queue.admit.decision", STATUS_NAMES[job.status])
        span.set_attribute("queue.admit.duplicate", result.duplicate)
        span.set_attribute("queue.position", job.queue_position)
        return job

    async def Promote(self, request: queue_pb2.PromoteRequest, context: grpc.aio.ServicerContext) -> queue_pb2.PromoteResponse:
        validation.validate_user_id(request.user_id)
        promoted = await self._engine.promote(request.user_id, trigger="tooling")
        if not promoted:
            return queue_pb2.PromoteResponse()
        job = await self._views.one(promoted[0].job_id)
        return queue_pb2.PromoteResponse(job=job)

    async def Release(self, request: queue_pb2.ReleaseRequest, context: grpc.aio.ServicerContext) -> queue_pb2.ReleaseResponse:
        job_id = validation.validate_job_id(request.job_id)
        engine = self._engine
        async with connection(engine.pool) as conn:
            claim = await repo.claim_release_of_job(conn, job_id=job_id, lease_seconds=engine.config.release_lease_seconds)
            row = None if claim else await repo.job_by_id(conn, job_id=job_id)
        if claim is not None:
            await engine.release(claim)
        elif row is None:
            raise errors.JobNotFound(f"job {job_id} does not exist", metadata={"jobId": str(job_id)})
        elif row.status != "pending":
            raise errors.JobNotPending(
                f"job {job_id} is {row.status}; only a PENDING job can be released",
                metadata={"jobId": str(job_id), "status": row.status.upper()},
            )
        # else: another replica is releasing it right now; report the job as it is.
        return queue_pb2.ReleaseResponse(job=await self._views.one(job_id))

    async def ListJobs(self, request: queue_pb2.ListJobsRequest, context: grpc.aio.ServicerContext) -> queue_pb2.ListJobsResponse:
        validation.validate_user_id(request.user_id)
        page_size = validation.validate_page_size(request.page_size)
        statuses = _status_filter(request.statuses)
        filter_key = _filter_key(request.user_id, statuses)
        after_job_id, before_seq = _decode_page_token(request.page_token, filter_key)
        async with connection(self._engine.pool) as conn:
            rows = await repo.list_job_views(
                conn,
                user_id=request.user_id,
                after_job_id=after_job_id,
                before_seq=before_seq,
                statuses=statuses,
                limit=page_size + 1,
            )
            mean = await self._views.mean_judging_seconds(conn)
        page, more = rows[:page_size], len(rows) > page_size
        token = _encode_page_token(page[-1]["job_id"], filter_key) if more else ""
        return queue_pb2.ListJobsResponse(jobs=[self._views.to_proto(r, mean) for r in page], next_page_token=token)

    async def GetJob(self, request: queue_pb2.GetJobRequest, context: grpc.aio.ServicerContext) -> queue_pb2.GetJobResponse:
        job_id = validation.validate_job_id(request.job_id)
        job = await self._views.one(job_id)
        if job is None:
            raise errors.JobNotFound(f"job {job_id} does not exist", metadata={"jobId": str(job_id)})
        return queue_pb2.GetJobResponse(job=job)

    async def CancelJob(self, request: queue_pb2.CancelJobRequest, context: grpc.aio.ServicerContext) -> queue_pb2.CancelJobResponse:
        v = validation.Violations()
        job_id = v.check_uuid("job_id", request.job_id)
        v.check_id("user_id", request.user_id)
        v.raise_if_any()
        assert job_id is not None
        await self._engine.cancel(job_id, request.user_id)
        return queue_pb2.CancelJobResponse(job=await self._views.one(job_id))

    async def WatchJobs(self, request: queue_pb2.WatchJobsRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[queue_pb2.WatchJobsResponse]:
        validation.validate_user_id(request.user_id)
        if self._draining.is_set():
            raise errors.ShuttingDown("this replica is draining; reconnect to another")
        stream = self._hub.subscribe(request.user_id)
        drain = asyncio.ensure_future(self._draining.wait())
        getter: asyncio.Future | None = None
        try:
            for message in await self._catch_up(stream, resync=False):
                yield message
            while True:
                getter = asyncio.ensure_future(stream.queue.get())
                done, _ = await asyncio.wait({getter, drain}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    raise errors.ShuttingDown("this replica is draining; reconnect to another")
                item = getter.result()
                if item is None:
                    for message in await self._catch_up(stream, resync=True):
                        yield message
                else:
                    stream.saw(item)
                    yield queue_pb2.WatchJobsResponse(job=item.job)
        finally:
            # A caller who hangs up cancels this generator mid-wait: no task may outlive it.
            for pending in (drain, getter):
                if pending is not None and not pending.done():
                    pending.cancel()
            self._hub.unsubscribe(stream)

    async def _catch_up(self, stream: WatchStream, *, resync: bool) -> list[queue_pb2.WatchJobsResponse]:
        """The first snapshot (the user's active jobs) or, after a gap in the stream's changes,
        a resync: every job that may have changed meanwhile, ended ones included (I11)."""
        user_id = stream.user_id
        async with connection(self._engine.pool) as conn:
            if resync:
                rows = await repo.watch_resync_views(
                    conn, user_id=user_id, job_ids=sorted(stream.active_job_ids), after_seq=stream.newest_seq
                )
            else:
                rows = await repo.active_job_views_of_user(conn, user_id=user_id)
            newest_seq = await repo.newest_seq_of_user(conn, user_id=user_id)
            mean = await self._views.mean_judging_seconds(conn)
        items = [WatchItem(row["queue_seq"], self._views.to_proto(row, mean)) for row in rows]
        for item in items:
            stream.saw(item)
        stream.newest_seq = max(stream.newest_seq, newest_seq)
        messages = [queue_pb2.WatchJobsResponse(job=item.job) for item in items] or [queue_pb2.WatchJobsResponse()]
        if resync:
            messages[-1].resync_complete = True
        else:
            messages[-1].snapshot_complete = True
        return messages


def _status_filter(statuses: list[int]) -> list[str]:
    if len(statuses) > validation.MAX_STATUS_FILTERS:
        raise errors.InvalidRequest(
            f"statuses lists {len(statuses)} entries; at most {validation.MAX_STATUS_FILTERS} (there are six statuses)",
            metadata={"maxStatuses": str(validation.MAX_STATUS_FILTERS)},
            field_violations=[("statuses", f"at most {validation.MAX_STATUS_FILTERS} entries")],
        )
    names = []
    for index, status in enumerate(statuses):
        if status not in STATUS_NAMES:
            raise errors.InvalidRequest(
                f"statuses[{index}] is not a job status",
                field_violations=[(f"statuses[{index}]", "use JOB_STATUS_QUEUED .. JOB_STATUS_CANCELED")],
            )
        names.append(STATUS_NAMES[status])
    return sorted(set(names))


def _filter_key(user_id: str, statuses: list[str]) -> str:
    return hashlib.sha256(json.dumps([user_id, statuses]).encode()).hexdigest()[:16]


def _encode_page_token(last_job_id: uuid.UUID, filter_key: str) -> str:
    """Opaque to callers (AIP-158): the page's last job (the caller's own) and the filter it was
    issued for; nothing about other users' activity."""
    raw = json.dumps({"a": str(last_job_id), "f": filter_key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_page_token(token: str, filter_key: str) -> tuple[uuid.UUID | None, int | None]:
    """(after_job_id, before_seq); tokens of earlier versions carry before_seq."""
    if not token:
        return None, None
    invalid = errors.InvalidRequest(
        "page_token is not valid for this request; pass the next_page_token of a ListJobs call with the same user_id and statuses",
        field_violations=[("page_token", "unknown or issued for another user_id or statuses")],
    )
    if len(token) > 200:
        raise invalid
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        key = data["f"]
        if "a" in data:
            return_value: tuple[uuid.UUID | None, int | None] = (uuid.UUID(data["a"]), None)
        else:
            before_seq = data["b"]
            if not isinstance(before_seq, int) or isinstance(before_seq, bool) or not 0 < before_seq < 2**63:
                raise invalid
            return_value = (None, before_seq)
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        raise invalid from None
    if key != filter_key:
        raise invalid
    return return_value


# Completions processed at once per replica. A burst of callbacks beyond this waits its turn
# before doing any work, so the releases the finished ones start are not starved by the backlog.
_CONCURRENT_COMPLETIONS = 8


class CoreCallbackServicer(callback_grpc.CoreCallbackServiceServicer):
    def __init__(self, engine: QueueEngine, views: JobViews) -> None:
        self._engine = engine
        self._views = views
        self._completion_slots = asyncio.Semaphore(_CONCURRENT_COMPLETIONS)

    async def CompleteRun(self, request: callback_pb2.CompleteRunRequest, context: grpc.aio.ServicerContext) -> callback_pb2.CompleteRunResponse:
        v = validation.Violations()
        run_id = v.check_uuid("run_id", request.run_id)
        if request.outcome not in (callback_pb2.RUN_OUTCOME_SUCCEEDED, callback_pb2.RUN_OUTCOME_FAILED):
            v.add("outcome", "outcome must be RUN_OUTCOME_SUCCEEDED or RUN_OUTCOME_FAILED")
        v.check_text("message", request.message, max_chars=validation.MAX_MESSAGE_CHARS)
        v.raise_if_any()
        assert run_id is not None
        # Waits for a turn no longer than the caller's deadline allows: past it, the caller (the
        # core) hears a retryable UNAVAILABLE instead of timing out.
        if not await deadline.acquire(self._completion_slots):
            raise errors.ReplicaBusy("this replica is busy finishing other completions; retry the call")
        try:
            job_id, view = await self._engine.complete_run(
                run_id,
                succeeded=request.outcome == callback_pb2.RUN_OUTCOME_SUCCEEDED,
                refund=request.refund_credit,
                message=request.message,
            )
            job = await self._views.from_row(view) if view is not None else await self._views.one(job_id)
        finally:
            self._completion_slots.release()
        return callback_pb2.CompleteRunResponse(job=job)


class CreditsServicer(credits_grpc.CreditsServiceServicer):
    def __init__(self, engine: QueueEngine) -> None:
        self._engine = engine

    async def GrantCredits(self, request: credits_pb2.GrantCreditsRequest, context: grpc.aio.ServicerContext) -> credits_pb2.GrantCreditsResponse:
        v = validation.Violations()
        v.check_id("user_id", request.user_id)
        v.check_id("idempotency_key", request.idempotency_key)
        if not 1 <= request.amount <= validation.MAX_GRANT:
            v.add("amount", f"amount must be between 1 and {validation.MAX_GRANT}")
        v.raise_if_any()
        key = {"user_id": request.user_id, "idempotency_key": request.idempotency_key}
        async with connection(self._engine.pool) as conn:
            balance = await repo.grant_credits(conn, amount=request.amount, **key)
        if balance is None:
            async with connection(self._engine.pool) as conn:
                earlier = await repo.grant_by_key(conn, **key)
                balance = await repo.balance_of_user(conn, user_id=request.user_id)
            if earlier != request.amount:
                raise errors.IdempotencyKeyReused(
                    f"this idempotency key already granted {earlier} credits; use a new key for another grant",
                    metadata={"grantedAmount": str(earlier)},
                )
        return credits_pb2.GrantCreditsResponse(balance=balance)

    async def GetBalance(self, request: credits_pb2.GetBalanceRequest, context: grpc.aio.ServicerContext) -> credits_pb2.GetBalanceResponse:
        validation.validate_user_id(request.user_id)
        async with connection(self._engine.pool) as conn:
            balance = await repo.balance_of_user(conn, user_id=request.user_id)
        return credits_pb2.GetBalanceResponse(balance=balance)
