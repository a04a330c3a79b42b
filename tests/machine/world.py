"""The invariant machine's world: a PostgreSQL of its own (restartable, its commits delayable), a
fresh database per run cloned from a migrated template, a TCP proxy between the replicas and
PostgreSQL (an outage only the replicas see), the dev core (restartable, forgetting its runs,
watched at every run it starts judging), replicas as `queue-service serve` processes with an auth
file of the three roles (one replica with its wall clock ahead), and the open WatchJobs streams.

Everything that crosses a process boundary goes through here, so a fault has one place to act."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psycopg

from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2_grpc as callback_grpc,
)
from queue_service._gen.acurio.queue.v1 import (
    credits_service_pb2_grpc as credits_grpc,
)
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import (
    operator_service_pb2_grpc as op_grpc,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2 as queue_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2_grpc as queue_grpc,
)
from queue_service.dev.core import DevCore, DevRun
from queue_service.dev.embedded_postgres import EmbeddedPostgres, free_port
from queue_service.store import migrations
from tests.faults import LISTENER, TcpProxy
from tests.harness import REPO_ROOT, error_info, role_tokens, wait_serving, write_auth_file
from tests.harness import Stubs as HealthStubs

# The machine's timings: short, so that every mechanism (release retries and their window, the
# sweeper, reconciliation, pruning, the free-work hour) turns within a run of minutes.
SWEEP_INTERVAL = 1.0
RELEASE_WINDOW = 4.0
RECONCILE_AFTER = 2.0
RECONCILE_INTERVAL = 2.0
CORE_DEADLINE = 1.0
JUDGING_SECONDS = 0.4
MAX_QUEUED_PER_USER = 6
FREE_WORK_PER_HOUR = 6
INPUTS_RETENTION = 8.0
JOB_RETENTION = 30.0
CLOCK_SKEW = "+30s"
TOKENS = {"web": "machine-web-token", "operator": "machine-operator-token", "core": "machine-core-token", "viewer": "machine-viewer-token"}


def replica_environment(database_url: str, core_port: int, port: int, auth_file: Path, capacity: int) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "QUEUE_CORE_ADDR": f"127.0.0.1:{core_port}",
        "QUEUE_LISTEN_ADDR": f"127.0.0.1:{port}",
        "QUEUE_MIGRATE_ON_START": "false",
        "QUEUE_AUTH_FILE": str(auth_file),
        "QUEUE_SWEEP_INTERVAL_SECONDS": str(SWEEP_INTERVAL),
        "QUEUE_RELEASE_WINDOW_SECONDS": str(RELEASE_WINDOW),
        "QUEUE_RELEASE_LEASE_SECONDS": "1",
        "QUEUE_RELEASE_BACKOFF_MAX_SECONDS": "0.5",
        "QUEUE_RECONCILE_AFTER_SECONDS": str(RECONCILE_AFTER),
        "QUEUE_CORE_RECONCILE_INTERVAL_SECONDS": str(RECONCILE_INTERVAL),
        "QUEUE_CORE_DEADLINE_SECONDS": str(CORE_DEADLINE),
        "QUEUE_DB_POOL_TIMEOUT_SECONDS": "1",
        "QUEUE_GRACE_PERIOD_SECONDS": "3",
        "QUEUE_MAX_QUEUED_PER_USER": str(MAX_QUEUED_PER_USER),
        "QUEUE_MAX_FREE_ADMITS_PER_USER_PER_HOUR": str(FREE_WORK_PER_HOUR),
        "QUEUE_JOB_INPUTS_RETENTION_SECONDS": str(INPUTS_RETENTION),
        "QUEUE_JOB_RETENTION_SECONDS": str(JOB_RETENTION),
        # The pruner at the sweep's pace, so that retentions of seconds turn within a run.
        "QUEUE_PRUNE_INTERVAL_SECONDS": str(SWEEP_INTERVAL),
        "QUEUE_CORE_CAPACITY": str(capacity),
        "QUEUE_DB_POOL_MAX_SIZE": "6",
        "QUEUE_DB_POOL_MIN_SIZE": "1",
        "QUEUE_LOG_LEVEL": "warning",
    }


def skewed_clock_environment() -> dict[str, str]:
    """What Debian's `faketime` sets for a program whose wall clock runs CLOCK_SKEW ahead (its
    monotonic clock untouched), set on the replica itself so that SIGTERM reaches it."""
    if shutil.which("faketime") is None:
        return {}
    # The wrapper makes a shared-memory segment named by its pid and refuses to start when one of
    # that name is left over (a wrapper killed before its clean-up, by any program on the machine):
    # another try is another pid.
    for attempt in range(5):
        listed = subprocess.run(["faketime", "-m", "--exclude-monotonic", "-f", CLOCK_SKEW, "env", "-0"], capture_output=True, text=True)
        if listed.returncode == 0:
            break
        if attempt == 4:
            listed.check_returncode()
    listing = listed.stdout
    wanted = {}
    for entry in listing.split("\0"):
        name, _, value = entry.partition("=")
        if name == "LD_PRELOAD" or (name.startswith("FAKETIME") and name != "FAKETIME_SHARED"):
            wanted[name] = value
    return wanted


def forget_faketime_segments(pid: int) -> None:
    """faketime's library makes a shared-memory segment and a semaphore named by its process's
    pid and leaves them behind when the process ends; a later process given that pid (pids are
    reused) then fails to start under faketime. Called once the process `pid` has ended."""
    for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


class RoleStubs:
    """The contract's stubs on one replica's channel, each call carrying one role's token."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.queue = queue_grpc.AnalysisQueueServiceStub(channel)
        self.credits = credits_grpc.CreditsServiceStub(channel)
        self.operator = op_grpc.OperatorServiceStub(channel)
        self.callback = callback_grpc.CoreCallbackServiceStub(channel)

    @staticmethod
    def metadata(role: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {TOKENS[role]}"),)


@dataclasses.dataclass
class Replica:
    name: str
    address: str
    process: subprocess.Popen[bytes]
    channel: grpc.aio.Channel
    stubs: RoleStubs
    health: HealthStubs
    log_path: Path
    skewed_clock: bool = False


class WatchedCore(DevCore):
    """The dev core, reporting every run it starts or stops judging and every release it
    receives to the machine (I9 and I12 are judged at the instant a run starts, as the core sees it)."""

    def __init__(self, observer: CoreObserver, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observer = observer

    def _begin_judging(self, run: DevRun) -> None:
        super()._begin_judging(run)
        self.observer.began(self, run)

    def _stop_judging(self, run: DevRun) -> None:
        was_judging = run.run_id in self.judging_all
        super()._stop_judging(run)
        if was_judging:
            self.observer.ended(run)

    def _release_run(self, request: Any, metadata: Any) -> Any:
        run = self.runs.get(request.run_id)
        if run is not None:
            self.observer.release_received(run)
        return super()._release_run(request, metadata)


class CoreObserver:
    """What the core did, across its restarts: runs judging now (by user, first-pass or not),
    each run's first release and its judging spells, for the checks."""

    def __init__(self) -> None:
        self.judging: dict[str, DevRun] = {}
        self.first_release: dict[str, float] = {}  # run_id -> wall time
        self.spells: list[tuple[str, str, bool, float, float | None]] = []  # run, user, first_pass, begin, end
        self._open: dict[str, int] = {}
        self.on_begin: list[Callable[[DevRun, dict[str, DevRun]], None]] = []

    def began(self, core: DevCore, run: DevRun) -> None:
        self.judging[run.run_id] = run
        self._open[run.run_id] = len(self.spells)
        self.spells.append((run.run_id, run.user_id, run.first_pass, time.time(), None))
        for check in self.on_begin:
            check(run, self.judging)

    def ended(self, run: DevRun) -> None:
        self.judging.pop(run.run_id, None)
        index = self._open.pop(run.run_id, None)
        if index is not None:
            run_id, user, first_pass, begin, _ = self.spells[index]
            self.spells[index] = (run_id, user, first_pass, begin, time.time())

    def release_received(self, run: DevRun) -> None:
        self.first_release.setdefault(run.run_id, time.time())

    def forget_judging(self) -> None:
        """The core restarted: what it judged is gone (its spells end now)."""
        for run in list(self.judging.values()):
            self.ended(run)


class MachinePostgres:
    """One PostgreSQL for the machine's runs, with a migrated template each run's database is cloned from."""

    TEMPLATE = "machine_template"

    def __init__(self, folder: Path) -> None:
        self.server = EmbeddedPostgres(folder / "pg", durable=False, max_connections=200)

    def start(self) -> None:
        self.server.start()
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.TEMPLATE}")
        asyncio.run(migrations.migrate(self.server.dsn(self.TEMPLATE)))

    def new_database(self) -> str:
        name = f"machine_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {self.TEMPLATE}")
        return name

    def drop_database(self, name: str) -> None:
        with contextlib.suppress(psycopg.Error), psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        self.server.stop(mode="immediate")


class World:
    """One run's world. `start()` brings up the core, the proxy and the replicas; `stop()` ends
    every process it started."""

    def __init__(self, postgres: MachinePostgres, folder: Path, *, replicas: int = 2, capacity: int = 2) -> None:
        self.postgres = postgres
        self.folder = folder
        self.replica_count = replicas
        self.initial_capacity = capacity
        self.database = postgres.new_database()
        self.database_url = postgres.server.dsn(self.database)
        self.proxy = TcpProxy(self.database_url)
        self.observer = CoreObserver()
        self.core_port = free_port()
        self.core: WatchedCore = self._new_core()
        self.replicas: list[Replica] = []
        self.auth_file = folder / "auth.json"
        write_auth_file(self.auth_file, *role_tokens(TOKENS))
        self._counter = 0
        self.skew = skewed_clock_environment()
        self.events: list[str] = []

    def _new_core(self) -> WatchedCore:
        core = WatchedCore(self.observer, judging_seconds=JUDGING_SECONDS, callback_token=TOKENS["core"])
        return core

    async def start(self) -> None:
        await self.proxy.up()
        for attempt in range(5):
            try:
                await self.core.start(f"127.0.0.1:{self.core_port}")
                break
            except OSError:  # the free port was taken meanwhile by another process
                if attempt == 4:
                    raise
                await self.core.stop()
                self.core_port = free_port()
                self.core = self._new_core()
        await asyncio.gather(*[self.start_replica(skewed_clock=bool(self.skew) and i == 1) for i in range(self.replica_count)])

    async def start_replica(self, *, skewed_clock: bool = False) -> Replica:
        for attempt in range(3):
            try:
                return await self._start_replica(skewed_clock)
            except AssertionError:  # its free port taken meanwhile (it exits at once), or a slow start
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _start_replica(self, skewed_clock: bool) -> Replica:
        self._counter += 1
        port = free_port()
        env = replica_environment(self.proxy.dsn(), self.core_port, port, self.auth_file, self.initial_capacity)
        if skewed_clock:
            env.update(self.skew)
        log_path = self.folder / f"replica-{self._counter}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "queue_service.cli", "serve"],
                env=env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        address = f"127.0.0.1:{port}"
        channel = grpc.aio.insecure_channel(address)
        replica = Replica(
            f"replica-{self._counter}", address, process, channel, RoleStubs(channel), HealthStubs(address), log_path, skewed_clock
        )
        try:
            await wait_serving(replica.health, process=process, log_path=str(log_path), timeout=90)
        except AssertionError:
            if process.poll() is None:
                process.kill()
                await asyncio.to_thread(process.wait, 10)
            await self._close(replica)
            raise
        self.replicas.append(replica)
        self.point_core_at_replicas()
        return replica

    def point_core_at_replicas(self) -> None:
        self.core.set_callback_addr(",".join(r.address for r in self.replicas))

    def pick(self, rng: random.Random) -> Replica:
        return rng.choice(self.replicas)

    async def kill_replica(self, rng: random.Random) -> None:
        victim = rng.choice(self.replicas)
        self.replicas.remove(victim)
        self.point_core_at_replicas()
        victim.process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.process.wait, 10)
        await self._close(victim)
        await self.start_replica(skewed_clock=victim.skewed_clock)

    async def rolling_deploy(self) -> list[str]:
        """Each replica in turn: a new one starts, the old one drains (SIGTERM, calls in flight).
        Returns what went wrong (a drain that did not exit 0 in time)."""
        problems = []
        for _ in range(len(self.replicas)):
            old = self.replicas[0]
            await self.start_replica(skewed_clock=old.skewed_clock)
            self.replicas.remove(old)
            self.point_core_at_replicas()
            old.process.send_signal(signal.SIGTERM)
            try:
                code = await asyncio.to_thread(old.process.wait, 30)
            except subprocess.TimeoutExpired:
                old.process.kill()
                code = await asyncio.to_thread(old.process.wait, 10)
                problems.append(f"drained {old.name} did not exit within 30 s of SIGTERM")
            if code != 0:
                problems.append(f"drained {old.name} exited {code}")
            await self._close(old)
        return problems

    async def restart_core(self, *, forget_runs: bool) -> None:
        """The core goes away and comes back on the same port: with its runs (a restart with its
        state kept) or without (a core that lost them)."""
        old = self.core
        await old.stop()
        new = self._new_core()
        for name in DevCore.FAULT_SWITCHES:
            setattr(new, name, getattr(old, name))
        if not forget_runs:
            new.runs = old.runs
            for run in old.runs.values():
                if run.run_id in old.judging_all:
                    new.judging_all.add(run.run_id)
                    new.judging_now.setdefault(run.user_id, set()).add(run.run_id)
                    run.judge_task = asyncio.create_task(new._judge(run))
        else:
            self.observer.forget_judging()
        self.core = new
        await new.start(f"127.0.0.1:{self.core_port}")
        self.point_core_at_replicas()

    async def restart_database(self) -> None:
        await asyncio.to_thread(self.postgres.server.restart)

    def commits_acknowledged_late(self, late: bool) -> None:
        with psycopg.connect(self.postgres.server.dsn(), autocommit=True) as conn:
            if late:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'machine_standby_that_never_comes'")
            else:
                conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")

    def kill_listeners(self) -> int:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            rows = conn.execute(
                f"""SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                    WHERE datname = current_database() AND {LISTENER} AND pid <> pg_backend_pid()"""
            ).fetchall()
        return sum(1 for (done,) in rows if done)

    async def heal(self) -> None:
        """Every fault off: the core answers, the proxy forwards, commits are acknowledged."""
        core = self.core
        core.unavailable = core.fail_releases = core.refuse_releases = core.drop_callbacks = core.fail_canceled_runs = False
        core.slow_seconds = 0.0
        core.judging_ceiling = None
        core.daily_budget = 1_000_000
        core.answer_faults.clear()
        await self.proxy.up()
        with contextlib.suppress(psycopg.Error):
            await asyncio.to_thread(self.commits_acknowledged_late, False)

    async def _close(self, replica: Replica) -> None:
        """After its process ended: its channels closed, and its clock's leftovers gone."""
        if replica.skewed_clock and replica.process.poll() is not None:
            forget_faketime_segments(replica.process.pid)
        with contextlib.suppress(Exception):
            await replica.channel.close()
            await replica.health.close()

    async def stop(self) -> None:
        for replica in self.replicas:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGKILL)
        for replica in self.replicas:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(replica.process.wait, 10)
            await self._close(replica)
        self.replicas.clear()
        await self.core.stop()
        await self.proxy.down()
        with contextlib.suppress(psycopg.Error):
            await asyncio.to_thread(self.commits_acknowledged_late, False)
        await asyncio.to_thread(self.postgres.drop_database, self.database)


@dataclasses.dataclass
class OpenStream:
    """One WatchJobs stream, kept open on a random replica and reopened when it ends: its last
    message per job (a new stream's snapshot is the whole truth, so a reopen starts afresh)."""

    user_id: str
    last: dict[str, job_pb2.Job] = dataclasses.field(default_factory=dict)
    vanished: set[str] = dataclasses.field(default_factory=set)
    snapshot_done: bool = False
    last_message_at: float = 0.0
    task: asyncio.Task[None] | None = None
    ends: list[str] = dataclasses.field(default_factory=list)


async def keep_stream_open(world: World, stream: OpenStream, rng: random.Random) -> None:
    while True:
        if not world.replicas:
            await asyncio.sleep(0.1)
            continue
        replica = rng.choice(world.replicas)
        stream.last, stream.vanished, stream.snapshot_done = {}, set(), False
        call = replica.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=stream.user_id), metadata=RoleStubs.metadata("web"))
        try:
            async for message in call:
                stream.last_message_at = time.monotonic()
                if message.vanished:
                    stream.last.pop(message.job.job_id, None)
                    stream.vanished.add(message.job.job_id)
                elif message.HasField("job"):
                    stream.last[message.job.job_id] = message.job
                    stream.vanished.discard(message.job.job_id)
                if message.snapshot_complete:
                    stream.snapshot_done = True
            stream.ends.append("OK")
        except grpc.aio.AioRpcError as exc:
            stream.ends.append(f"{exc.code().name}/{error_info(exc)[1] or '-'}")
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                call.cancel()
                raise
            # The call was cancelled under it (its replica's channel closed after a kill or a
            # drain), not this task: the stream ended, and is opened again elsewhere.
            stream.ends.append("CANCELLED/channel-closed")
        await asyncio.sleep(0.1)
