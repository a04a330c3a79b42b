"""Through a real PgBouncer in transaction mode (Debian's `pgbouncer`, run as the `postgres`
user on a loopback port in front of the test PostgreSQL), with few server connections so that
the replica's pooled connections share them.

PgBouncer before 1.21 (and later ones with max_prepared_statements = 0) does not know of
prepared statements: psycopg prepares a statement it has run five times on a connection, and
another client's server connection then lacks it, or already has one of that name. With
QUEUE_DB_PREPARED_STATEMENTS=false the service prepares nothing and works; with the default,
each clash is answered UNAVAILABLE DATABASE_UNAVAILABLE (retryable), never INTERNAL."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import grpc
import pytest

from queue_service.config import Config
from queue_service.dev.embedded_postgres import free_port
from tests.harness import S, ServiceFactory, error_info, new_user

_BOUNCER_USER = "postgres"


def _missing() -> str:
    if shutil.which("pgbouncer") is None:
        return "needs Debian's pgbouncer (apt-get install pgbouncer; CI installs it)"
    try:
        pwd.getpwnam(_BOUNCER_USER)
    except KeyError:
        return f"needs a user {_BOUNCER_USER!r} to run pgbouncer as (it refuses root)"
    return ""


if _missing() and os.environ.get("CI") != "true":
    pytestmark = pytest.mark.skip(reason=_missing())


def _version() -> tuple[int, ...]:
    first = subprocess.run(["pgbouncer", "--version"], capture_output=True, text=True, check=True).stdout.split()
    return tuple(int(part) for part in first[1].split(".")[:2])


@contextlib.asynccontextmanager
async def pgbouncer(database_url: str, *, server_connections: int) -> AsyncIterator[str]:
    """A transaction-mode PgBouncer in front of `database_url`'s server; yields its DSN."""
    assert not _missing(), _missing()
    target = urlsplit(database_url)
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="acurio-queue-pgbouncer-"))
    user = target.username or "postgres"
    (folder / "userlist.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={target.hostname} port={target.port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {server_connections}\n"
        "max_client_conn = 500\n"
        # 1.21 and later can track prepared statements; off, as in the versions before.
        + ("max_prepared_statements = 0\n" if _version() >= (1, 21) else "")
        + f"logfile = {folder / 'pgbouncer.log'}\n"
        f"pidfile = {folder / 'pgbouncer.pid'}\n"
    )
    account = pwd.getpwnam(_BOUNCER_USER)
    os.chown(folder, account.pw_uid, account.pw_gid)
    for entry in folder.iterdir():
        os.chown(entry, account.pw_uid, account.pw_gid)
    process = subprocess.Popen(
        ["pgbouncer", str(folder / "pgbouncer.ini")],
        user=account.pw_uid,
        group=account.pw_gid,
        stdout=open(folder / "stderr.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert process.poll() is None, (folder / "stderr.log").read_text()
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.05)
        yield urlunsplit(target._replace(netloc=f"{user}@127.0.0.1:{port}"))
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


async def _load(stubs, users: list[str], job_ids: list[str], rounds: int) -> list[tuple[str, str]]:
    """Reads and admits from several tasks at once; the (code, reason) of every failed call."""
    failures: list[tuple[str, str]] = []

    async def one(user: str, job_id: str) -> None:
        for _ in range(rounds):
            for call in (lambda: stubs.job(job_id), lambda: stubs.jobs(user), lambda: stubs.balance(user)):
                try:
                    await call()
                except grpc.aio.AioRpcError as exc:
                    code, reason, _, _ = error_info(exc)
                    failures.append((code.name, reason))

    await asyncio.gather(*(one(user, job_id) for user, job_id in zip(users, job_ids, strict=True)))
    return failures


async def _retrying(call):
    """As a client does: the call again on UNAVAILABLE (its idempotency key, where it has one,
    unchanged)."""
    for _ in range(20):
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
    raise AssertionError("still UNAVAILABLE after 20 tries")


async def _users_with_a_job(stubs, count: int) -> tuple[list[str], list[str]]:
    users = [new_user() for _ in range(count)]
    job_ids = []
    for user in users:
        grant_key, admit_key = uuid.uuid4().hex, uuid.uuid4().hex
        await _retrying(lambda user=user, grant_key=grant_key: stubs.grant(user, 5, key=grant_key))
        job_ids.append((await _retrying(lambda user=user, admit_key=admit_key: stubs.admit(user, key=admit_key))).job_id)
    return users, job_ids


_KNOWN = {field.name for field in dataclasses.fields(Config)}


async def test_without_server_side_preparation_the_service_works_through_pgbouncer_in_transaction_mode(database_url: str) -> None:
    async with pgbouncer(database_url, server_connections=2) as bouncer_url:
        factory = ServiceFactory(database_url)
        try:
            overrides = {"db_prepared_statements": False} if "db_prepared_statements" in _KNOWN else {}
            service = await factory.start(database_url=bouncer_url, listen_database_url=database_url, pool_max_size=8, **overrides)
            users, job_ids = await _users_with_a_job(service.stubs, 8)
            failures = await _load(service.stubs, users, job_ids, rounds=10)
            assert failures == []
            # The whole road: a run finishes, its job succeeds, the next is released.
            second = await service.stubs.admit(users[0])
            await service.core.finish((await service.stubs.job(job_ids[0])).run_id)
            await service.stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
        finally:
            await factory.close()


async def test_prepared_statement_clashes_behind_pgbouncer_are_retryable_unavailable(database_url: str, caplog) -> None:
    """With preparation on (the default) behind such a pooler, a statement prepared on one server
    connection and missing (or taken) on the next is answered UNAVAILABLE DATABASE_UNAVAILABLE
    with RetryInfo and logged naming the setting. (A bind against another client's statement of
    the same name cannot be told from a bug, and may even read the wrong rows: hence the
    setting.)"""
    caplog.set_level(logging.WARNING, logger="queue_service.store.pool")
    async with pgbouncer(database_url, server_connections=2) as bouncer_url:
        factory = ServiceFactory(database_url)
        try:
            direct = await factory.start()
            users, job_ids = await _users_with_a_job(direct.stubs, 8)
            service = await factory.start(direct.core, database_url=bouncer_url, listen_database_url=database_url, pool_max_size=8)
            failures = await _load(service.stubs, users, job_ids, rounds=10)
        finally:
            await factory.close()
    clashes = [r for r in caplog.records if "prepared statement clash" in r.getMessage()]
    unavailable = failures.count(("UNAVAILABLE", "DATABASE_UNAVAILABLE"))
    print(
        f"\nprepared statements behind a transaction-mode PgBouncer: {len(failures)} of {8 * 10 * 3} calls failed, "
        f"{unavailable} UNAVAILABLE DATABASE_UNAVAILABLE, {len(clashes)} clashes logged, others: {sorted(set(failures))}"
    )
    # Each clash logged is one call answered UNAVAILABLE (others are too: a bind the server found
    # malformed is a protocol violation, a lost connection to it).
    assert 0 < len(clashes) <= unavailable
