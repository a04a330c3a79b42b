"""Observability: the spans, metrics and log lines of an admit -> promote -> release -> complete
cycle, captured with in-memory exporters."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from queue_service import telemetry
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from tests.harness import S, new_user


@pytest.fixture(scope="module")
def otel() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcAioInstrumentorServer
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[reader])
    trace.set_tracer_provider(tracer_provider)
    otel_metrics.set_meter_provider(meter_provider)
    telemetry.instrument_libraries()
    yield spans, reader
    # The rest of the session runs uninstrumented and records nothing.
    GrpcAioInstrumentorServer().uninstrument()
    GrpcAioInstrumentorClient().uninstrument()
    PsycopgInstrumentor().uninstrument()
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _metric_points(reader: InMemoryMetricReader) -> dict[str, list]:
    found: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


async def test_a_full_cycle_emits_spans_metrics_and_job_log_lines(otel, services) -> None:
    spans, reader = otel
    spans.clear()
    log_lines = io.StringIO()
    handler = logging.StreamHandler(log_lines)
    handler.setFormatter(telemetry.JsonFormatter())
    logging.getLogger("queue_service").addHandler(handler)
    logging.getLogger("queue_service").setLevel(logging.INFO)
    try:
        # A manual core holds the first run judging until told, so the second admit queues
        # behind it however slow the machine (a 50 ms judging could end before it).
        core = await services.core(judging_seconds=0.05)
        service = await services.start(core)
        user = new_user()
        await service.stubs.grant(user, 3)
        first = await service.stubs.admit(user)
        second = await service.stubs.admit(user)
        stream = service.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), timeout=10)
        await stream.read()
        assert second.status == S.JOB_STATUS_QUEUED
        core.start_judging()
        await service.stubs.wait_for(second.job_id, S.JOB_STATUS_SUCCEEDED)
        await service.app.sweeper.sweep_once()
        points = _metric_points(reader)
        stream.cancel()
    finally:
        logging.getLogger("queue_service").removeHandler(handler)

    finished = spans.get_finished_spans()
    by_name: dict[str, list] = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)

    # Our own spans, with the attributes that tell the story.
    admits = by_name["admit"]
    assert {s.attributes["queue.admit.decision"] for s in admits} == {"pending", "queued"}
    assert {s.attributes["queue.position"] for s in admits} == {0, 1}
    assert all(s.attributes["queue.lock_wait_ms"] >= 0 for s in by_name["lock.wait"])
    assert any(s.attributes["queue.promoted"] == 1 and s.attributes["queue.cause"] == "completion" for s in by_name["promote"])
    releases = by_name["release"]
    assert {s.attributes["queue.release.result"] for s in releases} == {"released"}
    assert all(s.attributes["queue.release.attempt"] == 1 for s in releases)
    assert {s.attributes["queue.status"] for s in by_name["complete"]} == {"succeeded"}
    assert "queue.sweep.promoted" in by_name["sweep"][0].attributes

    # Library instrumentation: every incoming RPC, every call to the core, every statement.
    assert "/acurio.queue.v1.AnalysisQueueService/Admit" in by_name
    assert "/acurio.core.v1.RunService/CreateRun" in by_name
    assert "/acurio.core.v1.RunService/ReleaseRun" in by_name
    assert any(s.attributes.get("db.system") == "postgresql" for s in finished)
    # The admit span is the child of the incoming RPC's span: one trace per click.
    rpc = by_name["/acurio.queue.v1.AnalysisQueueService/Admit"][0]
    assert any(s.context.trace_id == rpc.context.trace_id for s in admits)

    # Trace context travels to the core and back: the completion continues the release's trace.
    release_call = next(
        s
        for s in by_name["/acurio.core.v1.RunService/ReleaseRun"]
        if s.kind == trace.SpanKind.CLIENT and s.attributes.get("rpc.method") == "ReleaseRun"
    )
    carried = dict(core.runs[first.run_id].trace_headers)["traceparent"]
    completions = [s for s in by_name["/acurio.queue.v1.CoreCallbackService/CompleteRun"] if s.kind == trace.SpanKind.SERVER]
    release_traces = {s.context.trace_id for s in by_name["release"]}
    assert int(carried.split("-")[1], 16) in release_traces
    assert {s.context.trace_id for s in completions} <= release_traces
    assert release_call.context.trace_id in release_traces

    # Metrics of the cycle.
    for name in (
        "queue.admits",
        "queue.lock.wait",
        "queue.promotions",
        "queue.promotion.gap",
        "queue.release.attempts",
        "queue.completions",
        "queue.sweep.duration",
        "queue.depth",
        "queue.db.pool.connections",
        "queue.watch.streams",
    ):
        assert name in points, f"metric {name} was not recorded"
    outcomes = {tuple(sorted(p.attributes.items())): p.value for p in points["queue.admits"]}
    assert outcomes[(("outcome", "started"), ("reason", "OK"))] >= 1
    assert outcomes[(("outcome", "queued"), ("reason", "OK"))] >= 1
    assert sum(p.count for p in points["queue.promotion.gap"]) >= 1
    assert {p.attributes["state"] for p in points["queue.db.pool.connections"]} >= {"idle", "used"}

    # One JSON log line per state change, with job, user, run and trace ids.
    records = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    changes = [r for r in records if r.get("job_id") == second.job_id and r["logger"] != "queue_service.credits"]
    assert [r["message"] for r in changes] == ["job admitted", "job promoted", "job released", "job ended"]
    for record in changes:
        assert record["user_id"] == user and record["run_id"] == second.run_id and len(record["trace_id"]) == 32
    # And one per credit movement, with who moved it (no tokens here: the anonymous caller).
    [charge] = [r for r in records if r.get("job_id") == second.job_id and r["logger"] == "queue_service.credits"]
    assert {k: charge[k] for k in ("message", "kind", "amount", "user_id", "actor", "reason")} == {
        "message": "credits moved",
        "kind": "charge",
        "amount": "-1",
        "user_id": user,
        "actor": "anonymous",
        "reason": "admit",
    }
    assert first.job_id in {r.get("job_id") for r in records}


async def test_serve_exposes_prometheus_metrics_and_prints_spans_on_request(services) -> None:
    import asyncio
    import urllib.request

    from queue_service.dev.embedded_postgres import free_port

    metrics_port = free_port()
    core = await services.core()
    replica = await services.start_process(
        core, QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}", QUEUE_TRACE_CONSOLE="true", QUEUE_SWEEP_INTERVAL_SECONDS="0.2"
    )
    user = new_user()
    await replica.stubs.grant(user, 2)
    await replica.stubs.admit(user)
    await replica.stubs.admit(user)
    await asyncio.sleep(0.5)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    exposition = await asyncio.to_thread(scrape)
    admits = [line for line in exposition.splitlines() if line.startswith("queue_admits_total{")]
    assert any('outcome="started"' in line and 'reason="OK"' in line for line in admits), exposition[-2000:]
    assert any(line.startswith("queue_depth{") and 'state="queued"' in line for line in exposition.splitlines())
    assert "queue_db_pool_connections{" in exposition
    # The event loop's health, which the soak (bench/soak.py) samples: its lag and its live tasks
    # (the server's own loops at least: dispatcher, sweeper, heartbeat, the lag watch).
    gauges = {line.split(" ")[0].split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line[:1] != "#"}
    assert "queue_loop_lag_seconds" in gauges, exposition[-2000:]
    assert gauges.get("queue_loop_tasks", 0) >= 4, exposition[-2000:]
    replica.terminate()
    await asyncio.to_thread(replica.process.wait, 15)
    log = replica.log()
    assert '"name": "admit"' in log and '"name": "lock.wait"' in log


async def _finished_server_spans(spans: Any) -> list[Any]:
    """The service's finished server spans, once there is one (or after a few seconds, none). The
    dev core runs in this process too: its spans (a replica's probe of the core) are not the
    service's."""
    for _ in range(100):
        found = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER and "acurio.core." not in s.name]
        if found:
            return found
        await asyncio.sleep(0.05)
    return []


async def test_refused_calls_record_their_status_and_reason_not_a_stack_trace(otel, services, tmp_path) -> None:
    """Refusals anyone who reaches the port can cause (no token, the wrong role, bad input, an
    unknown job, health for an unknown service) leave the server span without an exception event,
    with the status code and reason as attributes; a bug (INTERNAL) keeps its exception."""
    import hashlib
    import uuid

    import grpc
    from grpc_health.v1 import health_pb2

    from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2

    spans, _ = otel
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "web-backend", "role": "web", "sha256": hashlib.sha256(b"web-token").hexdigest()},
                ]
            }
        )
    )
    service = await services.start(auth_file=str(auth_file))
    web = (("authorization", "Bearer web-token"),)
    stubs = service.stubs
    missing_job = str(uuid.uuid4())
    # Each call starts when made: one at a time, so each has its span alone.
    refusals = {
        "GetJob-no-token": (
            lambda: stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=missing_job), timeout=5),
            grpc.StatusCode.UNAUTHENTICATED,
            "UNAUTHENTICATED",
        ),
        "GrantCredits-as-web": (
            lambda: stubs.credits.GrantCredits(
                credits_pb2.GrantCreditsRequest(user_id="u", amount=1, idempotency_key="k"), metadata=web, timeout=5
            ),
            grpc.StatusCode.PERMISSION_DENIED,
            "PERMISSION_DENIED",
        ),
        "GetJob-bad-id": (
            lambda: stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id="not-a-uuid"), metadata=web, timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_REQUEST",
        ),
        "GetJob-unknown": (
            lambda: stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=missing_job), metadata=web, timeout=5),
            grpc.StatusCode.NOT_FOUND,
            "JOB_NOT_FOUND",
        ),
        "Health-unknown-service": (
            lambda: stubs.health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5),
            grpc.StatusCode.NOT_FOUND,
            "NOT_FOUND",
        ),
    }
    for label, (call, code, reason) in refusals.items():
        spans.clear()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call()
        assert raised.value.code() == code, label
        # The server ends its span after the status is on its way: the caller may hear it first.
        server_spans = await _finished_server_spans(spans)
        assert len(server_spans) == 1, label
        span = server_spans[0]
        assert [event.name for event in span.events] == [], f"{label}: {[e.attributes for e in span.events]}"
        assert span.attributes["rpc.grpc.status_code"] == code.value[0], label
        assert span.attributes["queue.error.reason"] == reason, label
        assert span.status.status_code == trace.StatusCode.UNSET, label

    # A refused stream too: WatchJobs without credentials.
    spans.clear()
    stream = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id="u"), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stream.read()
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    watch = next(s for s in await _finished_server_spans(spans) if s.name.endswith("/WatchJobs"))
    assert list(watch.events) == []
    assert watch.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAUTHENTICATED.value[0]

    # A bug is another matter: INTERNAL, the span an error with the exception that caused it.
    async def broken_read(job_id: object) -> None:
        raise RuntimeError("a bug in the read path")

    service.app.reads.one = broken_read  # type: ignore[method-assign]
    spans.clear()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=missing_job), metadata=web, timeout=5)
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    span = (await _finished_server_spans(spans))[0]
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INTERNAL.value[0]
    assert [e.attributes["exception.type"] for e in span.events] == ["RuntimeError"]
    assert "a bug in the read path" in span.events[0].attributes["exception.message"]


async def test_browser_calls_have_server_spans_with_their_outcome(otel, services, tmp_path) -> None:
    """A Connect call has a server span as a gRPC call does: named by the method, with the status
    code and reason attributes, no stack trace for a refusal, and the engine's spans as children."""
    import hashlib
    import http.client
    import uuid

    spans, _ = otel
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "web-backend", "role": "web", "sha256": hashlib.sha256(b"web-token").hexdigest()},
                    {"name": "operator", "role": "operator", "sha256": hashlib.sha256(b"operator-token").hexdigest()},
                ]
            }
        )
    )
    service = await services.start(auth_file=str(auth_file), http_addr="127.0.0.1:0")

    def post(method: str, message: dict[str, Any], token: str | None) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", service.app.http_port, timeout=10)
        headers = {"content-type": "application/json", "connect-protocol-version": "1"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        try:
            connection.request("POST", f"/acurio.queue.v1.{method}", body=json.dumps(message).encode(), headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    async def server_span_of(method: str, message: dict[str, Any], token: str | None, status: int) -> Any:
        spans.clear()
        assert await asyncio.to_thread(post, method, message, token) == status
        found = [s for s in await _finished_server_spans(spans) if s.name == f"/acurio.queue.v1.{method}"]
        assert len(found) == 1, [s.name for s in spans.get_finished_spans()]
        return found[0]

    refused = await server_span_of("AnalysisQueueService/GetJob", {"jobId": "x"}, None, 401)
    assert refused.attributes["rpc.system"] == "connect_rpc"
    assert refused.attributes["rpc.grpc.status_code"] == 16 and refused.attributes["queue.error.reason"] == "UNAUTHENTICATED"
    assert list(refused.events) == [] and refused.status.status_code == trace.StatusCode.UNSET

    invalid = await server_span_of("AnalysisQueueService/GetJob", {"jobId": "not-a-uuid"}, "web-token", 400)
    assert invalid.attributes["queue.error.reason"] == "INVALID_REQUEST" and list(invalid.events) == []

    user = new_user()
    granted = await server_span_of(
        "CreditsService/GrantCredits", {"userId": user, "amount": 1, "idempotencyKey": "g"}, "operator-token", 200
    )
    assert granted.attributes["rpc.grpc.status_code"] == 0 and "queue.error.reason" not in granted.attributes
    admit = {"userId": user, "idempotencyKey": "a", "document": {"uri": "s3://t/1.pdf"}, "sources": [{"doi": "10.1234/a"}]}
    admitted = await server_span_of("AnalysisQueueService/Admit", admit, "web-token", 200)
    children = [s for s in spans.get_finished_spans() if s.name == "admit"]
    assert children and children[0].parent is not None and children[0].parent.span_id == admitted.context.span_id

    async def broken_read(job_id: object) -> None:
        raise RuntimeError("a bug in the read path")

    service.app.reads.one = broken_read  # type: ignore[method-assign]
    bug = await server_span_of("AnalysisQueueService/GetJob", {"jobId": str(uuid.uuid4())}, "web-token", 500)
    assert bug.status.status_code == trace.StatusCode.ERROR and bug.attributes["rpc.grpc.status_code"] == 13
    assert [e.attributes["exception.type"] for e in bug.events] == ["RuntimeError"]


def test_a_capacity_wait_read_below_zero_is_recorded_as_no_wait(otel) -> None:
    """A grant reads its clock before it looks for waiting jobs, so a job whose wait began (by its
    own transaction's clock) a moment later, committed before the grant's next statement, reads a
    wait just below zero. The histogram must record it (as 0), not drop it with an SDK warning
    per grant (the soak found one in each replica's log)."""
    import uuid

    from queue_service.engine.capacity import FleetCapacity
    from queue_service.model import CapacityGrant, ClaimedRelease

    _spans, reader = otel

    def waits() -> tuple[int, float]:
        points = _metric_points(reader).get("queue.capacity.wait", [])
        return sum(p.count for p in points), min((p.min for p in points), default=0.0)

    before, _ = waits()
    claim = ClaimedRelease(job_id=uuid.uuid4(), user_id=new_user(), run_id=uuid.uuid4(), attempt=1)
    FleetCapacity(wake_grant=lambda: None, probe_interval_seconds=1).granted(CapacityGrant(claims=((claim, -0.002),), limited=True))
    after, least = waits()
    assert after == before + 1
    assert least >= 0.0
