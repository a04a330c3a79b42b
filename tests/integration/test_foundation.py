"""Foundation: migrations, health, reflection, configuration errors, graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid

import grpc
import psycopg
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from queue_service._gen.acurio.queue.v1 import operator_service_pb2
from queue_service.store import migrations
from tests.harness import REPO_ROOT, PostgresServer, new_user, wait_serving


def _run_cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "queue_service.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )


@pytest.fixture
def empty_database(postgres: PostgresServer):
    name = f"empty_{uuid.uuid4().hex[:8]}"
    postgres.execute_admin(f'CREATE DATABASE "{name}"')
    yield postgres.dsn_for(name)
    postgres.execute_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrations_apply_in_parallel_from_two_processes_and_again_idempotently(empty_database: str) -> None:
    env = {"DATABASE_URL": empty_database}
    command = [sys.executable, "-m", "queue_service.cli", "migrate"]
    racers = [
        subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
        for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=60) for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0], outputs
    applied_lines = sorted(out.strip() for out, _ in outputs)
    every_version = [m.version for m in migrations.available_migrations()]
    assert applied_lines == [f"applied migrations: {every_version}", "applied migrations: none (schema is current)"]

    again = _run_cli("migrate", env=env)
    assert again.returncode == 0 and "none (schema is current)" in again.stdout

    with psycopg.connect(empty_database) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM queue_schema_migrations ORDER BY version")]
        assert versions == [m.version for m in migrations.available_migrations()]
        assert conn.execute("SELECT to_regclass('analysis_jobs') IS NOT NULL").fetchone() == (True,)


async def test_an_edited_applied_migration_is_refused(empty_database: str) -> None:
    await migrations.migrate(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("UPDATE queue_schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(migrations.MigrationError, match="edited after it was applied"):
        await migrations.migrate(empty_database)


async def test_health_is_serving_and_reflection_lists_our_services(service) -> None:
    response = await service.stubs.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert response.status == health_pb2.HealthCheckResponse.SERVING
    queue_health = await service.stubs.health.Check(
        health_pb2.HealthCheckRequest(service="acurio.queue.v1.AnalysisQueueService"), timeout=5
    )
    assert queue_health.status == health_pb2.HealthCheckResponse.SERVING

    def list_services() -> list[str]:
        with grpc.insecure_channel(service.address) as channel:
            return ProtoReflectionDescriptorDatabase(channel).get_services()

    names = await asyncio.to_thread(list_services)
    assert {
        "acurio.queue.v1.AnalysisQueueService",
        "acurio.queue.v1.CoreCallbackService",
        "acurio.queue.v1.CreditsService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= set(names)


async def test_reflection_serves_the_contracts_comments(service) -> None:
    """A newcomer reading the contract through reflection (`grpcurl describe`) sees what a field
    means, not only its name: SetUserQueueLimitRequest.max_active is a user's active jobs, not a
    queue cap."""

    def max_active_comment() -> tuple[str, list[str]]:
        with grpc.insecure_channel(service.address) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="acurio.queue.v1.SetUserQueueLimitRequest")
            response = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=10)))
        files = [descriptor_pb2.FileDescriptorProto.FromString(raw) for raw in response.file_descriptor_response.file_descriptor_proto]
        operator = next(f for f in files if f.name == "acurio/queue/v1/operator_service.proto")
        message_index = [m.name for m in operator.message_type].index("SetUserQueueLimitRequest")
        field_index = [f.name for f in operator.message_type[message_index].field].index("max_active")
        # The path of a field in its file: message_type (4), the message, field (2), the field.
        path = [4, message_index, 2, field_index]
        comments = [loc.leading_comments for loc in operator.source_code_info.location if list(loc.path) == path]
        # Otherwise the very descriptor the generated module has (no json_name that would make
        # grpcurl print camelCase, no field of another version of the protos).
        served = descriptor_pb2.FileDescriptorProto()
        served.CopyFrom(operator)
        served.ClearField("source_code_info")
        generated = descriptor_pb2.FileDescriptorProto()
        operator_service_pb2.DESCRIPTOR.CopyToProto(generated)
        assert served == generated
        return " ".join(comments), sorted(f.name for f in files)

    comment, names = await asyncio.to_thread(max_active_comment)
    assert "First-pass jobs of the user active at once" in comment
    # The imports go along (with their comments too), so a client can resolve every type.
    assert {"acurio/queue/v1/job.proto", "google/protobuf/timestamp.proto"} <= set(names)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("QUEUE_MAX_ACTIVE_PER_USER", "abc", "QUEUE_MAX_ACTIVE_PER_USER='abc': expected an integer between 1 and 1000"),
        ("QUEUE_LISTEN_ADDR", "nowhere", "QUEUE_LISTEN_ADDR='nowhere': expected host:port"),
        ("QUEUE_RELEASE_WINDOW_SECONDS", "-5", "QUEUE_RELEASE_WINDOW_SECONDS='-5': expected a number"),
        ("QUEUE_MIGRATE_ON_START", "maybe", "QUEUE_MIGRATE_ON_START='maybe': expected true or false"),
    ],
)
def test_a_malformed_config_value_fails_start_up_with_a_clear_message(variable: str, value: str, expected: str, database_url: str) -> None:
    result = _run_cli("serve", env={"DATABASE_URL": database_url, "QUEUE_CORE_ADDR": "127.0.0.1:1", variable: value}, timeout=30)
    assert result.returncode == 2
    assert expected in result.stderr


def test_serve_without_a_database_says_what_to_set() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "QUEUE_CORE_ADDR")}
    result = subprocess.run(
        [sys.executable, "-m", "queue_service.cli", "serve"], env=env, capture_output=True, text=True, timeout=30, cwd=REPO_ROOT
    )
    assert result.returncode == 2
    assert "DATABASE_URL, QUEUE_CORE_ADDR must be set" in result.stderr


async def test_sigterm_drains_in_flight_calls_reports_not_serving_and_exits_zero(services) -> None:
    core = await services.core()
    replica = await services.start_process(core)
    user = new_user()
    await replica.stubs.grant(user, 10)
    core.slow_seconds = 1.0  # an admit in flight while the drain starts
    in_flight = asyncio.create_task(replica.stubs.admit(user))
    await asyncio.sleep(0.3)
    replica.terminate()
    job = await in_flight
    assert job.job_id
    exit_code = await asyncio.to_thread(replica.process.wait, 15)
    assert exit_code == 0, replica.log()[-2000:]
    assert '"draining' in replica.log()


async def test_subprocess_replica_serves_health(services) -> None:
    core = await services.core()
    replica = await services.start_process(core)
    await wait_serving(replica.stubs)
    assert replica.process.poll() is None


async def test_a_serving_replica_freezes_its_start_up_objects_out_of_garbage_collection(services) -> None:
    # Full collections would otherwise walk every module and descriptor with the event loop
    # stopped (docs/scaling.md, "Latency stalls"); the count comes from gc.get_freeze_count().
    core = await services.core()
    replica = await services.start_process(core)
    frozen = None
    for _ in range(100):  # the line follows SERVING by one collection
        frozen = re.search(r"start-up objects frozen out of garbage collection: (\d+)", replica.log())
        if frozen:
            break
        await asyncio.sleep(0.1)
    assert frozen is not None, replica.log()[-2000:]
    assert int(frozen[1]) > 10_000
    await replica.stubs.grant(new_user(), 1)  # still serving after the freeze
