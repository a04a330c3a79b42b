"""The minimal service floor: a gRPC Admit that runs only the admit transaction.

Same generated service and request as the real one (so ghz sends the identical call), same
store methods for the transaction (`reserve_run_and_read_admit_state` + `Store.admit_job`, the
job stored with the request's document and sources, as the service stores them), and
nothing else: no validation, no core call, no telemetry, no pool ping. What the real Admit costs beyond this is the service's own overhead.

With `--core HOST:PORT` it also makes the one call the contract puts in every admit: the core's
CreateRun of a held run (a plain grpc.aio stub, one call, no retry), before the transaction as the
real Admit does. That floor (`minimal_core`) separates the cost of the core call, which no cut of
the service can remove, from the service's own overhead.

With `--contract` (and a core) it also does, with the service's own code, what the contract and
the operations guide ask of every admit beyond the two (`minimal_contract`): the call's way in
through the service's road (its deadline budget, its gate with each caller's share, the call's
span, the error mapping: docs/design.md 4a), the request's validation and digest, the admit's span
and counter, the two audit lines (`job admitted`, `credits moved`, logged as the service logs
them), and the answer as the service gives it: the whole job with its place and estimated start
(docs/design.md 4b). What is left between it and the real Admit is what our design adds to the
contract's work: the core client's shell (its tally, retries and breaker), the admission's task
that outlives its caller, the feed's hints. The release of a job that starts at once is contract
work too, and left out: the floor is lower for it, a ratio against it stricter.

    python -m bench.minimal_server --listen 127.0.0.1:50071 --dsn postgresql://... [--core 127.0.0.1:50061 [--contract]]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import signal
import uuid

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from bench.driver import ADMIT_LIMITS, FREE_ADMITS_PER_HOUR, TIMEOUTS
from queue_service import telemetry
from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2
from queue_service._gen.acurio.core.v1 import run_service_pb2_grpc as core_grpc
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2_grpc as queue_grpc
from queue_service.api.road.interceptor import ErrorInterceptor
from queue_service.api.road.road import CallRoad
from queue_service.api.servicers import validation
from queue_service.api.servicers.convert import PROTO_OF_STATUS, job_to_proto
from queue_service.api.servicers.queue import admit_request_digest
from queue_service.config import Config
from queue_service.engine import JobReads
from queue_service.model import NewJob
from queue_service.server import call_gate
from queue_service.store import Store
from queue_service.store.pool import create_pool

log = logging.getLogger("queue_service.engine.admission")

_PRICE = 1
_CORE_DEADLINE_SECONDS = 5.0


class MinimalAdmit(queue_grpc.AnalysisQueueServiceServicer):
    def __init__(self, store: Store, core: core_grpc.RunServiceStub | None, reads: JobReads | None = None) -> None:
        self._store = store
        self._core = core
        # With the contract's work (`--contract`): the service's job reads for the answer.
        self._reads = reads

    async def Admit(self, request: queue_pb2.AdmitRequest, context: grpc.aio.ServicerContext) -> queue_pb2.AdmitResponse:
        if self._reads is None:
            return await self._admit(request, context, hashlib.sha256(request.SerializeToString()).digest())
        with telemetry.tracer.start_as_current_span("admit") as span:
            validation.validate_admit(request)
            span.set_attribute("queue.user_id", request.user_id)
            answer = await self._admit(request, context, admit_request_digest(request))
            telemetry.metrics.admits.add(
                1, {"outcome": "queued" if answer.job.status == job_pb2.JOB_STATUS_QUEUED else "started", "reason": "OK"}
            )
            return answer

    async def _admit(self, request: queue_pb2.AdmitRequest, context: grpc.aio.ServicerContext, digest: bytes) -> queue_pb2.AdmitResponse:
        job = NewJob(
            job_id=uuid.uuid4(),
            user_id=request.user_id,
            run_id=uuid.uuid4(),
            idempotency_key=request.idempotency_key,
            request_digest=digest,
            delta_of_job_id=None,
            price=_PRICE,
            # The job keeps what it judges, as the service's does (RetryJob admits it again,
            # SearchJobs finds it by it): the transaction's row is the same size.
            document_uri=request.document.uri,
            document_title=request.document.title,
            sources=tuple((source.doi, source.citation) for source in request.sources),
        )
        if self._core is not None:
            await self._core.CreateRun(
                core_pb2.CreateRunRequest(
                    run_id=str(job.run_id),
                    user_id=job.user_id,
                    document_uri=request.document.uri,
                    sources=[core_pb2.RunSource(doi=source.doi, citation=source.citation) for source in request.sources],
                    hold=True,
                    job_id=str(job.job_id),
                    idempotency_key=job.idempotency_key,
                    request_digest=job.request_digest,
                    price=_PRICE,
                ),
                timeout=_CORE_DEADLINE_SECONDS,
            )
        async with self._store.statements() as db:
            await db.reserve_run_and_read_admit_state(
                run_id=job.run_id,
                user_id=job.user_id,
                idempotency_key=job.idempotency_key,
                delta_of_job_id=None,
                grace_seconds=60,
                max_free_admits=FREE_ADMITS_PER_HOUR,
            )
        admitted = await self._store.admit_job(job, ADMIT_LIMITS)
        if admitted is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "insufficient credits")
        if self._reads is not None:
            view = admitted.view
            log.info("job admitted", extra={"job_id": job.job_id, "user_id": job.user_id, "run_id": job.run_id, "status": view.status})
            return queue_pb2.AdmitResponse(job=job_to_proto(await self._reads.estimated_after_commit(view)))
        return queue_pb2.AdmitResponse(
            job=job_pb2.Job(
                job_id=str(job.job_id), user_id=job.user_id, run_id=str(job.run_id), status=PROTO_OF_STATUS[admitted.view.status]
            )
        )


async def serve(listen: str, dsn: str, pool_max_size: int, core_addr: str | None, contract: bool) -> None:
    pool = create_pool(dsn, timeouts=TIMEOUTS, min_size=2, max_size=pool_max_size, timeout=10)
    await pool.open(wait=True)
    store = Store(pool, database_url=dsn)
    reads = None
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if contract:
        # The service's defaults, as the benchmark runs it (bench.procs.Stack): logged and traced
        # as it is, its gate and reads set from the same configuration.
        config = Config.from_env({"DATABASE_URL": dsn})
        telemetry.configure_logging(log_format=config.log_format, level=config.log_level, redact=config.redact_secrets)
        telemetry.configure(service_name="acurio-queue", console_traces=config.trace_console, metrics_addr=config.metrics_addr)
        reads = JobReads(store, default_max_active=config.max_active_per_user, reconcile_after_seconds=config.reconcile_after_seconds)
        interceptors.append(ErrorInterceptor(CallRoad(None, call_gate(config), None)))
    # The channel options the service's core client uses (core_client.py).
    channel = (
        grpc.aio.insecure_channel(core_addr, options=[("grpc.keepalive_time_ms", 30_000), ("grpc.enable_retries", 0)])
        if core_addr
        else None
    )
    core = core_grpc.RunServiceStub(channel) if channel is not None else None
    server = grpc.aio.server(interceptors=interceptors)
    queue_grpc.add_AnalysisQueueServiceServicer_to_server(MinimalAdmit(store, core, reads), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            queue_pb2.DESCRIPTOR.services_by_name["AnalysisQueueService"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    if server.add_insecure_port(listen) == 0:
        raise OSError(f"could not listen on {listen}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1)
    if channel is not None:
        await channel.close()
    await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--pool-max-size", type=int, default=20)
    parser.add_argument("--core", help="host:port of a core: each admit makes its CreateRun (held) first")
    parser.add_argument(
        "--contract", action="store_true", help="with --core: also the contract's work on every admit (the module's docstring)"
    )
    args = parser.parse_args()
    if args.contract and not args.core:
        parser.error("--contract needs --core")
    asyncio.run(serve(args.listen, args.dsn, args.pool_max_size, args.core, args.contract))


if __name__ == "__main__":
    main()
