"""Test harness: PostgreSQL handles, service replicas (in process and as subprocesses), stubs,
and an independent invariant checker that reads the database directly."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import grpc
import psycopg
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from queue_service import deadline as call_deadline
from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2 as callback_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    core_callback_service_pb2_grpc as callback_grpc,
)
from queue_service._gen.acurio.queue.v1 import (
    credits_service_pb2 as credits_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    credits_service_pb2_grpc as credits_grpc,
)
from queue_service._gen.acurio.queue.v1 import (
    job_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2 as queue_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2_grpc as queue_grpc,
)
from queue_service.config import Config
from queue_service.dev.core import DevCore
from queue_service.dev.embedded_postgres import EmbeddedPostgres, free_port
from queue_service.server import QueueApp
from queue_service.store.locks import take_user_queue_lock

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S = job_pb2  # status names: S.JOB_STATUS_QUEUED ...


@dataclasses.dataclass
class PostgresServer:
    admin_dsn: str
    embedded: EmbeddedPostgres | None

    def dsn_for(self, database: str) -> str:
        parts = urlsplit(self.admin_dsn)
        return urlunsplit(parts._replace(path=f"/{database}"))

    def execute_admin(self, sql: str) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]


def new_user() -> str:
    return f"user-{uuid.uuid4().hex[:12]}"


def insert_jobs(conn: psycopg.Connection, users: list[str], *, status: str, slot: int | None = None, key: str = "k") -> None:
    """One job of price 1 for each user, in order, written straight into the table (no admit,
    no ledger): for tests of what the database does with many rows in a given state. A PENDING
    one takes its place at the capacity as the service's writers do (`queue_seat_on_entry`: it
    waits for a grant while the capacity is limited or its releases are paused), no release due."""
    with conn.cursor() as cursor:
        cursor.executemany(
            """INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot, price,
                                          next_release_at, release_attempts, capacity_wait_since, capacity_turn_key)
               SELECT gen_random_uuid(), %(user)s, gen_random_uuid(), %(key)s, '\\x00', %(status)s, nextval('analysis_jobs_queue_seq'),
                      %(slot)s, 1, seat.next_release_at, seat.release_attempts, seat.capacity_wait_since, seat.capacity_turn_key
                 FROM queue_seat_on_entry(%(user)s, %(status)s = 'pending', clock_timestamp(), NULL, 0) AS seat""",
            [{"user": user, "status": status, "slot": slot, "key": key} for user in users],
        )


def nothing_in_flight(database_url: str) -> None:
    """A database that test modules share, as if fresh for the fleet's capacity: every job in
    flight ended (its run settled), no turn recorded, the capacity unlimited and nothing learned of
    the core, no release paused. Written straight into the tables: the jobs' runs at the core are not touched."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """UPDATE analysis_jobs SET status = 'canceled', end_time = clock_timestamp(), run_settle_due_at = NULL,
                      next_release_at = NULL, next_reconcile_at = NULL
                WHERE status IN ('queued', 'pending', 'running') OR run_settle_due_at IS NOT NULL"""
        )
        conn.execute("DELETE FROM user_capacity_turns")
        conn.execute("UPDATE queue_capacity SET capacity = 0, core_limit = NULL, next_probe_at = NULL, core_refusals = 0")
        conn.execute("DELETE FROM queue_release_pauses")


def metric_total(metrics_port: int, name: str, **labels: str) -> float:
    """The sum of a replica's Prometheus series `name` with these label values (any others), read
    from its metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    wanted = [f'{label}="{value}"' for label, value in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith(name + "{") and all(label in line.split("}", 1)[0] for label in wanted)
    )


async def running_with_one_queued(stubs: Stubs) -> tuple[str, job_pb2.Job, job_pb2.Job]:
    """A new user with a RUNNING job (its run judging at a manual core) and a QUEUED one behind it."""
    user = new_user()
    await stubs.grant(user, 2)
    running = await stubs.admit(user)
    queued = await stubs.admit(user)
    assert queued.status == S.JOB_STATUS_QUEUED
    await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
    return user, running, queued


class CheckoutsWithinCalls:
    """Counts a service's pool checkouts made within a caller's call (ones with a deadline):
    background work (the feed's hint, its reader) runs without one and is not counted."""

    def __init__(self, service: ServiceHandle, monkeypatch: Any) -> None:
        self.count = 0
        pool = service.app.store.pool
        getconn = pool.getconn

        async def counted(timeout: float | None = None) -> Any:
            self.count += call_deadline.remaining() is not None
            return await getconn(timeout)

        monkeypatch.setattr(pool, "getconn", counted)


def token_entry(name: str, role: str, token: str) -> dict[str, str]:
    """One bearer token of the auth file, as it stores them: by SHA-256."""
    return {"name": name, "role": role, "sha256": hashlib.sha256(token.encode()).hexdigest()}


def role_tokens(tokens: Mapping[str, str]) -> list[dict[str, str]]:
    """One `<role>-caller` entry per role -> token."""
    return [token_entry(f"{role}-caller", role, token) for role, token in tokens.items()]


def write_auth_file(path: Path, *entries: dict[str, str]) -> None:
    """Writes the auth file with these tokens, swapped in whole (as a Kubernetes Secret volume
    replaces it), so a replica re-reading it never sees half a file."""
    staging = path.with_suffix(".new")
    staging.write_text(json.dumps({"tokens": list(entries)}))
    os.replace(staging, path)


async def one_running_job(service: ServiceHandle) -> tuple[Stubs, str, job_pb2.Job]:
    """A new user with one credit and one job, RUNNING (its run judging at the service's core)."""
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    job = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
    return stubs, user, job


async def cancel_left_unanswered(stubs: Stubs, job_id: str, user: str) -> None:
    """CancelJob while the core's answer cannot be had (lost, or the core unreachable): the caller
    hears UNAVAILABLE with CORE_UNAVAILABLE, not a guess at the outcome."""
    try:
        await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job_id, user_id=user), timeout=10)
    except grpc.aio.AioRpcError as unanswered:
        got = error_info(unanswered)[:2]
        assert got == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE"), got
    else:
        raise AssertionError(f"CancelJob of {job_id} was answered; expected CORE_UNAVAILABLE")


def end_failed_as_a_previous_version(database_url: str, job_id: str) -> None:
    """Ends a RUNNING job FAILED without a refund, as a replica of the previous version did after
    its core canceled the run (it neither sets nor reads the cancel intent): its statement."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE analysis_jobs SET status = 'failed', end_time = clock_timestamp(), next_reconcile_at = NULL,"
            " last_error = 'canceled at the core' WHERE job_id = %s AND status = 'running'",
            (job_id,),
        )


async def eventually(check: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Polls `check()` (sync or async) until it returns a truthy value."""
    give_up_at = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > give_up_at:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def health(stubs: Stubs, service: str = "") -> int | None:
    """The health status of `service` ("": the replica), None when the check fails or times out."""
    try:
        return (await stubs.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=0.5)).status
    except grpc.aio.AioRpcError:
        return None


async def until(check: Any, *, within: float, what: str, every: float = 0.02) -> float:
    """Seconds until the async `check` is true; fails after `within` seconds."""
    started = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - started
        if time.monotonic() - started > within:
            raise AssertionError(f"{what}: not within {within}s")
        await asyncio.sleep(every)


async def stranger_holds_user_locks(database_url: str, user_ids: list[str], seconds: float, holding: asyncio.Event | None = None) -> None:
    """A transaction of nobody in the service (an operator's, a replica of another version's)
    holds the users' queue locks for `seconds`, taken through the one helper that takes them;
    `holding` is set once they are all held."""
    async with await psycopg.AsyncConnection.connect(database_url) as stranger:
        async with stranger.transaction():
            for user_id in sorted(user_ids):
                await take_user_queue_lock(stranger, user_id)
            if holding is not None:
                holding.set()
            await asyncio.sleep(seconds)


def error_info(exc: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, dict[str, str], list[tuple[str, str]]]:
    """(code, ErrorInfo reason, ErrorInfo metadata, BadRequest field violations) of a failed call."""
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    reason, metadata, violations = "", {}, []
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations = [(v.field, v.description) for v in bad.field_violations]
    return exc.code(), reason, metadata, violations


class Stubs:
    """Stubs on one channel, plus helpers for the calls every test makes."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.aio.insecure_channel(address)
        self.queue = queue_grpc.AnalysisQueueServiceStub(self.channel)
        self.credits = credits_grpc.CreditsServiceStub(self.channel)
        self.callback = callback_grpc.CoreCallbackServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def grant(self, user_id: str, amount: int, key: str | None = None) -> int:
        response = await self.credits.GrantCredits(
            credits_pb2.GrantCreditsRequest(user_id=user_id, amount=amount, idempotency_key=key or uuid.uuid4().hex),
            timeout=10,
        )
        return response.balance

    async def balance(self, user_id: str) -> int:
        return (await self.credits.GetBalance(credits_pb2.GetBalanceRequest(user_id=user_id), timeout=10)).balance

    async def admit(
        self,
        user_id: str,
        key: str | None = None,
        *,
        uri: str = "s3://theses/thesis.pdf",
        dois: tuple[str, ...] = ("10.1234/abc",),
        delta_of: str = "",
        timeout: float = 20,
    ) -> job_pb2.Job:
        request = queue_pb2.AdmitRequest(
            user_id=user_id,
            idempotency_key=key or uuid.uuid4().hex,
            document=job_pb2.Document(uri=uri, title="A thesis"),
            sources=[job_pb2.Source(doi=doi, citation=f"Cited {doi}") for doi in dois],
            delta_of_job_id=delta_of,
        )
        return (await self.queue.Admit(request, timeout=timeout)).job

    async def job(self, job_id: str) -> job_pb2.Job:
        return (await self.queue.GetJob(queue_pb2.GetJobRequest(job_id=job_id), timeout=10)).job

    async def jobs(self, user_id: str) -> list[job_pb2.Job]:
        """All of a user's jobs, oldest first."""
        found: list[job_pb2.Job] = []
        token = ""
        while True:
            page = await self.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=user_id, page_size=100, page_token=token), timeout=10)
            found.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return list(reversed(found))

    async def complete(self, run_id: str, *, succeeded: bool = True, refund: bool = False) -> job_pb2.Job:
        outcome = callback_pb2.RUN_OUTCOME_SUCCEEDED if succeeded else callback_pb2.RUN_OUTCOME_FAILED
        request = callback_pb2.CompleteRunRequest(run_id=run_id, outcome=outcome, refund_credit=refund)
        return (await self.callback.CompleteRun(request, timeout=10)).job

    async def wait_for(self, job_id: str, *statuses: int, timeout: float = 15) -> job_pb2.Job:
        deadline = time.monotonic() + timeout
        while True:
            job = await self.job(job_id)
            if job.status in statuses:
                return job
            if time.monotonic() > deadline:
                names = [job_pb2.JobStatus.Name(s) for s in statuses]
                raise AssertionError(f"job {job_id} is {job_pb2.JobStatus.Name(job.status)}, expected one of {names}")
            await asyncio.sleep(0.02)


@dataclasses.dataclass
class ServiceHandle:
    """An in-process replica."""

    app: QueueApp
    core: DevCore
    stubs: Stubs

    @property
    def address(self) -> str:
        return self.stubs.address


@dataclasses.dataclass
class ProcessHandle:
    """A `queue-service serve` subprocess."""

    process: subprocess.Popen[bytes]
    stubs: Stubs
    log_path: str

    @property
    def address(self) -> str:
        return self.stubs.address

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()


def service_config(database_url: str, core_addr: str, **overrides: Any) -> Config:
    settings: dict[str, Any] = {
        "database_url": database_url,
        "core_addr": core_addr,
        "listen_addr": "127.0.0.1:0",
        "migrate_on_start": False,
        "sweep_interval_seconds": 0.0,
        "core_deadline_seconds": 2.0,
        "grace_period_seconds": 2.0,
        "log_format": "text",
    }
    settings.update(overrides)
    return Config.from_env({}, **settings)


class ServiceFactory:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._cores: list[DevCore] = []
        self._apps: list[QueueApp] = []
        self._processes: list[ProcessHandle] = []
        self._stubs: list[Stubs] = []

    async def core(self, **kwargs: Any) -> DevCore:
        kwargs.setdefault("manual", True)
        core = DevCore(**kwargs)
        await core.start("127.0.0.1:0")
        self._cores.append(core)
        return core

    async def start(self, core: DevCore | None = None, **overrides: Any) -> ServiceHandle:
        core = core or await self.core()
        core_addr = overrides.pop("core_addr", f"127.0.0.1:{core.port}")
        database_url = overrides.pop("database_url", self.database_url)
        app = QueueApp(service_config(database_url, core_addr, **overrides))
        port = await app.start()
        self._apps.append(app)
        address = f"127.0.0.1:{port}"
        if not core.callback_addr:
            core.set_callback_addr(address)
        stubs = self.stubs(address)
        return ServiceHandle(app, core, stubs)

    def stubs(self, address: str) -> Stubs:
        stubs = Stubs(address)
        self._stubs.append(stubs)
        return stubs

    async def start_process(
        self, core: DevCore, *, port: int | None = None, descriptor_limit: int | None = None, **env: str
    ) -> ProcessHandle:
        """`descriptor_limit`: the process's RLIMIT_NOFILE (soft and hard), for floods."""
        port = port or free_port()
        environment = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "QUEUE_CORE_ADDR": f"127.0.0.1:{core.port}",
            "QUEUE_LISTEN_ADDR": f"127.0.0.1:{port}",
            "QUEUE_MIGRATE_ON_START": "false",
            "QUEUE_SWEEP_INTERVAL_SECONDS": "0",
            "QUEUE_CORE_DEADLINE_SECONDS": "2",
            "QUEUE_GRACE_PERIOD_SECONDS": "5",
            "QUEUE_LOG_FORMAT": "json",
            **env,
        }
        log_path = f"/tmp/queue-service-{port}.log"
        log_file = open(log_path, "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "queue_service.cli", "serve"],
            env=environment,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (descriptor_limit, descriptor_limit)))
            if descriptor_limit
            else None,
        )
        log_file.close()
        handle = ProcessHandle(process, self.stubs(f"127.0.0.1:{port}"), log_path)
        self._processes.append(handle)
        if not core.callback_addr:
            core.set_callback_addr(handle.address)
        await wait_serving(handle.stubs, process=process, log_path=log_path)
        return handle

    async def close(self) -> None:
        for stubs in self._stubs:
            await stubs.close()
        for app in self._apps:
            await app.stop(grace=0)
        for handle in self._processes:
            if handle.process.poll() is None:
                handle.process.kill()
                handle.process.wait(timeout=10)
        for core in self._cores:
            await core.stop()


async def wait_serving(stubs: Stubs, *, process: subprocess.Popen[bytes] | None = None, log_path: str = "", timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"service exited with {process.returncode}:\n{open(log_path).read()[-3000:]}")
        try:
            response = await stubs.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"service at {stubs.address} not SERVING within {timeout}s")


class InvariantChecker:
    """Reads the database directly (not through the service) and reports invariant violations."""

    def __init__(self, database_url: str, default_max_active: int = 1) -> None:
        self.database_url = database_url
        self.default_max_active = default_max_active
        self.checks_run = 0

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(sql).fetchall()  # type: ignore[arg-type]

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Rows of any read-only query, for checks a test adds of its own."""
        return self._rows(sql)

    def i1_slot_limit(self) -> list[str]:
        self.checks_run += 1
        rows = self._rows(
            f"""SELECT j.user_id, count(*) FROM analysis_jobs j
                  LEFT JOIN user_queue_limits l ON l.user_id = j.user_id
                 WHERE j.status IN ('pending', 'running') AND j.delta_of_job_id IS NULL
                 GROUP BY j.user_id, l.max_active
                HAVING count(*) > COALESCE(l.max_active, {self.default_max_active})"""
        )
        return [f"I1: user {u} has {n} active first-pass jobs" for u, n in rows]

    def i2_fifo(self, *, exempt_adopted_judging: bool = False) -> list[str]:
        """I2. With `exempt_adopted_judging` (after a failover, design I14), jobs adopted back from
        a judging run are left out: they left the queue on the primary that lost them, and come
        back RUNNING with the adoption as their admit and promotion. They are exactly the
        first-pass jobs inserted RUNNING (start_time = create_time): an admit never is, it
        starts at a release after its commit."""
        self.checks_run += 1
        exempt = "AND start_time IS DISTINCT FROM create_time" if exempt_adopted_judging else ""
        rows = self._rows(
            f"""SELECT user_id, job_id FROM (
                   SELECT user_id, job_id, promote_time,
                          lag(promote_time) OVER (PARTITION BY user_id ORDER BY queue_seq) AS previous_promote
                     FROM analysis_jobs
                    WHERE delta_of_job_id IS NULL AND promote_time IS NOT NULL {exempt}) ordered
                WHERE previous_promote > promote_time"""
        )
        return [f"I2: job {j} of user {u} left the queue before an older job" for u, j in rows]

    def i3_ledger(self) -> list[str]:
        self.checks_run += 1
        rows = self._rows(
            """SELECT a.user_id, a.balance, COALESCE(sum(l.amount), 0)
                 FROM credit_accounts a LEFT JOIN credit_ledger l ON l.user_id = a.user_id
                GROUP BY a.user_id, a.balance
               HAVING a.balance <> COALESCE(sum(l.amount), 0) OR a.balance < 0"""
        )
        problems = [f"I3: user {u} balance {b} but ledger sums to {s}" for u, b, s in rows]
        rows = self._rows(
            """SELECT j.job_id, j.price, c.amount FROM analysis_jobs j
                 LEFT JOIN credit_ledger c ON c.job_id = j.job_id AND c.kind = 'charge'
                WHERE j.price > 0 AND (c.amount IS NULL OR c.amount <> -j.price)"""
        )
        problems += [f"I3: job {j} priced {p} has charge {a}" for j, p, a in rows]
        rows = self._rows(
            """SELECT r.job_id, j.status FROM credit_ledger r JOIN analysis_jobs j USING (job_id)
                WHERE r.kind = 'refund' AND j.status NOT IN ('failed', 'canceled', 'succeeded')"""
        )
        problems += [f"I3: job {j} refunded while {s}" for j, s in rows]
        return problems

    def i6_deltas(self) -> list[str]:
        self.checks_run += 1
        rows = self._rows(
            "SELECT job_id FROM analysis_jobs WHERE delta_of_job_id IS NOT NULL AND (status = 'queued' OR slot IS NOT NULL OR promote_time IS NULL)"
        )
        return [f"I6: delta job {j} waited or held a slot" for (j,) in rows]

    def users_waiting_with_free_slot(self) -> set[str]:
        self.checks_run += 1
        rows = self._rows(
            f"""SELECT DISTINCT user_id FROM analysis_jobs q WHERE status = 'queued'
                  AND analysis_jobs_free_slot(user_id, {self.default_max_active}) IS NOT NULL"""
        )
        return {u for (u,) in rows}

    def all_violations(self) -> list[str]:
        return self.i1_slot_limit() + self.i2_fifo() + self.i3_ledger() + self.i6_deltas()

    def count(self, sql: str) -> int:
        return int(self._rows(sql)[0][0])
