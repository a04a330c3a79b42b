"""The database fails under the service, and the service follows it: each fault is injected for
real (a SIGSTOPped PostgreSQL backend, a TCP proxy on 127.0.0.1 taken down or cut, synchronous
replication to a standby that never answers) and the service is driven through its public API.

What is measured (printed with -s): how long after the fault the caller hears UNAVAILABLE, how
long after the database is back the service answers again, and how far health lags behind."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from typing import Any

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.config import Config
from queue_service.dev.core import AnswerFault
from queue_service.dev.embedded_postgres import free_port
from tests.faults import LISTENER, TcpProxy, backend_pids, frozen
from tests.harness import NOT_SERVING, SERVING, S, Stubs, error_info, health, new_user, until

_FIELDS = {field.name for field in dataclasses.fields(Config)}


def settings(**overrides: Any) -> dict[str, Any]:
    """Overrides of settings this code knows (so the test also runs, and fails, on code from
    before a setting existed)."""
    return {name: value for name, value in overrides.items() if name in _FIELDS}


async def answers(stubs: Stubs, job_id: str) -> bool:
    try:
        await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job_id), timeout=0.5)
    except grpc.aio.AioRpcError:
        return False
    return True


async def test_a_frozen_listen_connection_is_noticed_and_every_stream_hears_later_changes(services, database_url: str) -> None:
    """The LISTEN connection's backend stops answering (SIGSTOP: its kernel still acknowledges
    TCP, so keepalives see nothing). The liveness query goes unanswered, the replica reconnects,
    the stream resyncs, and a job admitted while the old listener was frozen reaches it."""
    service = await services.start(**settings(db_liveness_seconds=0.5))
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 3)
    stream = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user))
    seen: dict[str, int] = {}
    snapshot = asyncio.Event()

    async def read() -> None:
        async for message in stream:
            if message.snapshot_complete:
                snapshot.set()
            if message.HasField("job"):
                seen[message.job.job_id] = message.job.status

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(snapshot.wait(), 10)
        listeners = backend_pids(database_url, LISTENER)
        assert len(listeners) == 1
        with frozen(listeners) as stopped:
            assert stopped == listeners
            frozen_at = time.monotonic()
            job = await stubs.admit(user)

            async def heard() -> bool:
                return job.job_id in seen

            lag = await until(heard, within=6, what="the stream to hear of a job admitted while its listener was frozen")
            print(
                f"\nfrozen LISTEN backend: the stream heard the change {lag:.2f}s after the admit, {time.monotonic() - frozen_at:.2f}s after the freeze"
            )

            # The change comes through the job-change feed, which the frozen hint listener does not
            # carry: the replica still notices that listener and replaces it.
            async def replaced() -> bool:
                return backend_pids(database_url, LISTENER) not in ([], listeners)

            await until(replaced, within=6, what="a new listener in place of the frozen one")
    finally:
        stream.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def _waiting_on_a_lock(database_url: str, query_like: str) -> list[int]:
    return await asyncio.to_thread(backend_pids, database_url, f"wait_event_type = 'Lock' AND query LIKE '{query_like}'")


async def test_a_statement_on_a_frozen_backend_ends_unavailable_within_the_callers_deadline(services, database_url: str) -> None:
    """The pool's only connection is frozen while a call's statement runs on it: the call, given
    2 s, hears UNAVAILABLE DATABASE_UNAVAILABLE before its deadline (psycopg alone would wait 5 s
    for the cancel and 5 s more), and once the backend is given up the next call is served on a
    new connection. (The read is held on a stranger's table lock until the backend is frozen,
    so the frozen statement is the call's own, not a background one's: see the next test.)"""
    service = await services.start(**settings(pool_min_size=1, pool_max_size=1, health_interval_seconds=60.0))
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    job = await stubs.admit(user)
    await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)  # the admit's follow-ups are done
    await asyncio.sleep(0.2)  # and the feed's read and hint of its last change
    pool_backends = backend_pids(database_url, f"NOT {LISTENER}")
    assert len(pool_backends) == 1
    async with await psycopg.AsyncConnection.connect(database_url) as stranger:
        await stranger.execute("LOCK TABLE analysis_jobs IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        call = asyncio.ensure_future(stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=2.0))
        await until(lambda: _waiting_on_a_lock(database_url, "%%analysis_job_views%%"), within=1.0, what="the call's read waits")
        assert await _waiting_on_a_lock(database_url, "%%analysis_job_views%%") == pool_backends
        with frozen(pool_backends) as stopped:
            assert stopped == pool_backends
            await stranger.rollback()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call
            took = time.monotonic() - started
            code, reason, _, _ = error_info(failed.value)
            print(f"\nfrozen pool backend: the caller heard {code.name} {reason} after {took:.2f}s of its 2s: {failed.value.details()}")
            assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
            assert took < 2.0
            # Served again on a fresh connection while the old backend is still frozen.
            assert await answers(stubs, job.job_id)


async def test_a_background_statement_on_a_frozen_backend_gives_its_connection_up(services, database_url: str) -> None:
    """Background work (here the dispatcher's mark of a release the core accepted) has no
    caller's deadline; its statement is on the pool's only connection when the backend freezes.
    The server would have ended any statement at its statement_timeout (1 s here), so one still
    unanswered a grace later is given up with its connection, and calls are served again on a
    new one, instead of waiting until the node wakes up."""
    service = await services.start(
        **settings(pool_min_size=1, pool_max_size=1, health_interval_seconds=60.0, statement_timeout_ms=1000, pool_timeout_seconds=5.0)
    )
    stubs, user = service.stubs, new_user()
    await stubs.grant(user, 1)
    service.core.answer_faults["ReleaseRun"] = AnswerFault("late", seconds=1.0)
    job = await stubs.admit(user)
    pool_backends = backend_pids(database_url, f"NOT {LISTENER}")
    assert len(pool_backends) == 1
    async with await psycopg.AsyncConnection.connect(database_url) as stranger:
        # Holds the job's row, so the mark waits on the pool's only connection until it is frozen.
        await stranger.execute("SELECT 1 FROM analysis_jobs WHERE job_id = %s FOR UPDATE", (job.job_id,))
        service.core.answer_faults.clear()
        await until(lambda: _waiting_on_a_lock(database_url, "%%SET status = %%"), within=5.0, what="the release's mark waits")
        assert await _waiting_on_a_lock(database_url, "%%SET status = %%") == pool_backends
        with frozen(pool_backends) as stopped:
            assert stopped == pool_backends
            await stranger.rollback()
            started = time.monotonic()
            try:
                await stubs.queue.GetJob(queue_pb2.GetJobRequest(job_id=job.job_id), timeout=4.0)
            except grpc.aio.AioRpcError as exc:
                code, reason, _, _ = error_info(exc)
                raise AssertionError(f"a call waited behind a frozen background statement: {code.name} {reason} {exc.details()}") from exc
            took = time.monotonic() - started
            print(f"\nfrozen background statement: the next call was served after {took:.2f}s")


async def test_the_service_follows_a_database_that_goes_away_and_comes_back(services, database_url: str) -> None:
    """The route to PostgreSQL goes down (every connection cut, new ones refused) for 8 s, long
    enough for psycopg_pool's default backoff to reach 4 s between attempts. Readiness turns
    NOT_SERVING within a probe interval (0.5 s) plus the probe's own bound (1 s, spent waiting
    for a connection the pool cannot open), and SERVING again within about a second of the
    database being back; calls are served again as soon; liveness stays SERVING throughout."""
    proxy = TcpProxy(database_url)
    await proxy.up()
    try:
        service = await services.start(database_url=proxy.dsn())
        stubs, user = service.stubs, new_user()
        await stubs.grant(user, 1)
        job = await stubs.admit(user)

        async def not_serving() -> bool:
            return await health(stubs) == NOT_SERVING

        async def serving() -> bool:
            return await health(stubs) == SERVING

        async def served() -> bool:
            return await answers(stubs, job.job_id)

        await proxy.down()
        down_lag = await until(not_serving, within=5, what="readiness NOT_SERVING after the database went away")
        assert await health(stubs, "liveness") == SERVING
        await asyncio.sleep(8 - down_lag)
        assert await health(stubs, "liveness") == SERVING
        await proxy.up()
        back = time.monotonic()
        call_lag = await until(served, within=10, what="a call served after the database came back")
        health_lag = max(call_lag, await until(serving, within=10, what="readiness SERVING after the database came back"))
        print(
            f"\ndatabase away 8s: readiness NOT_SERVING after {down_lag:.2f}s; back: first call served after {call_lag:.2f}s, "
            f"readiness SERVING after {time.monotonic() - back:.2f}s"
        )
        assert down_lag < 0.5 + 1.0 + 0.3
        assert call_lag < 1.5
        assert health_lag < 1.5
    finally:
        await proxy.down()


async def test_connections_the_database_closed_fail_no_call(services, database_url: str) -> None:
    """Every pooled connection is cut (as a PostgreSQL restart does) while the database stays
    reachable: the next calls each get a live connection, none a stale one."""
    proxy = TcpProxy(database_url)
    await proxy.up()
    try:
        service = await services.start(database_url=proxy.dsn(), **settings(pool_min_size=4, pool_max_size=4, health_interval_seconds=60.0))
        stubs, user = service.stubs, new_user()
        await stubs.grant(user, 1)
        job = await stubs.admit(user)
        await proxy.cut()
        await asyncio.sleep(0.2)
        results = [await answers(stubs, job.job_id) for _ in range(4)]
        print(f"\nafter every pooled connection was cut: {results.count(False)} of 4 calls failed")
        assert results == [True] * 4
    finally:
        await proxy.down()


async def test_a_database_that_reads_but_cannot_commit_reads_not_serving(services, postgres, database_url: str) -> None:
    """Synchronous replication to a standby that never answers (the stalled synchronous standby):
    `SELECT 1` still works, every commit waits. Readiness turns NOT_SERVING within about a second
    and SERVING again once commits go through; reads are served throughout."""
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as admin:
        if not admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
            pytest.skip("needs a superuser TEST_DATABASE_URL to set synchronous_standby_names")
        database = database_url.rsplit("/", 1)[1]
        # The test PostgreSQL runs with synchronous_commit=off; this database's sessions commit as a
        # production one does.
        admin.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = on')
        try:
            service = await services.start(**settings(health_interval_seconds=0.2))
            stubs, user = service.stubs, new_user()
            await stubs.grant(user, 1)
            job = await stubs.admit(user)

            async def not_serving() -> bool:
                return await health(stubs) == NOT_SERVING

            async def serving() -> bool:
                return await health(stubs) == SERVING

            admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby_that_never_answers'")
            admin.execute("SELECT pg_reload_conf()")
            try:
                lag = await until(not_serving, within=5, what="readiness NOT_SERVING while commits wait for a standby")
                assert await answers(stubs, job.job_id)  # reads still work
                stance = await service.app.store.replication_stance(timeout=2)
                assert stance.mode == "synchronous_without_standby"
            finally:
                admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
                admin.execute("SELECT pg_reload_conf()")
            back = await until(serving, within=5, what="readiness SERVING once commits go through")
            print(f"\nstalled synchronous standby: readiness NOT_SERVING after {lag:.2f}s, SERVING {back:.2f}s after it was released")
            assert lag < 1.5 and back < 1.5
            assert (await service.app.store.replication_stance(timeout=2)).mode == "single_node"
        finally:
            admin.execute(f'ALTER DATABASE "{database}" RESET synchronous_commit')


async def test_serve_started_while_the_database_is_away_waits_for_it(services, database_url: str) -> None:
    """A replica started while the database cannot be reached does not exit (which would loop in
    CrashLoopBackOff): it retries, logging each attempt, and serves once the database is back."""
    proxy = TcpProxy(database_url)  # not listening yet: connections are refused
    core = await services.core()
    port = free_port()
    log_path = f"/tmp/queue-service-{port}.log"
    starting = asyncio.create_task(services.start_process(core, port=port, DATABASE_URL=proxy.dsn()))
    try:

        async def retried_twice() -> bool:
            assert not starting.done(), "serve gave up while the database was away"
            return os.path.exists(log_path) and open(log_path).read().count("database not reachable yet") >= 2

        await until(retried_twice, within=30, what="serve to retry the database twice", every=0.1)
        await proxy.up()
        back = time.monotonic()
        handle = await asyncio.wait_for(starting, 30)
        print(f"\nserve started while the database was away: SERVING {time.monotonic() - back:.2f}s after it came back")
        assert handle.process.poll() is None
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await proxy.down()


async def test_an_admit_whose_connection_breaks_after_its_commit_answers_its_job(services, database_url: str) -> None:
    """The locked admit of a queued job commits; then the connection that reads the job's
    estimated start breaks (a restart, a failover, a cut route). The answer is the admitted job
    (its estimate left out), never DATABASE_UNAVAILABLE beside a job that exists and is charged
    (I5); the same key finds the same job."""
    proxy = TcpProxy(database_url)
    await proxy.up()
    try:
        service = await services.start(database_url=proxy.dsn())
        stubs, user = service.stubs, new_user()
        await stubs.grant(user, 2)
        await stubs.admit(user)
        # The first read of the mean judging time (`recent_judging_seconds`), which only an
        # answer about a queued job makes: sent after the admit's commit.
        proxy.cut_when_sent(b"AS recent")
        key = uuid.uuid4().hex
        try:
            queued = await stubs.admit(user, key, timeout=3)
        except grpc.aio.AioRpcError as exc:
            code, reason, _, _ = error_info(exc)
            raise AssertionError(f"a committed admit was answered {code.name} {reason}") from exc
        assert proxy.cut_done.is_set(), "the estimate read was not cut: the test did not inject its fault"
        assert queued.status == S.JOB_STATUS_QUEUED
        assert await stubs.balance(user) == 0
        assert [job.job_id for job in await stubs.jobs(user)][1:] == [queued.job_id]
        assert (await stubs.admit(user, key)).job_id == queued.job_id
    finally:
        await proxy.down()


async def test_a_reconciliation_whose_write_is_cut_is_tried_again_within_the_pass(services, database_url: str) -> None:
    """The sweeper asks the core about a RUNNING job whose completion never arrived (the core
    says it succeeded); the connection that writes the ending breaks before the server sees it
    (a failover, a cut route). The claim pushed the job's next look out by
    QUEUE_RECONCILE_AFTER_SECONDS, so the pass tries again at once: the job ends in this pass,
    charged once, not a recheck interval later."""
    proxy = TcpProxy(database_url)
    await proxy.up()
    try:
        service = await services.start(database_url=proxy.dsn(), reconcile_after_seconds=0.2, sweep_interval_seconds=3600.0)
        stubs, user = service.stubs, new_user()
        await stubs.grant(user, 2)
        job = await stubs.admit(user)
        await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
        service.core.drop_callbacks = True
        await service.core.finish(job.run_id)
        await asyncio.sleep(0.3)
        proxy.cut_when_sent(b"queue_end_job_viewed")
        report = await service.app.sweeper.sweep_once()
        assert proxy.cut_done.is_set(), "the ending's statement was not cut: the test did not inject its fault"
        assert report.reconciled == 1
        assert (await stubs.job(job.job_id)).status == S.JOB_STATUS_SUCCEEDED
        assert await stubs.balance(user) == 1
    finally:
        await proxy.down()
