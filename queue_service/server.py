"""Assembles one replica: pool, migrations, core client, engine, background loops, gRPC server.

Health (service "") is SERVING once the database answers and the schema is current, NOT_SERVING
while the database cannot commit this replica's probe write, and from the moment a drain
starts; health service "liveness" is SERVING for as long as the process serves, whatever the
database does. `start` waits for an unreachable database (QUEUE_DB_START_WAIT_SECONDS) and logs
the database's replication stance. A drain stops accepting calls, ends WatchJobs
streams with UNAVAILABLE (clients reconnect to another replica), gives in-flight unary calls the
grace period, stops the loops and closes the pool.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
import time
from collections.abc import Mapping
from typing import TypedDict

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from queue_service import deadline, errors, telemetry
from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2,
    core_callback_service_pb2_grpc,
    credits_service_pb2,
    credits_service_pb2_grpc,
    operator_service_pb2,
    operator_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
)
from queue_service.api.access import auth
from queue_service.api.access.auth import Authorizer, Caller
from queue_service.api.access.credential_reload import CredentialReloader
from queue_service.api.access.server_tls import ServerTls
from queue_service.api.access.user_assertions import UserAssertions
from queue_service.api.listeners.connection_limits import connection_options
from queue_service.api.listeners.web import WebEndpoint
from queue_service.api.road.gate import CallGate
from queue_service.api.road.interceptor import ErrorInterceptor
from queue_service.api.road.road import CallRoad
from queue_service.api.servicers import reflection as commented_reflection
from queue_service.api.servicers.callbacks import CoreCallbackServicer
from queue_service.api.servicers.credits import CreditsServicer
from queue_service.api.servicers.health_service import HealthService
from queue_service.api.servicers.operator import MAX_OVERVIEW_STREAMS, MAX_OVERVIEW_STREAMS_PER_CALLER, OperatorServicer
from queue_service.api.servicers.queue import AnalysisQueueServicer
from queue_service.background import cancel_and_wait
from queue_service.config import Config
from queue_service.core_client import CoreClient
from queue_service.engine import (
    Admission,
    AdmissionSettings,
    BackgroundTasks,
    Completions,
    CoreReconciler,
    CoreReconcilerSettings,
    Credits,
    FleetCapacity,
    JobReads,
    NotificationHub,
    OwedReleases,
    QueueEngine,
    QueueEngineSettings,
    Recovery,
    ReleaseDispatcher,
    ReleaseHandoff,
    Releases,
    ReleasesSettings,
    ReplicaHeartbeat,
    SharedParts,
    Sweeper,
    SweeperSettings,
    new_replica_id,
)
from queue_service.model import ReplicaReport, ReplicationStance
from queue_service.store import Store
from queue_service.store.migrations import MigrationError
from queue_service.store.pool import Timeouts, create_pool

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    queue_service_pb2.DESCRIPTOR.services_by_name["AnalysisQueueService"].full_name,
    core_callback_service_pb2.DESCRIPTOR.services_by_name["CoreCallbackService"].full_name,
    credits_service_pb2.DESCRIPTOR.services_by_name["CreditsService"].full_name,
    operator_service_pb2.DESCRIPTOR.services_by_name["OperatorService"].full_name,
)

# The health service name that answers SERVING for as long as the process serves gRPC, whatever
# the database does: what a liveness probe should check (restarting a replica never mends a
# database). Readiness checks "" (or a queue service's name), which follows the database.
LIVENESS_SERVICE = "liveness"

# How long health's probe write (checkout and commit) may take before the database counts as
# unable to take writes.
_HEALTH_WRITE_TIMEOUT_SECONDS = 1.0

# How often a serving replica re-reads the database's replication stance.
_STANCE_CHECK_SECONDS = 30.0

# What a replica tells the operator an acknowledged commit risks, by replication mode.
_AT_RISK = {
    "asynchronous": "lost if the primary fails before its standby has it (an asynchronous failover)",
    "single_node": "as durable as this one node's disk (no standby)",
    "synchronous_without_standby": "safe, but no synchronous standby is connected: every commit waits and writes stall",
    "standby": "refused: the database is a read-only standby",
    "unknown": "of unknown durability: this role may not read the standbys' sync state (grant pg_monitor)",
}

# After the last in-flight call of a drain, how long late arrivals still get a clean UNAVAILABLE.
_QUIET_SECONDS = 0.5

# Bounded input: a request larger than this is refused by gRPC itself (RESOURCE_EXHAUSTED).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def call_gate(config: Config) -> CallGate:
    """The replica's gate: every call's turn, with each caller's share (docs/design.md, 4a)."""
    return CallGate(
        max_unary=config.max_concurrent_calls,
        max_wait=config.pool_timeout_seconds,
        max_unary_per_caller=config.unary_calls_per_caller,
        max_streams=config.max_streams,
        max_streams_per_caller=config.streams_per_caller,
        # The console still watches a user's queue when other callers fill the replica.
        operator_streams_reserved=config.max_streams_per_user,
        max_overview_streams=MAX_OVERVIEW_STREAMS,
        max_overview_streams_per_caller=MAX_OVERVIEW_STREAMS_PER_CALLER,
    )


class Servicers(TypedDict):
    """One instance of each servicer, by service name (as the browser endpoint routes them)."""

    AnalysisQueueService: AnalysisQueueServicer
    CoreCallbackService: CoreCallbackServicer
    CreditsService: CreditsServicer
    OperatorService: OperatorServicer


def _connect_store(config: Config) -> Store:
    """The replica's store: its pool, with the timeouts and the feed's connection settings."""
    return Store(
        create_pool(
            config.database_url,
            timeouts=Timeouts(config.lock_timeout_ms, config.statement_timeout_ms),
            min_size=config.pool_min_size,
            max_size=config.pool_max_size,
            timeout=config.pool_timeout_seconds,
            dead_peer_seconds=config.db_dead_peer_seconds,
            reconnect_max_seconds=config.db_reconnect_max_seconds,
            prepared_statements=config.db_prepared_statements,
        ),
        database_url=config.database_url,
        listen_database_url=config.listen_database_url,
        dead_peer_seconds=config.db_dead_peer_seconds,
        liveness_seconds=config.db_liveness_seconds,
    )


class QueueApp:
    """One replica of the service; `start` returns the bound port."""

    def __init__(self, config: Config, *, built_in_tokens: Mapping[str, Caller] | None = None) -> None:
        """`built_in_tokens`: token digests served beside the auth file's, across its reloads (`dev`'s own core)."""
        config.require_service_targets()
        self.config = config
        authorizer = Authorizer.from_file(config.auth_file, built_in_tokens=built_in_tokens) if config.auth_file else None
        assertions = UserAssertions.from_config(config, authorizer.identify if authorizer else None)
        core_credentials = auth.core_channel_credentials(config.core_tls_ca_file, config.core_tls_cert_file, config.core_tls_key_file)
        self.store = _connect_store(config)
        telemetry.metrics.pools.add(self.store.pool)
        self.core = CoreClient.connect(config.core_addr, deadline_seconds=config.core_deadline_seconds, credentials=core_credentials)
        self._build_engine(config)
        self.replica_id = new_replica_id()
        self._started_at = dt.datetime.now(dt.UTC)
        self._build_edge(config, authorizer, assertions)
        self._credentials_watch: asyncio.Task[None] | None = None
        self.server: grpc.aio.Server | None = None
        self._health_watch: asyncio.Task[None] | None = None
        self._stance: ReplicationStance | None = None
        self.port = 0
        self.http_port = 0

    def _build_engine(self, config: Config) -> None:
        """The engine's rooms, each given at construction what it uses (the ports included), in
        the order they need one another: the shared parts, the reads, the lifecycle core and its
        guard, the rooms around them, then the loops."""
        handoff = self._build_shared_parts(config)
        self._build_reads(config)
        self._build_lifecycle(config)
        self._build_rooms(config)
        self._build_loops(config, handoff)

    def _build_shared_parts(self, config: Config) -> ReleaseHandoff:
        """What the rooms share, built once (`SharedParts`): the store, the core, the background
        tasks, the fleet's capacity, the handoff (returned: the dispatcher takes it), the owed
        releases and the dispatcher's wake-up."""
        # Set when jobs became PENDING (here or, through NOTIFY, on another replica): the
        # dispatcher releases them at once.
        self._releases_due = asyncio.Event()
        # The rooms start the releases they claim, and ask for grants, through the handoff; the
        # dispatcher, built after them around the releases, takes both from it.
        handoff = ReleaseHandoff()
        # What this replica knows of the fleet's capacity at the core; asking for a grant starts
        # one in the dispatcher.
        self.capacity = FleetCapacity(wake_grant=handoff.request_grant, probe_interval_seconds=config.core_probe_interval_seconds)
        # Clean-ups and changes that outlive their caller, of every room below.
        self.tasks = BackgroundTasks()
        self.parts = SharedParts(
            store=self.store,
            core=self.core,
            tasks=self.tasks,
            capacity=self.capacity,
            starter=handoff,
            owed_releases=OwedReleases(self.store, handoff, lease_seconds=config.release_lease_seconds, spawn=self.tasks.in_background),
            wake_dispatcher=self._releases_due.set,
        )
        return handoff

    def _build_reads(self, config: Config) -> None:
        """The job reads and the watch hub that fans the job-change feed out to the streams."""
        self.reads = JobReads(
            self.store,
            default_max_active=config.max_active_per_user,
            reconcile_after_seconds=config.reconcile_after_seconds,
            core_reachable=self.core.tally.recent.reachable,
        )
        self.hub = NotificationHub(
            self.store,
            self.reads,
            on_pending=self._on_unclaimed_pending,
            max_streams_per_user=config.max_streams_per_user,
            backlog_bytes=config.watch_backlog_bytes,
            reconnect_max_seconds=config.db_reconnect_max_seconds,
        )

    def _build_lifecycle(self, config: Config) -> None:
        """The lifecycle core and the reconciler, the failover guard the rooms around it are given."""
        # The lifecycle core (ending, promotion, cancel, settlement) and the rooms around it.
        self.engine = QueueEngine(self.parts, QueueEngineSettings.from_config(config))
        # The core's live runs as the second copy of the jobs (design I14): the rooms' guard
        # against runs a database failover lost; it ends the jobs whose run the core forgot.
        self.reconciler = CoreReconciler(
            self.parts,
            CoreReconcilerSettings.from_config(config),
            on_database_replaced=self.hub.database_replaced,
            ender=self.engine,
        )

    def _build_rooms(self, config: Config) -> None:
        """The rooms around the lifecycle core: completions, releases, recovery and admission."""
        guard = self.reconciler
        self.completions = Completions(self.engine, self.parts, guard=guard, on_run_judged=self.reads.run_judged)
        self.releases = Releases(self.engine, self.parts, ReleasesSettings.from_config(config), guard=guard)
        self.recovery = Recovery(self.engine, self.releases, self.parts, guard=guard)
        self.admission = Admission(self.recovery, self.parts, AdmissionSettings.from_config(config))

    def _build_loops(self, config: Config, handoff: ReleaseHandoff) -> None:
        """The replica's two loops around the rooms: the release dispatcher, which takes the claims
        and grant requests the rooms hand to `handoff`, and the sweeper's maintenance services."""
        releases_due = self._releases_due
        self.dispatcher = ReleaseDispatcher(
            self.releases,
            wake=releases_due,
            core_deadline_seconds=config.core_deadline_seconds,
            capacity=self.capacity,
            handoff=handoff,
        )
        self.sweeper = Sweeper(
            self.recovery, self.store, SweeperSettings.from_config(config), wake_dispatcher=releases_due.set, reconciler=self.reconciler
        )

    def _build_edge(self, config: Config, authorizer: Authorizer | None, assertions: UserAssertions | None) -> None:
        """The edge: health, the gate and the one road, the servicers, the browser listener, the
        heartbeat and the credential files' reloader."""
        check_request = assertions.check if assertions else None
        self.health = HealthService(max_watches=config.max_health_watches)
        self.gate = call_gate(config)
        # The one road into the servicers, for gRPC and the browser endpoint alike.
        road = CallRoad(authorizer.authorize if authorizer else None, self.gate, check_request)
        self._interceptors = [ErrorInterceptor(road)]
        credits = Credits(self.store)
        # One instance of each servicer, shared by gRPC and the browser endpoint (QUEUE_HTTP_ADDR).
        self.servicers: Servicers = {
            "AnalysisQueueService": AnalysisQueueServicer(
                self.engine, self.admission, self.releases, self.reads, self.hub, self.gate.draining
            ),
            "CoreCallbackService": CoreCallbackServicer(self.completions, self.reads),
            "CreditsService": CreditsServicer(credits),
            "OperatorService": OperatorServicer(self.engine, self.admission, self.reads, self.gate.draining, credits, self.recovery),
        }
        self.web = WebEndpoint(self.servicers, road, config) if config.http_addr else None
        self.heartbeat = ReplicaHeartbeat(self.store, self._replica_report, probe_core=self.core.probe_if_quiet)
        tls = ServerTls(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file) if config.tls_cert_file else None
        self._server_credentials = tls.grpc_credentials() if tls is not None else None
        self.credentials = CredentialReloader(
            authorizer=authorizer,
            auth_file=config.auth_file,
            tls=tls,
            assertions=assertions,
            assertion_key_file=config.user_assertion_key_file,
            on_new_certificate=self.web.reload_certificate if self.web is not None else None,
        )

    async def start(self) -> int:
        await self.store.wait_until_reachable(
            wait_seconds=self.config.db_start_wait_seconds, retry_max_seconds=self.config.db_reconnect_max_seconds
        )
        if self.config.migrate_on_start:
            await self.store.migrate()
        await self.store.open(timeout=max(10.0, self.config.pool_timeout_seconds))
        await self._check_schema()
        await self._seed_capacity()
        await self._check_replication(at_start=True)

        server = grpc.aio.server(
            interceptors=self._interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
                *connection_options(self.config.max_streams_per_connection),
            ],
        )
        queue_service_pb2_grpc.add_AnalysisQueueServiceServicer_to_server(self.servicers["AnalysisQueueService"], server)
        core_callback_service_pb2_grpc.add_CoreCallbackServiceServicer_to_server(self.servicers["CoreCallbackService"], server)
        credits_service_pb2_grpc.add_CreditsServiceServicer_to_server(self.servicers["CreditsService"], server)
        operator_service_pb2_grpc.add_OperatorServiceServicer_to_server(self.servicers["OperatorService"], server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        if self.config.reflection:
            commented_reflection.enable(
                (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
                server,
            )
        if self._server_credentials is not None:
            self.port = server.add_secure_port(self.config.listen_addr, self._server_credentials)
        else:
            self.port = server.add_insecure_port(self.config.listen_addr)
        if self.port == 0:
            raise OSError(f"could not listen on {self.config.listen_addr}")
        self.server = server
        self.hub.start()
        self.dispatcher.start()
        self.sweeper.start()
        self.heartbeat.start()
        deadline.loop_lag.start()
        telemetry.metrics.loop_lag = lambda: deadline.loop_lag.seconds
        # Read from the scrape's thread: `all_tasks` of another thread's loop is safe (it retries
        # the copy of the task set when the loop changes it meanwhile).
        serving_loop = asyncio.get_running_loop()
        telemetry.metrics.loop_tasks = lambda: len(asyncio.all_tasks(serving_loop))
        await server.start()
        if self.web is not None:
            self.http_port = await self.web.start()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self._health_watch = asyncio.create_task(self._watch_database(), name="health-watch")
        if self.config.credentials_reload_seconds > 0 and self.credentials.paths:
            self._credentials_watch = asyncio.create_task(
                self.credentials.watch(self.config.credentials_reload_seconds), name="credentials-watch"
            )
        log.info("serving on %s (port %d)", self.config.listen_addr, self.port)
        return self.port

    def reload_credentials(self) -> bool:
        """Re-reads the auth file, the listener's TLS files and the assertion key file (SIGHUP);
        False when one was refused and kept as it was (`CredentialReloader`)."""
        return self.credentials.reload()

    async def _check_schema(self) -> None:
        pending = await self.store.pending_migrations()
        if pending:
            raise MigrationError(
                f"the database lacks migrations {pending}; run `queue-service migrate` (or set QUEUE_MIGRATE_ON_START=true)"
            )

    def _on_unclaimed_pending(self) -> None:
        """A job became PENDING without its release claimed. While the fleet's capacity is
        limited that is every promotion (its job waits for a grant, which the promoting replica
        asks for, as does every replica where capacity frees): waking every dispatcher for each
        one would be a pass per promotion per replica for nothing. Otherwise it is a replica of
        an earlier version's job, and this dispatcher may release it."""
        if not self.capacity.limited:
            self._releases_due.set()

    async def _seed_capacity(self) -> None:
        """A fresh database takes QUEUE_CORE_CAPACITY; afterwards the database's value rules
        (OperatorService.SetCoreCapacity), whatever a replica's variable says."""
        async with self.store.statements() as db:
            capacity, set_by = await db.seed_capacity(capacity=self.config.core_capacity)
        if capacity != self.config.core_capacity:
            # An operator's setting is on purpose: said, not warned of. A seed of an earlier
            # QUEUE_CORE_CAPACITY in force instead of this one is the surprise worth a warning.
            on_purpose = not set_by.startswith("system:")
            log.log(
                logging.INFO if on_purpose else logging.WARNING,
                "the core's capacity in force is %d, set %s; QUEUE_CORE_CAPACITY=%d only seeds a fresh database",
                capacity,
                f"at run time by {set_by}" if on_purpose else "by an earlier seed",
                self.config.core_capacity,
            )
        self.capacity.learned(capacity > 0)

    async def _check_replication(self, *, at_start: bool = False) -> None:
        """Reads what this replica's commits wait for (`model.ReplicationStance`): logged at start
        and on every change, and the metric queue.db.synchronous_replication."""
        try:
            stance = await self.store.replication_stance(timeout=_HEALTH_WRITE_TIMEOUT_SECONDS * 5)
        except errors.QueueError as exc:
            if at_start:
                log.warning("durability: could not read the database's replication stance: %s", exc.message)
            return
        previous = self._stance
        self._stance = stance
        telemetry.metrics.replication = {"mode": stance.mode}
        if previous is not None and previous.mode == stance.mode:
            return
        if stance.synchronous:
            log.info("durability: %s: an acknowledged commit survives the loss of the primary", stance.describe())
        else:
            log.warning(
                "durability: %s: an acknowledged commit is %s (docs/operations.md, section 13)",
                stance.describe(),
                _AT_RISK.get(stance.mode, "at risk"),
            )

    async def _watch_database(self) -> None:
        """Health follows the database: every QUEUE_HEALTH_INTERVAL_SECONDS the replica commits
        a tiny durable write (`Store.commit_probe`), within a second; NOT_SERVING while that fails (the database cannot be
        reached, or answers but cannot commit), so a load balancer sends calls to replicas that
        can answer them. The replication stance is re-read every half minute."""
        serving = True
        stance_checked = time.monotonic()
        while not self.gate.draining.is_set():
            await asyncio.sleep(self.config.health_interval_seconds)
            try:
                await self.store.commit_probe(timeout=_HEALTH_WRITE_TIMEOUT_SECONDS)
                writable, why = True, ""
                telemetry.metrics.health_probes.add(1, {"result": "ok"})
            except errors.QueueError as exc:
                writable, why = False, exc.message
                telemetry.metrics.health_probes.add(1, {"result": "failed"})
            except Exception as exc:  # e.g. a role that may not write WAL messages: say so
                writable, why = False, f"{exc.__class__.__name__}: {exc}"
                telemetry.metrics.health_probes.add(1, {"result": "failed"})
            if writable != serving and not self.gate.draining.is_set():
                serving = writable
                if writable:
                    log.warning("database writable again: health SERVING")
                else:
                    log.warning("database cannot take writes (%s): health NOT_SERVING", why)
                status = health_pb2.HealthCheckResponse.SERVING if writable else health_pb2.HealthCheckResponse.NOT_SERVING
                await self._set_health(status)
                if writable:
                    await self._check_replication()  # a failover may have changed it
                    stance_checked = time.monotonic()
            if writable and time.monotonic() - stance_checked >= _STANCE_CHECK_SECONDS:
                stance_checked = time.monotonic()
                await self._check_replication()

    def _replica_report(self) -> ReplicaReport:
        """What this replica's heartbeat reports now."""
        tally = self.core.tally
        return ReplicaReport(
            replica_id=self.replica_id,
            host=socket.gethostname(),
            start_time=self._started_at,
            draining=self.gate.draining.is_set(),
            calls_in_flight=self.gate.in_flight,
            watch_streams=self.hub.open_streams,
            overview_streams=self.gate.overview.held,
            core_answered=tally.answered,
            core_refused=tally.refused,
            core_unknown=tally.unknown,
            core_last_unknown_at=tally.last_unknown_at,
            core_health=tally.recent.beat(),
        )

    async def _set_health(self, status: int) -> None:
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, status)

    async def stop(self, grace: float | None = None) -> None:
        """Drains: NOT_SERVING, refuse new calls with UNAVAILABLE, let in-flight calls finish
        within the grace period, then stop the server, the loops and the pool."""
        grace = self.config.grace_period_seconds if grace is None else grace
        started = time.monotonic()
        self.gate.close()  # WatchJobs streams end with UNAVAILABLE; clients reconnect elsewhere
        await cancel_and_wait(self._health_watch)
        await cancel_and_wait(self._credentials_watch)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        idle = await self.gate.wait_idle(grace)
        if idle and grace > 0:
            # A quiet moment in which late arrivals still get our UNAVAILABLE, not a reset stream.
            await asyncio.sleep(min(_QUIET_SECONDS, max(0.0, grace - (time.monotonic() - started))))
        if self.server is not None:
            await self.server.stop(max(0.0, grace - (time.monotonic() - started)))
        if self.web is not None:
            await self.web.stop()
        await self.sweeper.stop()
        await self.heartbeat.stop()
        await deadline.loop_lag.stop()
        await self.reconciler.stop()
        await self.dispatcher.stop()
        await self.tasks.stop()
        await self.hub.stop()
        await self.core.close()
        await self.store.close()
        log.info("stopped")

    async def wait(self) -> None:
        if self.server is not None:
            await self.server.wait_for_termination()
