"""The processes of a bench run: embedded PostgreSQL, the service, the dev core, the minimal
server. Each is a separate OS process so its CPU and memory are measured on their own."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import statements
from queue_service.dev.embedded_postgres import EmbeddedPostgres, free_port
from queue_service.store import migrations

REPO_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
QUEUE_SERVICE = str(BIN / "queue-service")


class Database:
    """An embedded PostgreSQL in the run's temp folder, migrated once."""

    def __init__(self, workdir: Path, *, durable: bool, statement_stats: bool = False) -> None:
        self.durable = durable
        self.statement_stats = statement_stats
        # Buffers sized for the 1M-row history (about 400 MB with indexes), as a production
        # server would be; 128 MB made ListJobs on the history table evict dirty pages mid-run.
        self.embedded = EmbeddedPostgres(
            workdir / "pgdata",
            durable=durable,
            max_connections=400,
            shared_buffers="1GB",
            settings=statements.SERVER_SETTINGS if statement_stats else None,
        )
        self.dsn = ""

    def start(self) -> str:
        self.dsn = self.embedded.start()
        asyncio.run(migrations.migrate(self.dsn))
        if self.statement_stats:
            statements.install(self.dsn)
        return self.dsn

    @property
    def pid(self) -> int:
        # postmaster.pid line 1 is the postmaster's pid; every backend is its child.
        return int((self.embedded.data_dir / "postmaster.pid").read_text().splitlines()[0])

    def stop(self) -> None:
        self.embedded.stop()


def git_head() -> str:
    """The checkout's commit, for a report's header ("unknown" outside a git checkout)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def start_module(module: str, *arguments: str, log: IO[bytes]) -> subprocess.Popen[str]:
    """`python -m module arguments...` from the checkout with the minimal environment: its stdin and
    stdout piped as text (the drivers' ready/go/result lines), its stderr to the open `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *arguments],
        cwd=REPO_ROOT,
        env=_minimal_env({}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )


def _minimal_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def wait_serving(address: str, process: subprocess.Popen, log_path: Path, timeout: float = 60) -> None:
    """Polls gRPC health (service "") until SERVING; fails with the log's tail if the process dies."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited with {process.returncode}:\n{_tail(log_path)}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"{process.args} did not become SERVING in {timeout}s:\n{_tail(log_path)}")


def wait_history_reconciled(dsn: str, process: subprocess.Popen, log_path: Path, timeout: float = 60) -> None:
    """Waits until a replica has recorded the database's history as reconciled with the core (its
    first seconds on a history, as after a failover, every first-pass release asks the core
    first): the benchmarks measure a fleet past that."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited with {process.returncode}:\n{_tail(log_path)}")
            try:
                row = conn.execute("SELECT queue_history_reconciled()").fetchone()
            except psycopg.errors.UndefinedFunction:
                return  # a service from before the record (an A/B run of an older commit)
            if row is not None and row[0]:
                return
            time.sleep(0.2)
    raise RuntimeError(f"the database history was not recorded as reconciled in {timeout}s:\n{_tail(log_path)}")


def wait_port(port: int, process: subprocess.Popen, log_path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}:\n{_tail(log_path)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{process.args} did not listen on {port} in {timeout}s:\n{_tail(log_path)}")


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


class ManagedProcess:
    """A child process with its log file; stopped with SIGTERM (SIGKILL after a grace)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(args, env=env, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self, grace: float = 20) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class Stack:
    """One service replica and one dev core for a scenario, fresh so peak RSS is the scenario's own.

    With `manual` the core holds judging until `start_judging` (SIGUSR1), which starts it for the
    whole batch, spread over `judging_spread_seconds`; `record_path` receives its timestamped
    events (written when the core stops). `service_command` replaces `queue-service serve` (the
    probes of `bench.instrumented_serve`).
    """

    def __init__(
        self,
        db: Database,
        dsn: str,
        workdir: Path,
        name: str,
        *,
        service_env: dict[str, str] | None = None,
        judging_seconds: float = 1.0,
        judging_spread_seconds: float = 0.0,
        manual: bool = True,
        service_command: list[str] | None = None,
    ) -> None:
        self.db = db
        self.dsn = dsn
        self.name = name
        self.service_port, self.core_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.service_port}"
        self.record_path = workdir / f"{name}.core-events.jsonl"
        core_args = [
            QUEUE_SERVICE,
            "core",
            "--listen",
            f"127.0.0.1:{self.core_port}",
            "--callback",
            self.address,
            "--judging-seconds",
            str(judging_seconds),
            "--judging-spread-seconds",
            str(judging_spread_seconds),
            "--record",
            str(self.record_path),
        ] + (["--manual"] if manual else [])
        self.core = ManagedProcess("core", core_args, _minimal_env({}), workdir / f"{name}.core.log")
        wait_port(self.core_port, self.core.process, self.core.log_path)
        env = {
            "DATABASE_URL": dsn,
            "QUEUE_CORE_ADDR": f"127.0.0.1:{self.core_port}",
            "QUEUE_LISTEN_ADDR": self.address,
            "QUEUE_MIGRATE_ON_START": "false",
            **(service_env or {}),
        }
        self.service = ManagedProcess(
            "service", service_command or [QUEUE_SERVICE, "serve"], _minimal_env(env), workdir / f"{name}.service.log"
        )
        wait_serving(self.address, self.service.process, self.service.log_path)
        wait_history_reconciled(dsn, self.service.process, self.service.log_path)

    def cpu_roots(self) -> dict[str, int]:
        return {"service": self.service.pid, "core": self.core.pid, "postgres": self.db.pid}

    def start_judging(self) -> None:
        self.core.signal(signal.SIGUSR1)

    def stop(self) -> None:
        self.service.stop()
        self.core.stop()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MinimalServer:
    """bench/minimal_server.py as its own process: Admit doing only the admit transaction."""

    def __init__(self, dsn: str, workdir: Path, *, pool_max_size: int = 20, with_core: bool = False, contract: bool = False) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        args = [sys.executable, "-m", "bench.minimal_server", "--listen", self.address, "--dsn", dsn, "--pool-max-size", str(pool_max_size)]
        # A dev core of its own (manual: it only stores the held runs): the runs the floor creates
        # must not be in the core a measured service reconciles with afterwards.
        self.core: ManagedProcess | None = None
        if with_core:
            core_port = free_port()
            core_args = [QUEUE_SERVICE, "core", "--listen", f"127.0.0.1:{core_port}", "--callback", self.address, "--manual"]
            self.core = ManagedProcess("core", core_args, _minimal_env({}), workdir / f"minimal-core-{core_port}.log")
            wait_port(core_port, self.core.process, self.core.log_path)
            args += ["--core", f"127.0.0.1:{core_port}"] + (["--contract"] if contract else [])
        self.proc = ManagedProcess("minimal", args, _minimal_env({}), workdir / f"minimal-server-{self.port}.log")
        wait_serving(self.address, self.proc.process, self.proc.log_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.stop()
        if self.core is not None:
            self.core.stop()

    def __enter__(self) -> MinimalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_driver(task: str, params: dict, cpu_roots: dict[str, int], log_path: Path, timeout: float = 900) -> tuple[dict, dict[str, float]]:
    """Runs `bench.driver <task>`; meters CPU of `cpu_roots` and of the driver itself between the
    driver's "ready" and its result, so set-up and warm-up are not counted."""
    import json

    from bench.measure import CpuMeter

    with open(log_path, "ab") as log:
        driver = start_module("bench.driver", task, json.dumps(params), log=log)
        try:
            assert driver.stdin is not None and driver.stdout is not None
            ready = driver.stdout.readline()
            if not ready.strip():
                driver.wait(30)
                raise RuntimeError(f"driver {task} failed before ready (exit {driver.returncode}):\n{_tail(log_path)}")
            meter = CpuMeter({**cpu_roots, "driver": driver.pid}).start()
            driver.stdin.write("go\n")
            driver.stdin.flush()
            line = driver.stdout.readline()
            cpu = meter.stop()
            driver.wait(timeout)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    if not line.strip():
        raise RuntimeError(f"driver {task} failed (exit {driver.returncode}):\n{_tail(log_path)}")
    return json.loads(line)["result"], cpu


def create_database(db: Database, name: str) -> str:
    """A fresh, migrated database on the same server, so each measured run starts from an empty
    schema (and the history scenario from a truly empty table)."""
    import psycopg

    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = db.embedded.dsn(name)
    asyncio.run(migrations.migrate(dsn))
    return dsn
