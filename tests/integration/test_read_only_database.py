"""The service's connections reach a read-only PostgreSQL: during a failover, a router (HAProxy on
Patroni's /primary check) can for a moment send new connections to a member that is not yet, or
no longer, the primary. A write there fails with ReadOnlySqlTransaction (SQLSTATE 25006); the
caller must hear the retryable UNAVAILABLE DATABASE_UNAVAILABLE, never INTERNAL. (Seen in
tests/failover/test_patroni_failover.py: Admits answered INTERNAL around a promotion.)

The fault, for real and cheaply: the database's sessions default to read-only
(`default_transaction_read_only`), and the service's connections are cut so that it reconnects
into read-only sessions. A connection that met a read-only node is closed, so the pool's next
one follows the route to the primary."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import psycopg

from tests.harness import ServiceFactory, error_info, new_user


def _cut_connections(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


async def test_a_write_on_a_read_only_node_is_retryable_unavailable(services: ServiceFactory, database_url: str) -> None:
    service = await services.start()
    user = new_user()
    await service.stubs.grant(user, 5)
    name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')  # type: ignore[arg-type]
    try:
        _cut_connections(database_url)
        answered = []
        for _ in range(3):
            try:
                await service.stubs.admit(user, timeout=5)
                answered.append(("OK", ""))
            except grpc.aio.AioRpcError as exc:
                code, reason, _, _ = error_info(exc)
                answered.append((code.name, reason))
        assert answered and all(a == ("UNAVAILABLE", "DATABASE_UNAVAILABLE") for a in answered), answered
    finally:
        with psycopg.connect(database_url, autocommit=True, options="-c default_transaction_read_only=off") as conn:
            conn.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')  # type: ignore[arg-type]
    # The route leads to a writable node again (here: new sessions are writable; the read-only
    # ones stay so). The replica admits once its pool has closed each connection that met the
    # read-only node and opened new ones: no connection is lent forever to a standby. A caller
    # retries UNAVAILABLE with the same key.
    key = uuid.uuid4().hex
    for _ in range(50):
        try:
            job = await service.stubs.admit(user, key, timeout=5)
            break
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            await asyncio.sleep(0.1)
    else:
        raise AssertionError("still UNAVAILABLE with the database writable again")
    assert job.job_id
