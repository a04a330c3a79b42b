"""Bounded waits: a stuck user lock, a caller's deadline, an exhausted pool, a hung core."""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import psycopg

from queue_service._gen.acurio.core.v1 import run_service_pb2
from queue_service._gen.acurio.queue.v1 import credits_service_pb2, job_pb2, queue_service_pb2
from queue_service.api.servicers import validation
from tests.harness import error_info, eventually, new_user


def _lock_waiters(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()"
        ).fetchone()[0]


async def test_a_callers_deadline_bounds_the_lock_wait_and_is_answered_before_it_passes(service, database_url: str) -> None:
    """The caller's deadline (0.8 s) is shorter than the lock timeout (5 s): the service gives up
    on the lock in time to say why (LOCK_TIMEOUT), instead of leaving the caller to time out."""
    user = new_user()
    await service.stubs.grant(user, 1)
    async with service.app.store.holding_user_queue_lock(user):
        started = time.monotonic()
        try:
            await service.stubs.admit(user, timeout=0.8)
            raise AssertionError("the admit should not get past the held lock")
        except grpc.aio.AioRpcError as exc:
            assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "LOCK_TIMEOUT")
        assert time.monotonic() - started < 0.8

        # Nobody still waits for the lock, and the admit's held run is canceled (I5): both end on
        # the database's and the core's side in their own time (on one starved core, after the
        # answer), so they are awaited, well within the 5 s lock timeout a hang would take.
        async def no_lock_waiter() -> bool:
            return await asyncio.to_thread(_lock_waiters, database_url) == 0

        await eventually(no_lock_waiter, timeout=2.0, what="no lock waiter")
        await eventually(lambda: [r for r in service.core.runs.values() if r.state == 1] == [], timeout=2.0, what="the held run canceled")
    assert await service.stubs.balance(user) == 1
    assert await service.stubs.jobs(user) == []


async def test_a_stuck_user_lock_is_lock_timeout_not_a_hang(services) -> None:
    service = await services.start(lock_timeout_ms=300)
    user = new_user()
    await service.stubs.grant(user, 1)
    async with service.app.store.holding_user_queue_lock(user):
        try:
            await service.stubs.admit(user, timeout=10)
            raise AssertionError("the admit should time out on the lock")
        except grpc.aio.AioRpcError as exc:
            assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "LOCK_TIMEOUT")
    # Nothing stuck: the same user is admitted as soon as the lock is free; the spare held run is gone.
    job = await service.stubs.admit(user)
    assert job.job_id
    # The refused admit's held run is canceled in the background when the core is slower than the
    # caller's answer (I5: the run does not outlive the failed admit; the sweeper makes it durable).
    await eventually(
        lambda: [r for r in service.core.runs.values() if r.state == 1 and r.run_id != job.run_id] == [],
        timeout=5.0,
        what="the spare held run canceled",
    )


async def test_an_exhausted_pool_is_unavailable_quickly(services) -> None:
    service = await services.start(pool_min_size=1, pool_max_size=1, pool_timeout_seconds=0.3)
    user = new_user()
    async with service.app.store.pool.connection():  # the only connection is busy
        started = time.monotonic()
        try:
            await service.stubs.balance(user)
            raise AssertionError("the call should not find a connection")
        except grpc.aio.AioRpcError as exc:
            assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
        assert time.monotonic() - started < 2
    assert await service.stubs.balance(user) == 0


async def test_a_hung_core_is_core_unavailable_before_the_callers_deadline(services) -> None:
    core = await services.core()
    service = await services.start(core, core_deadline_seconds=0.5)
    user = new_user()
    await service.stubs.grant(user, 1)
    core.slow_seconds = 30
    started = time.monotonic()
    try:
        await service.stubs.admit(user, timeout=10)
        raise AssertionError("a hung core must not admit")
    except grpc.aio.AioRpcError as exc:
        assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE")
    assert time.monotonic() - started < 2
    core.slow_seconds = 0
    assert await service.stubs.balance(user) == 1


async def test_health_follows_the_database_and_the_pool_recovers_by_itself(tmp_path) -> None:
    from grpc_health.v1 import health_pb2

    from queue_service.dev.embedded_postgres import EmbeddedPostgres
    from queue_service.store import migrations
    from tests.harness import ServiceFactory

    database = EmbeddedPostgres(tmp_path / "pg", durable=False)
    database.start()
    factory = ServiceFactory(database.dsn())
    try:
        await migrations.migrate(database.dsn())
        service = await factory.start(pool_timeout_seconds=0.5, health_interval_seconds=0.2)
        user = new_user()
        await service.stubs.grant(user, 1)

        async def health() -> int:
            return (await service.stubs.health.Check(health_pb2.HealthCheckRequest(), timeout=2)).status

        async def wait_health(expected: int) -> None:
            for _ in range(100):
                if await health() == expected:
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"health never became {expected}")

        await asyncio.to_thread(database.stop)
        await wait_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        started = time.monotonic()
        try:
            await service.stubs.balance(user)
            raise AssertionError("no database, no balance")
        except grpc.aio.AioRpcError as exc:
            assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
        assert time.monotonic() - started < 3

        await asyncio.to_thread(database.start)
        await wait_health(health_pb2.HealthCheckResponse.SERVING)
        for _ in range(50):  # the pool replaces its broken connections by itself
            try:
                assert await service.stubs.balance(user) == 1
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the pool did not recover")
        job = await service.stubs.admit(user)
        await service.stubs.wait_for(job.job_id, 3)
    finally:
        await factory.close()
        database.stop(mode="immediate")


async def test_a_loop_that_survives_one_cancellation_is_still_stopped() -> None:
    """psycopg reports a statement it cancelled as QueryCanceled; a loop that handles errors would
    survive a single cancel, and a drain would then wait forever."""
    from queue_service.background import cancel_and_wait

    swallowed = 0

    async def stubborn_loop() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # what a translated QueryCanceled looks like to the loop

    task = asyncio.create_task(stubborn_loop())
    await asyncio.sleep(0)
    started = time.monotonic()
    await cancel_and_wait(task, timeout=5)
    assert task.done() and swallowed == 1
    assert time.monotonic() - started < 1


# -- every wait inside a call is bounded by the caller's deadline (CI was red on a slower machine)


async def test_a_hung_core_answers_before_a_callers_deadline_shorter_than_the_core_deadline(services) -> None:
    """The core deadline (5 s) is longer than the caller's (1 s): CreateRun may use only part of
    what is left, so the caller hears CORE_UNAVAILABLE in time, not DEADLINE_EXCEEDED, and
    nothing is charged."""
    core = await services.core()
    service = await services.start(core, core_deadline_seconds=5.0)
    user = new_user()
    await service.stubs.grant(user, 1)
    core.slow_seconds = 3
    started = time.monotonic()
    try:
        await service.stubs.admit(user, timeout=1.0)
        raise AssertionError("a hung core must not admit")
    except grpc.aio.AioRpcError as exc:
        assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE")
    assert time.monotonic() - started < 1.0
    assert await service.stubs.balance(user) == 1


async def test_a_pool_checkout_is_bounded_by_the_callers_deadline(services) -> None:
    service = await services.start(pool_min_size=1, pool_max_size=1, pool_timeout_seconds=5.0)
    user = new_user()
    async with service.app.store.pool.connection():  # the only connection is busy for longer than the caller waits
        started = time.monotonic()
        try:
            await service.stubs.credits.GetBalance(credits_service_pb2.GetBalanceRequest(user_id=user), timeout=0.6)
            raise AssertionError("the call should not find a connection")
        except grpc.aio.AioRpcError as exc:
            assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
        assert time.monotonic() - started < 0.6


async def test_calls_beyond_the_replicas_cap_wait_their_turn_or_hear_replica_busy_in_time(services) -> None:
    """One call at a time: a second call waits while its deadline allows (at most half of it),
    then hears REPLICA_BUSY, in time to retry elsewhere; a patient one gets its turn."""
    core = await services.core()
    service = await services.start(core, max_concurrent_calls=1, core_deadline_seconds=5.0)
    user, other = new_user(), new_user()
    await service.stubs.grant(user, 1)
    core.slow_seconds = 1.5
    first = asyncio.create_task(service.stubs.admit(user, timeout=10))
    await asyncio.sleep(0.3)  # the first admit holds the only turn, waiting for the slow core
    started = time.monotonic()
    try:
        await service.stubs.credits.GetBalance(credits_service_pb2.GetBalanceRequest(user_id=other), timeout=1.0)
        raise AssertionError("no turn within the deadline")
    except grpc.aio.AioRpcError as exc:
        assert error_info(exc)[:2] == (grpc.StatusCode.UNAVAILABLE, "REPLICA_BUSY")
    assert time.monotonic() - started < 0.7
    patient = await service.stubs.credits.GetBalance(credits_service_pb2.GetBalanceRequest(user_id=other), timeout=10)
    assert patient.balance == 0
    assert (await first).status == 2  # JOB_STATUS_PENDING


def _admit_of_size(user: str, key: str, size: int) -> queue_service_pb2.AdmitRequest:
    """An admit of exactly `size` bytes, its sources' citations in two-byte characters."""
    citation = "é" * validation.MAX_CITATION_CHARS
    request = queue_service_pb2.AdmitRequest(user_id=user, idempotency_key=key, document=job_pb2.Document(uri="s3://theses/big.pdf"))
    while request.ByteSize() < size - 9000:
        request.sources.append(job_pb2.Source(doi=f"10.1234/n{len(request.sources)}", citation=citation))
    while True:
        last = request.sources.add(doi=f"10.1234/n{len(request.sources)}", citation="")
        last.citation = "a" * min(validation.MAX_CITATION_CHARS, size - request.ByteSize())
        while request.ByteSize() > size:
            last.citation = last.citation[:-1]
        if request.ByteSize() >= size - 2:
            break
    assert request.ByteSize() == size, request.ByteSize()
    return request


def _create_run_size(request: queue_service_pb2.AdmitRequest) -> int:
    """The size of the CreateRun this admit becomes (as `core_client.create_run` builds it)."""
    return run_service_pb2.CreateRunRequest(
        run_id=str(uuid.uuid4()),
        user_id=request.user_id,
        document_uri=request.document.uri,
        sources=[run_service_pb2.RunSource(doi=s.doi, citation=s.citation) for s in request.sources],
        hold=True,
    ).ByteSize()


async def test_an_admit_over_the_size_a_thesis_needs_is_refused_as_too_large(service) -> None:
    """An admit one byte over MAX_ADMIT_BYTES (1 MiB: what a long thesis's references need, three
    times over; docs/security.md) is refused INVALID_ARGUMENT (INVALID_REQUEST) with a BadRequest
    naming the size, and charges nothing; one of exactly that size is admitted, and the CreateRun
    it becomes fits the core's 4 MiB receive limit (whose transport's RESOURCE_EXHAUSTED would
    read as a spent provider budget)."""
    user = new_user()
    await service.stubs.grant(user, 1)
    too_large = _admit_of_size(user, "too-large", validation.MAX_ADMIT_BYTES + 1)
    try:
        await service.stubs.queue.Admit(too_large, timeout=20)
        raise AssertionError("an admit over the size cap was accepted")
    except grpc.aio.AioRpcError as exc:
        code, reason, _, violations = error_info(exc)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"), (code, reason, exc.details())
        assert [field for field, _ in violations] == ["sources"]
        assert f"{too_large.ByteSize()} bytes" in violations[0][1]
    assert service.core.runs == {} and await service.stubs.balance(user) == 1
    fits = _admit_of_size(user, "fits", validation.MAX_ADMIT_BYTES)
    assert _create_run_size(fits) <= 4 * 1024 * 1024
    assert (await service.stubs.queue.Admit(fits, timeout=20)).job.job_id
    assert await service.stubs.balance(user) == 0
