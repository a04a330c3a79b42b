"""The service knows what its commits wait for, from the database itself, and says so: a start-up
log line, the gauge queue.db.synchronous_replication (1 with its mode when commits wait for a
connected synchronous standby), and health when they wait for a standby that is gone.

A real primary and streaming standby of the embedded PostgreSQL (pg_basebackup), with
synchronous_standby_names = '*': first synchronous, then the standby stops (a stalled
synchronous standby: every commit waits) and comes back."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from queue_service.dev.embedded_postgres import SYSTEM_USER, EmbeddedPostgres, free_port
from queue_service.store import migrations
from tests.harness import NOT_SERVING, SERVING, ServiceFactory, health, new_user, until


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    state = Path(tempfile.mkdtemp(prefix="acurio-queue-replication-"))
    primary = EmbeddedPostgres(state / "primary", durable=True, max_connections=100, shared_buffers="32MB")
    primary.start()
    standby: EmbeddedPostgres | None = None
    try:
        standby_dir = state / "standby"
        standby = EmbeddedPostgres(standby_dir, durable=True, max_connections=100, shared_buffers="32MB")
        standby_dir.mkdir(mode=0o700)
        if os.geteuid() == 0:  # the embedded PostgreSQL runs as its own user: its folder is that user's
            account = pwd.getpwnam(SYSTEM_USER)
            os.chown(state, account.pw_uid, account.pw_gid)
            os.chown(standby_dir, account.pw_uid, account.pw_gid)
        primary._pg(
            "pg_basebackup",
            "-D",
            str(standby_dir),
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "--checkpoint=fast",
            timeout=120,
        )
        standby.start()
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop(mode="immediate")
        primary.stop(mode="immediate")
        shutil.rmtree(state, ignore_errors=True)


def _admin(pg: EmbeddedPostgres, sql: str) -> None:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


async def test_the_replica_reports_synchronous_replication_and_a_standby_that_stops(primary_and_standby) -> None:
    primary, standby = primary_and_standby
    _admin(primary, "CREATE DATABASE queue")
    await migrations.migrate(primary.dsn("queue"))
    _admin(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
    _admin(primary, "SELECT pg_reload_conf()")

    def synchronous_standbys() -> int:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            return int(conn.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").fetchone()[0])

    for _ in range(100):
        if synchronous_standbys():
            break
        await asyncio.sleep(0.1)
    assert synchronous_standbys() == 1

    factory = ServiceFactory(primary.dsn("queue"))
    metrics_port = free_port()
    try:
        core = await factory.core()
        replica = await factory.start_process(core, QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}", QUEUE_HEALTH_INTERVAL_SECONDS="0.2")
        user = new_user()
        await replica.stubs.grant(user, 1)
        await replica.stubs.admit(user)

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
                return response.read().decode()

        gauge = [line for line in (await asyncio.to_thread(scrape)).splitlines() if line.startswith("queue_db_synchronous_replication{")]
        assert gauge and 'mode="synchronous"' in gauge[0] and gauge[0].endswith(" 1.0"), gauge
        assert "durability: replication synchronous" in replica.log()

        async def not_serving() -> bool:
            return await health(replica.stubs) == NOT_SERVING

        async def serving() -> bool:
            return await health(replica.stubs) == SERVING

        standby.stop(mode="immediate")  # commits now wait for a standby that is gone
        lag = await until(not_serving, within=5, what="readiness NOT_SERVING while the synchronous standby is gone")
        assert await health(replica.stubs, "liveness") == SERVING
        standby.start()
        back = await until(serving, within=30, what="readiness SERVING once the standby is back")
        print(f"\nsynchronous standby stopped: readiness NOT_SERVING after {lag:.2f}s; standby restarted: SERVING after {back:.2f}s")
        assert lag < 0.2 + 1.0 + 0.3
        log = replica.log()
        assert "database cannot take writes" in log and "database writable again" in log
        assert await replica.stubs.balance(user) == 0  # and the admit's charge is on both nodes
    finally:
        await factory.close()
