"""Drives both client libraries against live `queue-service serve` replicas on one embedded
PostgreSQL, the way a Rust core team and a TypeScript backend team would run them:

1. The Rust example core (`clients/rust/examples/core.rs`) as THE core of a live `serve`:
   five clicks of one user complete in order through its CompleteRun callbacks, a delta
   re-check completes, a cancel reaches it (its GetRun says CANCELED), and its CompleteRun is
   retried across a brief outage of the service (the replica stopped while a run judges).
2. The Rust crate's TLS test against a TLS-enabled replica (certificates made with trustme).
3. The TypeScript live tests that need replicas of their own (drain, restart, a replica that
   checks per-user assertions): they start and stop `queue-service serve` themselves on the
   database and dev core given here.

Usage (from the repository root, with the project's venv):
  .venv/bin/python .ci/clients_live.py --rust-core clients/rust/target/debug/examples/core \
      [--rust-tls-test 'cargo test --features tls-ring --test tls_live'] [--ts-test 'npm run test:replicas']
Every process it starts is stopped on every exit path; any failure exits non-zero.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2  # noqa: E402
from queue_service._gen.acurio.core.v1 import run_service_pb2_grpc as core_grpc  # noqa: E402
from queue_service._gen.acurio.queue.v1 import job_pb2  # noqa: E402
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2  # noqa: E402
from queue_service.dev.embedded_postgres import EmbeddedPostgres, free_port  # noqa: E402
from tests.harness import Stubs, new_user, wait_serving  # noqa: E402

S = job_pb2
QUEUE_SERVICE = [sys.executable, "-m", "queue_service.cli"]


class Processes:
    """Processes started here, each in its own session, with its log in the state folder."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.state / f"{name}.log", "ab")
        process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        log.close()
        self.running.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.state / f"{name}.log").read_text(errors="replace")

    @staticmethod
    def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def stop_all(self) -> None:
        for process in reversed(self.running):
            self.stop(process, timeout=10)


def serve_env(database_url: str, core_addr: str, port: int, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "QUEUE_CORE_ADDR": core_addr,
        "QUEUE_LISTEN_ADDR": f"127.0.0.1:{port}",
        "QUEUE_MIGRATE_ON_START": "false",
        "QUEUE_GRACE_PERIOD_SECONDS": "5",
        "QUEUE_LOG_FORMAT": "text",
        **extra,
    }


async def wait_until(what: str, check, timeout: float = 60):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def rust_core_story(procs: Processes, database_url: str, core_bin: str) -> None:
    core_port, queue_port = free_port(), free_port()
    core_addr, queue_addr = f"127.0.0.1:{core_port}", f"127.0.0.1:{queue_port}"
    core = procs.start(
        "rust-core",
        [core_bin],
        {"CORE_LISTEN_ADDR": core_addr, "QUEUE_CALLBACK_ADDR": queue_addr, "CORE_JUDGING_SECONDS": "1.5"},
    )
    env = serve_env(database_url, core_addr, queue_port)
    queue = procs.start("serve-rust", QUEUE_SERVICE + ["serve"], env)
    stubs = Stubs(queue_addr)
    core_channel = grpc.aio.insecure_channel(core_addr)
    core_stub = core_grpc.RunServiceStub(core_channel)
    try:
        await wait_serving(stubs, process=queue, log_path=str(procs.state / "serve-rust.log"), timeout=90)
        if core.poll() is not None:
            raise AssertionError(f"the Rust core exited:\n{procs.log('rust-core')}")

        # Five clicks of one user: one runs, four wait, each starts after the previous ended.
        started = time.monotonic()
        user = new_user()
        await stubs.grant(user, 10)
        jobs = [await stubs.admit(user, f"click-{n}") for n in range(1, 6)]
        assert [j.status for j in jobs[1:]] == [S.JOB_STATUS_QUEUED] * 4, [S.JobStatus.Name(j.status) for j in jobs]
        done = [await stubs.wait_for(j.job_id, S.JOB_STATUS_SUCCEEDED, timeout=90) for j in jobs]
        for earlier, later in itertools.pairwise(done):
            assert later.start_time.ToDatetime() >= earlier.end_time.ToDatetime(), (earlier, later)
        for job in done:
            assert f"run {job.run_id}: completed" in procs.log("rust-core"), f"no callback from the Rust core for {job.run_id}"
        print(f"five clicks completed in order through the Rust core in {time.monotonic() - started:.1f}s", flush=True)

        # A delta re-check of the first click: starts RUNNING, completes through the core.
        delta = await stubs.admit(user, "delta-1", delta_of=done[0].job_id)
        delta = await stubs.wait_for(delta.job_id, S.JOB_STATUS_SUCCEEDED, timeout=60)
        assert delta.delta_of_job_id == done[0].job_id
        print("delta re-check completed", flush=True)

        # A cancel reaches the core: the run is CANCELED there, no callback follows.
        running = await stubs.admit(user, "to-cancel")
        await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING, timeout=30)
        await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=running.job_id, user_id=user), timeout=10)
        run = (await core_stub.GetRun(core_pb2.GetRunRequest(run_id=running.run_id), timeout=5)).run
        assert run.state == core_pb2.RUN_STATE_CANCELED, core_pb2.RunState.Name(run.state)
        assert (await stubs.job(running.job_id)).status == S.JOB_STATUS_CANCELED
        print("cancel reached the Rust core", flush=True)

        # The core's per-source violations reach the Admit caller (CORE_REJECTED + BadRequest).
        try:
            await stubs.admit(user, "rejected", dois=("10.1234/ok", "10.9999/unregistered"))
            raise AssertionError("the Rust core must reject an unregistered DOI")
        except grpc.aio.AioRpcError as exc:
            from tests.harness import error_info

            code, reason, _, violations = error_info(exc)
            assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "CORE_REJECTED"), (code, reason)
            assert [field for field, _ in violations] == ["sources[1].doi"], violations
        print("the core's per-source violation reached the caller", flush=True)

        # CompleteRun retried across an outage: stop the replica while a run judges, start it
        # again after the core's callback came due; the job completes through the retried call.
        outage_job = await stubs.admit(user, "outage")
        await stubs.wait_for(outage_job.job_id, S.JOB_STATUS_RUNNING, timeout=30)
        await stubs.close()
        assert procs.stop(queue) == 0, procs.log("serve-rust")[-3000:]
        down_since = time.monotonic()

        async def judged() -> bool:
            run = (await core_stub.GetRun(core_pb2.GetRunRequest(run_id=outage_job.run_id), timeout=5)).run
            return run.state == core_pb2.RUN_STATE_SUCCEEDED

        # The core marks the run judged, then calls CompleteRun: refused while we are down.
        await wait_until("the Rust core to finish judging during the outage", judged, timeout=60)
        await asyncio.sleep(1)  # let a few refused attempts pass before the service returns
        queue = procs.start("serve-rust", QUEUE_SERVICE + ["serve"], env)
        stubs = Stubs(queue_addr)
        await wait_serving(stubs, process=queue, log_path=str(procs.state / "serve-rust.log"), timeout=90)
        finished = await stubs.wait_for(outage_job.job_id, S.JOB_STATUS_SUCCEEDED, timeout=60)
        assert f"run {finished.run_id}: completed" in procs.log("rust-core")
        print(f"CompleteRun retried across a {time.monotonic() - down_since:.1f}s outage of the service", flush=True)
    except BaseException:
        print(f"--- Rust core log:\n{procs.log('rust-core')[-4000:]}\n--- service log:\n{procs.log('serve-rust')[-4000:]}", flush=True)
        raise
    finally:
        await stubs.close()
        await core_channel.close()
        assert procs.stop(queue) == 0, "the replica did not drain cleanly"
        procs.stop(core)


async def with_tls_replica(procs: Processes, database_url: str, command: str) -> None:
    import trustme

    ca = trustme.CA()
    folder = procs.state / "pki"
    folder.mkdir()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(folder / "server.key"))
    server.cert_chain_pems[0].write_to_path(str(folder / "server.pem"))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(folder / "server.pem"), append=True)
    core_port, port = free_port(), free_port()
    core = procs.start(
        "tls-dev-core", QUEUE_SERVICE + ["core", "--listen", f"127.0.0.1:{core_port}", "--callback", f"127.0.0.1:{port}"], {}
    )
    env = serve_env(
        database_url,
        f"127.0.0.1:{core_port}",
        port,
        QUEUE_TLS_CERT_FILE=str(folder / "server.pem"),
        QUEUE_TLS_KEY_FILE=str(folder / "server.key"),
    )
    queue = procs.start("serve-tls", QUEUE_SERVICE + ["serve"], env)
    try:
        stubs = Stubs(f"127.0.0.1:{port}")
        await stubs.close()  # the plaintext channel is no use here: a TLS one takes its place
        credentials = grpc.ssl_channel_credentials(root_certificates=(folder / "ca.pem").read_bytes())
        stubs.channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials)
        stubs.health = health_pb2_grpc.HealthStub(stubs.channel)
        try:
            await wait_serving(stubs, process=queue, log_path=str(procs.state / "serve-tls.log"), timeout=90)
        finally:
            await stubs.channel.close()
        run(command, {"QUEUE_TLS_ADDR": f"127.0.0.1:{port}", "QUEUE_TLS_CA_FILE": str(folder / "ca.pem")})
    finally:
        assert procs.stop(queue) == 0, procs.log("serve-tls")[-3000:]
        procs.stop(core)


def run(command: str, env: dict[str, str]) -> None:
    print(f"$ {command}", flush=True)
    subprocess.run(shlex.split(command), env={**os.environ, **env}, check=True, cwd=os.getcwd())


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rust-core", help="the built Rust example core")
    parser.add_argument("--rust-tls-test", help="a command run with QUEUE_TLS_ADDR and QUEUE_TLS_CA_FILE of a TLS replica")
    parser.add_argument(
        "--ts-test", help="a command run with QUEUE_TEST_DATABASE_URL and QUEUE_TEST_CORE_ADDR (it starts its own replicas)"
    )
    args = parser.parse_args()

    state = Path(tempfile.mkdtemp(prefix="acurio-clients-live."))
    procs = Processes(state)
    database = EmbeddedPostgres(state / "pg", durable=False)
    try:
        database_url = database.start()
        subprocess.run(QUEUE_SERVICE + ["migrate"], env={**os.environ, "DATABASE_URL": database_url}, check=True, cwd=REPO)
        if args.rust_core:
            await rust_core_story(procs, database_url, str(Path(args.rust_core).resolve()))
        if args.rust_tls_test:
            await with_tls_replica(procs, database_url, args.rust_tls_test)
        if args.ts_test:
            core_port = free_port()
            # The replicas the tests start share this core; it calls back whichever address a
            # test names first (QUEUE_TEST_CALLBACK_PORT is reserved for that replica).
            callback_port = free_port()
            core = procs.start(
                "ts-dev-core",
                QUEUE_SERVICE
                + ["core", "--listen", f"127.0.0.1:{core_port}", "--callback", f"127.0.0.1:{callback_port}", "--judging-seconds", "1"],
                {},
            )
            try:
                run(
                    args.ts_test,
                    {
                        "QUEUE_TEST_DATABASE_URL": database_url,
                        "QUEUE_TEST_CORE_ADDR": f"127.0.0.1:{core_port}",
                        "QUEUE_TEST_CALLBACK_PORT": str(callback_port),
                        "QUEUE_SERVICE_PYTHON": sys.executable,
                        "QUEUE_SERVICE_ROOT": str(REPO),
                    },
                )
            finally:
                procs.stop(core)
        return 0
    finally:
        procs.stop_all()
        database.stop(mode="immediate")
        subprocess.run(["rm", "-rf", str(state)], check=False)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
