"""Hostile input: every RPC with random, empty, oversized and unicode-odd fields.

Every answer must be a clean status (never INTERNAL or UNKNOWN, never a hang past the deadline),
a rejected call must leave no job row and no ledger entry, and the service must stay up. The
service and the dev core run as subprocesses so the fuzzer drives them over real gRPC.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from queue_service.dev.embedded_postgres import free_port
from tests.harness import REPO_ROOT

# Codes a well-behaved service may answer with for garbage; INTERNAL and UNKNOWN are bugs.
CLEAN = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
EXAMPLES = int(os.environ.get("QUEUE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
# A long run (QUEUE_FUZZ_EXAMPLES=2000) takes minutes per test, beyond the suite's default timeout.
FUZZ_TIMEOUT = pytest.mark.timeout(max(300, EXAMPLES))

odd_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=300),
    st.sampled_from(["", "\x00", "a\x00b", "\u202e\u200b", "🧪" * 50, "x" * 10_000, " ", "\n", "10.9999/x", "10.1234/ok"]),
)
uuidish = st.one_of(odd_text, st.uuids().map(str))


class Target:
    def __init__(self, address: str, database_url: str) -> None:
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
        self.queue = queue_grpc.AnalysisQueueServiceStub(self.channel)
        self.credits = credits_grpc.CreditsServiceStub(self.channel)
        self.callback = callback_grpc.CoreCallbackServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.database = psycopg.connect(database_url, autocommit=True)
        self.calls: dict[str, int] = {}

    def footprint(self) -> tuple[int, int]:
        row = self.database.execute("SELECT (SELECT count(*) FROM analysis_jobs), (SELECT count(*) FROM credit_ledger)").fetchone()
        assert row is not None
        return row[0], row[1]

    def call(self, name: str, method, request, *, streaming: bool = False) -> grpc.StatusCode:
        """Calls once; asserts a clean status and, for a refusal, no new rows."""
        before = self.footprint()
        self.calls[name] = self.calls.get(name, 0) + 1
        started = time.monotonic()
        try:
            if streaming:
                stream = method(request, timeout=5)
                next(stream)  # the snapshot's first message proves the stream works
                stream.cancel()
            else:
                method(request, timeout=5)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
            if streaming and code == grpc.StatusCode.CANCELLED:
                code = grpc.StatusCode.OK
        assert time.monotonic() - started < 5, f"{name} took too long"
        assert code in CLEAN, f"{name} answered {code}"
        if code != grpc.StatusCode.OK:
            assert self.footprint() == before, f"a refused {name} left rows behind"
        return code


@pytest.fixture(scope="module")
def target(database_url: str) -> Iterator[Target]:
    service_port, core_port = free_port(), free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "QUEUE_LISTEN_ADDR": f"127.0.0.1:{service_port}",
        "QUEUE_CORE_ADDR": f"127.0.0.1:{core_port}",
        "QUEUE_MIGRATE_ON_START": "false",
        "QUEUE_LOG_LEVEL": "error",
    }
    core = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "queue_service.cli",
            "core",
            "--listen",
            f"127.0.0.1:{core_port}",
            "--callback",
            f"127.0.0.1:{service_port}",
            "--manual",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log_path = f"/tmp/queue-fuzz-{service_port}.log"
    with open(log_path, "wb") as log:
        service = subprocess.Popen([sys.executable, "-m", "queue_service.cli", "serve"], cwd=REPO_ROOT, env=env, stdout=log, stderr=log)
    probe = Target(f"127.0.0.1:{service_port}", database_url)
    for _ in range(200):
        try:
            if probe.health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                break
        except grpc.RpcError:
            time.sleep(0.1)
    yield probe
    probe.database.close()
    alive = service.poll() is None
    service.terminate()
    core.terminate()
    service.wait(10)
    core.wait(10)
    log_text = open(log_path).read()
    assert alive, f"the service died during fuzzing:\n{log_text[-3000:]}"
    assert '"level": "error"' not in log_text, f"the service logged an unexpected error:\n{log_text[-3000:]}"


sources = st.lists(st.builds(job_pb2.Source, doi=odd_text, citation=odd_text), max_size=20)
documents = st.builds(job_pb2.Document, uri=odd_text, title=odd_text)


@FUZZ_TIMEOUT
@FUZZ
@given(user_id=odd_text, key=odd_text, document=documents, sources=sources, delta=uuidish)
def test_admit_answers_cleanly(target: Target, user_id: str, key: str, document: job_pb2.Document, sources: list, delta: str) -> None:
    request = queue_pb2.AdmitRequest(user_id=user_id, idempotency_key=key, document=document, sources=sources, delta_of_job_id=delta)
    target.call("Admit", target.queue.Admit, request)


@FUZZ_TIMEOUT
@FUZZ
@given(
    user_id=odd_text,
    page_size=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    token=odd_text,
    statuses=st.lists(st.integers(min_value=-5, max_value=20), max_size=8),
)
def test_list_jobs_answers_cleanly(target: Target, user_id: str, page_size: int, token: str, statuses: list[int]) -> None:
    request = queue_pb2.ListJobsRequest(user_id=user_id, page_size=page_size, page_token=token, statuses=statuses)
    target.call("ListJobs", target.queue.ListJobs, request)


@FUZZ_TIMEOUT
@FUZZ
@given(
    job_id=uuidish,
    user_id=odd_text,
    run_id=uuidish,
    outcome=st.integers(min_value=-3, max_value=5),
    message=odd_text,
    refund=st.booleans(),
    amount=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    key=odd_text,
)
def test_every_other_rpc_answers_cleanly(
    target: Target, job_id: str, user_id: str, run_id: str, outcome: int, message: str, refund: bool, amount: int, key: str
) -> None:
    target.call("GetJob", target.queue.GetJob, queue_pb2.GetJobRequest(job_id=job_id))
    target.call("CancelJob", target.queue.CancelJob, queue_pb2.CancelJobRequest(job_id=job_id, user_id=user_id))
    target.call("Release", target.queue.Release, queue_pb2.ReleaseRequest(job_id=job_id))
    target.call("Promote", target.queue.Promote, queue_pb2.PromoteRequest(user_id=user_id))
    target.call("GetBalance", target.credits.GetBalance, credits_pb2.GetBalanceRequest(user_id=user_id))
    target.call(
        "CompleteRun",
        target.callback.CompleteRun,
        callback_pb2.CompleteRunRequest(run_id=run_id, outcome=outcome, refund_credit=refund, message=message),
    )
    code = target.call(
        "GrantCredits", target.credits.GrantCredits, credits_pb2.GrantCreditsRequest(user_id=user_id, amount=amount, idempotency_key=key)
    )
    assert code != grpc.StatusCode.OK or 1 <= amount <= 1_000_000
    target.call("WatchJobs", target.queue.WatchJobs, queue_pb2.WatchJobsRequest(user_id=user_id), streaming=True)


@pytest.mark.parametrize(
    ("label", "request_factory", "expected"),
    [
        (
            "10 kB user id",
            lambda: queue_pb2.AdmitRequest(
                user_id="u" * 10_240,
                idempotency_key="k",
                document=job_pb2.Document(uri="s3://x"),
                sources=[job_pb2.Source(doi="10.1234/x")],
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "10 000 sources",
            lambda: queue_pb2.AdmitRequest(
                user_id="u",
                idempotency_key="k",
                document=job_pb2.Document(uri="s3://x"),
                sources=[job_pb2.Source(doi="10.1234/x")] * 10_000,
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "a 6 MB message",
            lambda: queue_pb2.AdmitRequest(
                user_id="u",
                idempotency_key="k",
                document=job_pb2.Document(uri="s3://x"),
                sources=[job_pb2.Source(citation="c" * 4000)] * 1500,
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        (
            "NUL bytes everywhere",
            lambda: queue_pb2.AdmitRequest(
                user_id="u\x00",
                idempotency_key="\x00",
                document=job_pb2.Document(uri="\x00"),
                sources=[job_pb2.Source(doi="10.1234/\x00", citation="\x00")],
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
)
def test_named_hostile_inputs(target: Target, label: str, request_factory, expected: grpc.StatusCode) -> None:
    assert target.call(label, target.queue.Admit, request_factory()) == expected


def test_the_service_is_still_serving_after_the_fuzzing(target: Target) -> None:
    response = target.health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    assert sum(target.calls.values()) > 0
