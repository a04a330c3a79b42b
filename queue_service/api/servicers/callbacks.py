"""CoreCallbackService: the core reports how a run ended."""

from __future__ import annotations

import asyncio

import grpc

from queue_service import deadline, errors
from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2 as callback_pb2
from queue_service._gen.acurio.queue.v1 import core_callback_service_pb2_grpc as callback_grpc
from queue_service.api.servicers import validation
from queue_service.api.servicers.convert import job_to_proto
from queue_service.engine import Completions, JobReads

# Completions processed at once per replica. A burst of callbacks beyond this waits its turn
# before doing any work, so the releases the finished ones start are not starved by the backlog.
_CONCURRENT_COMPLETIONS = 8


class CoreCallbackServicer(callback_grpc.CoreCallbackServiceServicer):
    def __init__(self, completions: Completions, reads: JobReads) -> None:
        self._completions = completions
        self._reads = reads
        self._completion_slots = asyncio.Semaphore(_CONCURRENT_COMPLETIONS)

    async def CompleteRun(
        self,
        request: callback_pb2.CompleteRunRequest,
        context: grpc.aio.ServicerContext[callback_pb2.CompleteRunRequest, callback_pb2.CompleteRunResponse],
    ) -> callback_pb2.CompleteRunResponse:
        v = validation.Violations()
        run_id = v.check_uuid("run_id", request.run_id)
        if request.outcome not in (callback_pb2.RUN_OUTCOME_SUCCEEDED, callback_pb2.RUN_OUTCOME_FAILED):
            v.add("outcome", "outcome must be RUN_OUTCOME_SUCCEEDED or RUN_OUTCOME_FAILED")
        # The core's words are kept as they came: refusing a completion over its message would
        # leave the job running; the console shows the message isolated.
        v.check_text("message", request.message, max_chars=validation.MAX_MESSAGE_CHARS, invisible=True)
        v.raise_if_any()
        assert run_id is not None
        # Waits for a turn no longer than the caller's deadline allows: past it, the caller (the
        # core) hears a retryable UNAVAILABLE instead of timing out.
        if not await deadline.acquire(self._completion_slots):
            raise errors.ReplicaBusy("this replica is busy finishing other completions; retry the call")
        try:
            ended = await self._completions.complete_run(
                run_id,
                succeeded=request.outcome == callback_pb2.RUN_OUTCOME_SUCCEEDED,
                refund=request.refund_credit,
                message=request.message,
            )
            views = await self._reads.estimated([ended.view]) if ended.view is not None else await self._reads.by_ids([ended.ref.job_id])
        finally:
            self._completion_slots.release()
        if not views:
            raise errors.Internal(f"the job of run {run_id} vanished", metadata={"runId": str(run_id)})
        return callback_pb2.CompleteRunResponse(job=job_to_proto(views[0]))
