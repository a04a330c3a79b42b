"""The torture run: three replicas and the dev core on one PostgreSQL, hundreds of simulated
users, and everything that goes wrong in production, while an independent checker samples the
invariants I1-I7 from the database.

CI runs the short size (QUEUE_TORTURE_SECONDS, default 25); a developer runs a long one with
`QUEUE_TORTURE_SECONDS=600 .venv/bin/pytest tests/torture -s`. The summary is printed (`-s`
shows it) and written to QUEUE_TORTURE_REPORT when set.

During the run: kill -9 of a random replica (restarted a second later), a rolling deploy (a new
replica starts, an old one is drained with SIGTERM while calls are in flight), a PostgreSQL
restart, a core outage shorter and one longer than the release window, a stranger's transaction
holding a few users' queue locks for seconds, a spell of commits acknowledged late (a synchronous
standby that never answers, `synchronous_standby_names`), a spell of lost completion callbacks
healed by the sweeper's reconciliation, and kills of the replicas' LISTEN connections. An Admit
the service refused with a reason must have left no job (I5); OUTCOME_UNKNOWN promises nothing. Meanwhile, spells of ambiguous core answers hit every core method (CreateRun,
ReleaseRun, CancelRun, GetRun): applied but the answer lost, applied but answered after the
replica's core deadline, and applied late after the caller gave up. Deltas complete at once, and
one replica runs with its clock 30 s ahead (Debian's `faketime`, when installed).

Users also take back clicks that wait for the fleet's capacity (CancelJob of a waiting job: it
ends at once, refunded, and gives up its place).

Besides I1-I7 from the database, the checker asks the dev core (I9: it never judged two
first-pass runs of one user at once; I10: after quiescence it holds or judges no run, since no job
is live) and ten users' WatchJobs streams, kept open through the whole run over random replicas
(I11: each stream's last message per job equals GetJob once everything is quiet).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.core.v1 import run_service_pb2 as run_pb
from queue_service._gen.acurio.queue.v1 import (
    job_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    operator_service_pb2 as op_pb2,
)
from queue_service._gen.acurio.queue.v1 import (
    operator_service_pb2_grpc as op_grpc,
)
from queue_service._gen.acurio.queue.v1 import (
    queue_service_pb2 as queue_pb2,
)
from queue_service.dev.core import AnswerFault, DevCore
from queue_service.dev.embedded_postgres import EmbeddedPostgres, free_port
from queue_service.store import migrations
from tests.faults import LISTENER
from tests.harness import REPO_ROOT, InvariantChecker, S, Stubs, error_info, stranger_holds_user_locks, wait_serving
from tests.machine.world import forget_faketime_segments, skewed_clock_environment

pytestmark = pytest.mark.torture

SECONDS = float(os.environ.get("QUEUE_TORTURE_SECONDS", "25"))
USERS = int(os.environ.get("QUEUE_TORTURE_USERS", "200"))
# The fleet's capacity at the core (QUEUE_CORE_CAPACITY of every replica; 0: unlimited): I12 is
# checked at the core, I13 from the grant order. A machine too slow for the users to fill it gets
# a lower one during the run (`fit_capacity_to_load`), so I12 and I13 are tested on any machine.
CAPACITY = int(os.environ.get("QUEUE_TORTURE_CAPACITY", "20"))
# When the most first-pass runs judging at once is looked at (a share of the run), and what share
# of it becomes the capacity when it falls short: a third, so the load surely fills it again while
# replicas die and PostgreSQL restarts.
CAPACITY_FIT_AFTER_SHARE = 0.3
CAPACITY_FIT_SHARE_OF_PEAK = 1 / 3
RELEASE_WINDOW = 3.0
SWEEP_INTERVAL = 1.0
RECONCILE_AFTER = 2.0
CALL_DEADLINE = 5.0
# The replicas' QUEUE_CORE_DEADLINE_SECONDS: late answers come after it.
CORE_DEADLINE = 1.0
CORE_METHODS = ("CreateRun", "ReleaseRun", "CancelRun", "GetRun")
ANSWER_FAULT_KINDS = ("lose", "late", "late_arrival")
# The longest an answer fault delays a call: after the chaos, a late arrival may still be applied
# this long afterwards, so quiescence is not judged before.
LONGEST_FAULT_SECONDS = 3 * CORE_DEADLINE
WATCHED_USERS = 10
# What a caller may hear while replicas die, PostgreSQL restarts and the core is down.
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ABORTED,
}


@dataclasses.dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    stubs: Stubs
    skewed_clock: bool = False


@dataclasses.dataclass
class Summary:
    operations: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    codes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    kills: int = 0
    restarts: int = 0
    drains: int = 0
    database_restarts: int = 0
    core_outages: int = 0
    lost_callback_spells: int = 0
    # Chaos actions taken, by kind (answer-fault spells per method:kind, listener kills, ...).
    chaos: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    checks: int = 0
    # Checks of the core's view (I9, I10) and of the WatchJobs streams (I11).
    i9_checks: int = 0
    i10_checks: int = 0
    i11_checks: int = 0
    i12_checks: int = 0
    # The capacity I12 is judged against (CAPACITY, or the lower one `fit_capacity_to_load` set).
    capacity: int = CAPACITY
    capacity_fitted_from_peak: int = 0
    # The most first-pass runs judged at once under the fitted capacity, before the drain.
    most_judging_at_fitted_capacity: int = 0
    # The fleet had all of the fitted capacity in use with jobs waiting for it (GetOverview).
    fitted_capacity_filled: bool = False
    # The fleet had all of CAPACITY in use with jobs waiting for it in the drain (its own count).
    capacity_filled_in_drain: bool = False
    most_passed_over: int = 0
    # Jobs canceled while they waited for capacity (CancelJob answered).
    waiting_canceled: int = 0
    stream_reconnects: int = 0
    stream_ends: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    violations: list[str] = dataclasses.field(default_factory=list)
    slow_calls: int = 0
    # How late this process's own event loop ran (it drives the users and the dev core).
    max_loop_lag: float = 0.0


class Cluster:
    def __init__(self, database_url: str, core: DevCore, summary: Summary, logs: Path) -> None:
        self.database_url = database_url
        self.core = core
        self.summary = summary
        self.logs = logs
        self.replicas: list[Replica] = []
        self._counter = 0

    async def start_replica(self, *, skewed_clock: bool = False) -> Replica:
        self._counter += 1
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "QUEUE_CORE_ADDR": f"127.0.0.1:{self.core.port}",
            "QUEUE_LISTEN_ADDR": f"127.0.0.1:{port}",
            "QUEUE_MIGRATE_ON_START": "true",
            "QUEUE_SWEEP_INTERVAL_SECONDS": str(SWEEP_INTERVAL),
            "QUEUE_RELEASE_WINDOW_SECONDS": str(RELEASE_WINDOW),
            "QUEUE_RELEASE_LEASE_SECONDS": "1",
            "QUEUE_RELEASE_BACKOFF_MAX_SECONDS": "0.5",
            "QUEUE_RECONCILE_AFTER_SECONDS": str(RECONCILE_AFTER),
            "QUEUE_CORE_DEADLINE_SECONDS": "1",
            "QUEUE_DB_POOL_TIMEOUT_SECONDS": "1",
            "QUEUE_GRACE_PERIOD_SECONDS": "3",
            "QUEUE_MAX_QUEUED_PER_USER": "20",
            "QUEUE_CORE_CAPACITY": str(CAPACITY),
            "QUEUE_DB_POOL_MAX_SIZE": "10",
            "QUEUE_LOG_LEVEL": "warning",
        }
        log = open(self.logs / f"replica-{self._counter}.log", "wb")
        if skewed_clock:
            # The replica's wall clock runs ahead of the database's (and of its peers').
            env.update(skewed_clock_environment())
            self.summary.chaos["skewed_clock_replica"] += 1
        process = subprocess.Popen(
            [sys.executable, "-m", "queue_service.cli", "serve"], env=env, cwd=REPO_ROOT, stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        replica = Replica(f"replica-{self._counter}", port, process, Stubs(f"127.0.0.1:{port}"), skewed_clock)
        await wait_serving(replica.stubs, process=process, log_path=str(self.logs / f"replica-{self._counter}.log"), timeout=60)
        self.replicas.append(replica)
        self.point_core_at_live_replicas()
        return replica

    def pick(self) -> Stubs:
        return random.choice(self.replicas).stubs

    def point_core_at_live_replicas(self) -> None:
        """Completions are spread over the live replicas, as a load balancer in front would."""
        self.core.set_callback_addr(",".join(r.stubs.address for r in self.replicas))

    async def kill_and_restart(self) -> None:
        victim = random.choice(self.replicas)
        _log_event(f"kill -9 {victim.stubs.address}")
        self.replicas.remove(victim)
        victim.process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.process.wait, 10)
        _ended(victim)
        self.summary.kills += 1
        self.point_core_at_live_replicas()
        await asyncio.sleep(1.0)
        await self.start_replica(skewed_clock=victim.skewed_clock)
        self.summary.restarts += 1

    async def rolling_deploy(self) -> None:
        await self.start_replica(skewed_clock=self.replicas[0].skewed_clock)  # the "new version"
        old = self.replicas.pop(0)
        _log_event(f"drain {old.stubs.address}")
        self.point_core_at_live_replicas()
        old.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(old.process.wait, 20)
        except subprocess.TimeoutExpired:
            old.process.kill()
            code = await asyncio.to_thread(old.process.wait, 10)
            self.summary.violations.append(f"drained replica {old.name} did not exit within 20 s of SIGTERM")
        _ended(old)
        if code != 0:
            self.summary.violations.append(f"drained replica {old.name} exited {code}")
        self.summary.drains += 1

    def kill_listeners(self) -> int:
        """Terminates the replicas' LISTEN connections (as a proxy or failover would): each
        replica reconnects and its WatchJobs streams resync."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            rows = conn.execute(
                f"""SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                    WHERE {LISTENER} AND pid <> pg_backend_pid()"""
            ).fetchall()
        return sum(1 for (terminated,) in rows if terminated)

    async def stop(self) -> None:
        """Drains every replica; one that does not exit in time is killed, so none outlives the run."""
        for replica in self.replicas:
            replica.process.send_signal(signal.SIGTERM)
        for replica in self.replicas:
            try:
                await asyncio.to_thread(replica.process.wait, 20)
            except subprocess.TimeoutExpired:
                self.summary.violations.append(f"replica {replica.name} did not exit within 20 s of SIGTERM at the end")
                replica.process.kill()
                await asyncio.to_thread(replica.process.wait, 10)
            _ended(replica)
            await replica.stubs.close()


def _ended(replica: Replica) -> None:
    """A replica whose process ended: its clock's leftovers go (forget_faketime_segments)."""
    if replica.skewed_clock:
        forget_faketime_segments(replica.process.pid)


def operator_stub(stubs: Stubs) -> op_grpc.OperatorServiceStub:
    return op_grpc.OperatorServiceStub(stubs.channel)


@dataclasses.dataclass
class UserState:
    user_id: str
    keys: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (idempotency key, job id)
    granted: int = 0
    # Fresh keys whose Admit the service refused with a reason: I5 says no job has them. An
    # OUTCOME_UNKNOWN (maybe committed) or a transport failure (no reason) promises nothing.
    refused_keys: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (key, reason)
    # Extra pause before the next action after the fleet said it is busy (REPLICA_BUSY), doubled
    # at each such answer and forgotten at the next answer: what a real client's retry policy does.
    busy_backoff: float = 0.0


# Backoff after REPLICA_BUSY: without it the users' load does not depend on how fast the machine
# is, and on a slow one (a shared CI runner, a starved CPU) the retries of refused calls take the
# CPU from the replicas' answers until a replica process is not scheduled for seconds and answers
# after its callers' deadlines.
BUSY_BACKOFF_FIRST_SECONDS = 0.2
BUSY_BACKOFF_MAX_SECONDS = 3.0


EPOCH = time.monotonic()


def _log_event(event: str) -> None:
    if os.environ.get("QUEUE_TORTURE_TRACE"):
        print(f"{time.monotonic() - EPOCH:7.2f}s {event}", flush=True)


async def _call(summary: Summary, name: str, coro, address: str = "", refusals: list[str] | None = None, state: UserState | None = None):
    started = time.monotonic()
    summary.operations[name] += 1
    try:
        result = await coro
        summary.codes["OK"] += 1
        if state is not None:
            state.busy_backoff = 0.0
        return result
    except grpc.aio.AioRpcError as exc:
        summary.codes[exc.code().name] += 1
        if state is not None:
            busy = error_info(exc)[1] == "REPLICA_BUSY"
            state.busy_backoff = min(BUSY_BACKOFF_MAX_SECONDS, max(BUSY_BACKOFF_FIRST_SECONDS, 2 * state.busy_backoff)) if busy else 0.0
        summary.reasons[f"{exc.code().name}/{error_info(exc)[1] or '-'}"] += 1
        if refusals is not None:
            refusals.append(error_info(exc)[1])
        if exc.code() not in ALLOWED:
            summary.violations.append(f"{name} answered {exc.code().name} at {started - EPOCH:.1f}s from {address}: {exc.details()}")
        return None
    finally:
        if time.monotonic() - started > CALL_DEADLINE + 1.0:
            summary.slow_calls += 1
            summary.violations.append(f"{name} hung past its deadline ({time.monotonic() - started:.1f}s)")


async def simulate_user(cluster: Cluster, state: UserState, stop: asyncio.Event, admitted: dict[str, str]) -> None:
    summary = cluster.summary
    while not stop.is_set():
        await asyncio.sleep(random.uniform(0.05, 0.6) + random.uniform(0.5, 1.0) * state.busy_backoff)
        stubs = cluster.pick()
        roll = random.random()
        if roll < 0.55 or not state.keys:
            if state.keys and random.random() < 0.15:
                key, expected = random.choice(state.keys)  # a double click: same key, same payload
            else:
                key, expected = f"click-{uuid.uuid4().hex[:12]}", ""
            refusals: list[str] = []
            job = await _call(
                summary,
                "Admit",
                stubs.admit(state.user_id, key, uri=f"s3://theses/{key}.pdf", timeout=CALL_DEADLINE),
                stubs.address,
                refusals,
                state,
            )
            if job is None and not expected and refusals and refusals[0] not in ("", "OUTCOME_UNKNOWN"):
                state.refused_keys.append((key, refusals[0]))
            if job is not None:
                if expected and job.job_id != expected:
                    summary.violations.append(f"I7: key {key} gave job {job.job_id}, earlier {expected}")
                if not expected:
                    state.keys.append((key, job.job_id))
                admitted[job.job_id] = state.user_id
                if job.capacity_position > 0 and random.random() < 0.2:
                    # A click taken back while it waits for the fleet: it ends at once, refunded.
                    canceled = await _call(
                        summary,
                        "CancelJob(waiting)",
                        stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job.job_id, user_id=state.user_id), timeout=CALL_DEADLINE),
                        state=state,
                    )
                    if canceled is not None:
                        summary.waiting_canceled += 1
        elif roll < 0.65:
            _, job_id = random.choice(state.keys)
            await _call(
                summary,
                "CancelJob",
                stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job_id, user_id=state.user_id), timeout=CALL_DEADLINE),
                state=state,
            )
        elif roll < 0.75:
            _, job_id = random.choice(state.keys)
            job = await _call(
                summary, "Admit(delta)", stubs.admit(state.user_id, uri="", delta_of=job_id, timeout=CALL_DEADLINE), state=state
            )
            if job is not None:
                admitted[job.job_id] = state.user_id
                if job.status == S.JOB_STATUS_QUEUED:
                    summary.violations.append(f"I6: delta {job.job_id} was queued")
        elif roll < 0.9:
            await _call(
                summary,
                "ListJobs",
                stubs.queue.ListJobs(queue_pb2.ListJobsRequest(user_id=state.user_id, page_size=20), timeout=CALL_DEADLINE),
                state=state,
            )
        else:
            balance = await _call(summary, "GrantCredits", stubs.grant(state.user_id, 5), state=state)
            if balance is not None:
                state.granted += 5


@dataclasses.dataclass
class WatchedUser:
    """One user's WatchJobs stream, reconnected (to a random live replica) whenever it ends."""

    user_id: str
    # The current stream's last message per job id. A new stream's snapshot is the whole truth
    # (the contract), so each reconnect starts afresh.
    last: dict[str, job_pb2.Job] = dataclasses.field(default_factory=dict)
    snapshot_done: bool = False
    last_message_at: float = 0.0


async def watch_user(cluster: Cluster, watched: WatchedUser) -> None:
    """Runs until cancelled."""
    summary = cluster.summary
    connects = 0
    while True:
        replica = random.choice(cluster.replicas)
        connects += 1
        if connects > 1:
            summary.stream_reconnects += 1
        watched.last, watched.snapshot_done = {}, False
        call = replica.stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=watched.user_id))
        try:
            async for message in call:
                watched.last_message_at = time.monotonic()
                if message.HasField("job"):
                    watched.last[message.job.job_id] = message.job
                if message.snapshot_complete:
                    watched.snapshot_done = True
            summary.stream_ends["OK"] += 1
        except grpc.aio.AioRpcError as exc:
            summary.stream_ends[f"{exc.code().name}/{error_info(exc)[1] or '-'}"] += 1
            if exc.code() not in ALLOWED:
                summary.violations.append(f"WatchJobs on {replica.name} ended {exc.code().name}: {exc.details()}")
        except asyncio.CancelledError:
            call.cancel()
            raise
        await asyncio.sleep(random.uniform(0.05, 0.3))


def _shown(job: job_pb2.Job, field: str) -> str:
    if field == "status":
        return job_pb2.JobStatus.Name(job.status)
    if field == "end_time":
        return job.end_time.ToJsonString() if job.HasField("end_time") else "unset"
    return repr(getattr(job, field))


async def check_streams_match_get_job(cluster: Cluster, watched_users: list[WatchedUser], quiet_seconds: float, timeout: float) -> None:
    """I11, after quiescence: once every stream has its snapshot and is quiet, each stream's last
    message per job equals what GetJob returns."""
    summary = cluster.summary
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        if all(w.snapshot_done and now - w.last_message_at >= quiet_seconds for w in watched_users):
            break
        if now > deadline:
            summary.violations.append(f"I11: the WatchJobs streams did not settle within {timeout:.0f} s of quiescence")
            return
        await asyncio.sleep(0.2)
    stubs = cluster.pick()
    for watched in watched_users:
        for job_id, streamed in list(watched.last.items()):
            summary.i11_checks += 1
            current = await stubs.job(job_id)
            differences = [
                f"{field} {_shown(streamed, field)} but GetJob {_shown(current, field)}"
                for field in ("status", "queue_position", "capacity_position", "release_attempts", "last_error", "end_time")
                if getattr(streamed, field) != getattr(current, field)
            ]
            if differences:
                summary.violations.append(f"I11: job {job_id} of {watched.user_id}: stream says " + "; ".join(differences))


async def watch_loop_lag(summary: Summary, stop: asyncio.Event) -> None:
    while not stop.is_set():
        planned = time.monotonic() + 0.1
        await asyncio.sleep(0.1)
        summary.max_loop_lag = max(summary.max_loop_lag, time.monotonic() - planned)


def check_core_judges_one_run_per_user(core: DevCore, summary: Summary, reported: set[str]) -> None:
    """I9: the dev core never judged two first-pass runs of one user at once (limit 1)."""
    summary.i9_checks += 1
    for user, most in core.max_concurrent_judging.items():
        if most > 1 and user not in reported:
            reported.add(user)
            summary.violations.append(f"I9: the core judged {most} first-pass runs of user {user} at once")


def check_core_judges_at_most_the_capacity(core: DevCore, summary: Summary) -> None:
    """I12: the dev core never judged more runs of all users at once than the capacity, first-pass
    runs and delta re-checks alike (a re-check takes a turn under the capacity)."""
    summary.i12_checks += 1
    capacity = summary.capacity
    if capacity and core.most_judging > capacity and not any(v.startswith("I12") for v in summary.violations):
        summary.violations.append(f"I12: the core judged {core.most_judging} runs at once (capacity {capacity})")


async def fit_capacity_to_load(cluster: Cluster, summary: Summary, stop: asyncio.Event) -> None:
    """Lowers the capacity when the users have not filled it, so I12 and I13 are put to the test
    on any machine: on a slow one (a starved CPU, a shared CI runner) the admits come too slowly
    for CAPACITY first-pass runs to judge at once. Then the capacity becomes a third of the most seen
    (the operator's SetCoreCapacity); runs granted under the old one end first (a lowered
    capacity is reached as they end), and once the fleet has no more in use than the new one,
    the core's count starts afresh and I12 is judged against the new capacity."""
    core = cluster.core
    await _sleep_unless_stopped(stop, SECONDS * CAPACITY_FIT_AFTER_SHARE)
    peak = core.most_first_pass_judging
    if stop.is_set() or not summary.capacity or peak >= summary.capacity:
        return
    fitted = max(2, int(peak * CAPACITY_FIT_SHARE_OF_PEAK))
    while not stop.is_set():
        try:
            await operator_stub(cluster.pick()).SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=fitted), timeout=CALL_DEADLINE)
            summary.capacity_fitted_from_peak = peak
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.5)  # a replica dying or PostgreSQL restarting: try again
    _log_event(f"capacity {summary.capacity} never filled (at most {peak} judging): lowered to {fitted}")
    while not stop.is_set():
        try:
            overview = (await operator_stub(cluster.pick()).GetOverview(op_pb2.GetOverviewRequest(), timeout=CALL_DEADLINE)).overview
            if overview.capacity_limit == fitted and overview.capacity_in_use <= fitted:
                # The core judges no more runs than the fleet has in use: from here the new capacity holds.
                summary.capacity = fitted
                core.most_first_pass_judging = core.first_pass_judging()
                core.most_judging = len(core.judging_all)
                break
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.2)
    # On a starved machine a run holds its capacity longer in release and completion than it
    # judges at the core, so whether the fitted capacity was filled is read from the fleet's own
    # count: all of it in use while jobs wait for it (their grant order is what I13 judges).
    while not stop.is_set() and summary.capacity == fitted:
        try:
            overview = (await operator_stub(cluster.pick()).GetOverview(op_pb2.GetOverviewRequest(), timeout=CALL_DEADLINE)).overview
            if overview.capacity_limit == fitted and overview.capacity_in_use >= fitted and overview.capacity_waiting_jobs > 0:
                summary.fitted_capacity_filled = True
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.2)


async def restore_capacity(cluster: Cluster, summary: Summary) -> None:
    """After the chaos, a fitted capacity is judged (I12) and CAPACITY restored: the backlog a slow
    machine built under the lower one drains at the usual pace (a raised capacity fills its new
    slots at once), and I12 is judged against CAPACITY from here."""
    if not summary.capacity_fitted_from_peak:
        return
    check_core_judges_at_most_the_capacity(cluster.core, summary)
    summary.most_judging_at_fitted_capacity = cluster.core.most_judging
    give_up_at = time.monotonic() + 30
    while True:
        try:
            await operator_stub(cluster.pick()).SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=CAPACITY), timeout=CALL_DEADLINE)
            break
        except grpc.aio.AioRpcError as exc:
            if time.monotonic() > give_up_at:
                summary.violations.append(f"the capacity could not be restored to {CAPACITY} after the chaos: {exc.code().name}")
                break
            await asyncio.sleep(0.5)
    summary.capacity = CAPACITY


# I13 from the grant order: for each first-pass job that waited for capacity, how many of another
# user's first-pass grants came between the start of its wait and its own grant (a grant sets the
# release window's deadline, so its time is that deadline less the window). Users have one slot
# each, so a waiting user has no first-pass run in use and no user may pass her twice; a user
# with a re-check in use during her wait ranks behind users with none (max-min counts every run),
# and may be passed again while it runs, so those waits are left out of the bound.
_PASSED_OVER = f"""
WITH granted AS (
    SELECT job_id, user_id, capacity_wait_since AS waited_from,
           release_deadline - make_interval(secs => {RELEASE_WINDOW}) AS granted_at
      FROM analysis_jobs
     WHERE delta_of_job_id IS NULL AND capacity_wait_since IS NOT NULL AND capacity_token IS NOT NULL
),
waits_without_rechecks AS (
    SELECT g.* FROM granted g
     WHERE NOT EXISTS (SELECT 1 FROM analysis_jobs d
                        WHERE d.user_id = g.user_id AND d.delta_of_job_id IS NOT NULL
                          AND d.create_time < g.granted_at AND (d.end_time IS NULL OR d.end_time > g.waited_from))
)
SELECT COALESCE(max(passes), 0), count(DISTINCT job_id) FROM (
    SELECT waiting.job_id, other.user_id, count(*) AS passes
      FROM waits_without_rechecks waiting
      JOIN granted other ON other.user_id <> waiting.user_id
                        AND other.granted_at > waiting.waited_from AND other.granted_at < waiting.granted_at
     GROUP BY waiting.job_id, other.user_id) AS passed
"""


def check_live_jobs_known_to_core(checker: InvariantChecker, core: DevCore, summary: Summary) -> None:
    """I10, while running: every live job's run is known to the core (an admit commits a job only
    after the core confirmed its run; the dev core forgets no run)."""
    summary.i10_checks += 1
    rows = checker.rows("SELECT job_id, run_id, status FROM analysis_jobs WHERE status IN ('queued', 'pending', 'running')")
    for job_id, run_id, status in rows:
        if str(run_id) not in core.runs:
            summary.violations.append(f"I10: {status} job {job_id} has run {run_id}, unknown to the core")


async def check_continuously(checker: InvariantChecker, core: DevCore, summary: Summary, stop: asyncio.Event) -> None:
    waiting_since: dict[str, float] = {}
    grace = 3 * SWEEP_INTERVAL + 2.0
    i9_reported: set[str] = set()
    while not stop.is_set():
        check_core_judges_one_run_per_user(core, summary, i9_reported)
        check_core_judges_at_most_the_capacity(core, summary)
        try:
            summary.violations.extend(await asyncio.to_thread(checker.all_violations))
            await asyncio.to_thread(check_live_jobs_known_to_core, checker, core, summary)
            now = time.monotonic()
            waiting = await asyncio.to_thread(checker.users_waiting_with_free_slot)
            for user in list(waiting_since):
                if user not in waiting:
                    del waiting_since[user]
            for user in waiting:
                first = waiting_since.setdefault(user, now)
                if now - first > grace:
                    summary.violations.append(f"I4: user {user} waited {now - first:.1f}s with a free slot")
                    del waiting_since[user]
        except psycopg.OperationalError:
            waiting_since.clear()  # PostgreSQL is restarting: nothing can be promoted meanwhile
        summary.checks = checker.checks_run
        await asyncio.sleep(0.2)


CHAOS_ACTIONS = ("kill", "deploy", "database", "short_outage", "long_outage", "stranger_lock", "late_commits", "lost_callbacks")
# A stranger (an operator's long transaction, a replica of another version) holds a few users'
# queue locks this long; every other user's calls and completions must go on meanwhile.
STRANGER_LOCK_SECONDS = 3.0
STRANGER_LOCKED_USERS = 3
# Commits are acknowledged late (a synchronous standby that stops acknowledging) this long:
# a change whose deadline passes meanwhile answers OUTCOME_UNKNOWN, never a wrong answer.
LATE_COMMIT_SECONDS = 2.0
# On a slow machine one round of the chaos (a rolling deploy restarts three replicas) can take
# longer than a short run: the run goes on until the round is through, at most this much longer.
FULL_ROUND_GRACE_SECONDS = 180


def _commits_acknowledged_late(database_url: str, late: bool) -> None:
    """Every commit of the torture's own PostgreSQL waits for a standby that never comes (late),
    or no longer (PostgreSQL wakes the waiting commits)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        if late:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'torture_standby_that_never_comes'")
        else:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("SELECT pg_reload_conf()")


async def chaos(cluster: Cluster, database: EmbeddedPostgres, stop: asyncio.Event, users: list[UserState]) -> None:
    summary, core = cluster.summary, cluster.core
    while not stop.is_set():
        for action in CHAOS_ACTIONS:
            if stop.is_set():
                return
            await asyncio.sleep(random.uniform(1.0, 2.5))
            _log_event(f"chaos: {action}")
            summary.chaos[action] += 1
            if action == "kill":
                await cluster.kill_and_restart()
            elif action == "deploy":
                await cluster.rolling_deploy()
            elif action == "database":
                await asyncio.to_thread(database.restart)
                summary.database_restarts += 1
            elif action == "short_outage":
                core.unavailable = True
                await asyncio.sleep(RELEASE_WINDOW / 3)
                core.unavailable = False
                summary.core_outages += 1
            elif action == "long_outage":
                core.fail_releases = True
                await asyncio.sleep(RELEASE_WINDOW + 1.5)
                core.fail_releases = False
                summary.core_outages += 1
            elif action == "stranger_lock":
                locked = [state.user_id for state in random.sample(users, STRANGER_LOCKED_USERS)]
                try:
                    await stranger_holds_user_locks(cluster.database_url, locked, STRANGER_LOCK_SECONDS)
                except psycopg.OperationalError:
                    pass  # PostgreSQL is restarting: the locks go with the connection
            elif action == "late_commits":
                await asyncio.to_thread(_commits_acknowledged_late, cluster.database_url, True)
                try:
                    await asyncio.sleep(LATE_COMMIT_SECONDS)
                finally:
                    await asyncio.to_thread(_commits_acknowledged_late, cluster.database_url, False)
            elif action == "lost_callbacks":
                core.drop_callbacks = True
                await asyncio.sleep(1.5)
                core.drop_callbacks = False
                summary.lost_callback_spells += 1


async def _sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


async def listener_kills(cluster: Cluster, stop: asyncio.Event) -> None:
    """Every few seconds, all through the run (so some come after the last replica restart and
    the streams' last resync is tested): the replicas lose their LISTEN connections."""
    summary = cluster.summary
    while not stop.is_set():
        await _sleep_unless_stopped(stop, random.uniform(2.0, 4.0))
        if stop.is_set():
            return
        try:
            summary.chaos["listener_connections_terminated"] += await asyncio.to_thread(cluster.kill_listeners)
            summary.chaos["listener_kill"] += 1
        except psycopg.OperationalError:
            pass  # PostgreSQL is restarting: every connection is going anyway


async def answer_fault_spells(core: DevCore, summary: Summary, stop: asyncio.Event) -> None:
    """Spells of ambiguous answers on every core method at once: the call is applied but its
    answer lost, or answered after the replica's core deadline, or applied late (after the caller
    gave up). Kinds rotate over the methods, so every three spells cover every (method, kind); a
    share of the calls gets through."""
    spell = 0
    while not stop.is_set():
        await _sleep_unless_stopped(stop, random.uniform(0.5, 1.5))
        if stop.is_set():
            return
        for index, method in enumerate(CORE_METHODS):
            kind = ANSWER_FAULT_KINDS[(spell + index) % len(ANSWER_FAULT_KINDS)]
            if kind == "late":
                seconds = random.uniform(1.2 * CORE_DEADLINE, LONGEST_FAULT_SECONDS)
            elif kind == "late_arrival":
                seconds = random.uniform(0.3 * CORE_DEADLINE, LONGEST_FAULT_SECONDS)
            else:
                seconds = 0.0
            core.answer_faults[method] = AnswerFault(kind, seconds, probability=random.uniform(0.3, 0.5))
            summary.chaos[f"answer_fault_spell:{method}:{kind}"] += 1
        _log_event(f"chaos: answer faults {core.answer_faults}")
        spell += 1
        await _sleep_unless_stopped(stop, random.uniform(1.0, 3.0))
        core.answer_faults.clear()


def _final_checks(database_url: str, admitted: dict[str, str], users: list[UserState], summary: Summary) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        known = {str(j) for (j,) in conn.execute("SELECT job_id FROM analysis_jobs")}
        lost = [job for job in admitted if job not in known]
        summary.violations += [f"lost job {job}" for job in lost]
        counts = dict(conn.execute("SELECT status, count(*) FROM analysis_jobs GROUP BY status").fetchall())
        duplicates = conn.execute(
            "SELECT count(*) FROM (SELECT user_id, idempotency_key FROM analysis_jobs GROUP BY 1, 2 HAVING count(*) > 1) d"
        ).fetchone()[0]
        if duplicates:
            summary.violations.append(f"I7: {duplicates} idempotency keys with two jobs")
        for state in users:
            row = conn.execute(
                """SELECT COALESCE((SELECT balance FROM credit_accounts WHERE user_id = %(u)s), 0),
                          COALESCE((SELECT sum(amount) FROM credit_ledger WHERE user_id = %(u)s AND kind = 'grant'), 0),
                          COALESCE((SELECT sum(amount) FROM credit_ledger WHERE user_id = %(u)s AND kind = 'charge'), 0),
                          COALESCE((SELECT sum(amount) FROM credit_ledger WHERE user_id = %(u)s AND kind = 'refund'), 0)""",
                {"u": state.user_id},
            ).fetchone()
            balance, grants, charges, refunds = row
            if balance != grants + charges + refunds or balance < 0:
                summary.violations.append(f"I3: {state.user_id} balance {balance} != {grants} {charges:+} {refunds:+}")
        for state in users:
            for key, reason in state.refused_keys:
                found = conn.execute(
                    "SELECT count(*) FROM analysis_jobs WHERE user_id = %s AND idempotency_key = %s", (state.user_id, key)
                ).fetchone()[0]
                if found:
                    summary.violations.append(f"I5: an Admit answered {reason} left a job ({state.user_id}, key {key})")
        unfinished_refunds = conn.execute(
            "SELECT count(*) FROM analysis_jobs j JOIN credit_ledger r USING (job_id) WHERE r.kind = 'refund' AND j.status = 'succeeded'"
        ).fetchone()[0]
        if unfinished_refunds:
            summary.violations.append(f"I3: {unfinished_refunds} succeeded jobs were refunded")
    return counts


@pytest.mark.timeout(SECONDS + FULL_ROUND_GRACE_SECONDS + 240)
async def test_torture(tmp_path: Path) -> None:
    state_dir = Path(tempfile.mkdtemp(prefix="acurio-queue-torture-"))
    database = EmbeddedPostgres(state_dir / "pg", durable=False, max_connections=300)
    database.start()
    summary = Summary()
    core = DevCore(judging_seconds=0.2)
    core.delta_judging_seconds = 0  # deltas complete at once: their CompleteRun races the admit's commit
    summary.chaos["instant_deltas"] += 1
    await core.start("127.0.0.1:0")
    skew_available = shutil.which("faketime") is not None
    if os.environ.get("CI") and not skew_available:
        pytest.fail("CI must install Debian's faketime for the torture run's skewed-clock replica")
    database_url = database.dsn()
    await migrations.migrate(database_url)
    cluster = Cluster(database_url, core, summary, tmp_path)
    watchers: list[asyncio.Task[None]] = []
    try:
        for index in range(3):
            await cluster.start_replica(skewed_clock=skew_available and index == 2)
        users = [UserState(f"torture-{i}-{uuid.uuid4().hex[:6]}") for i in range(USERS)]
        await asyncio.gather(*[cluster.replicas[0].stubs.grant(u.user_id, 30) for u in users])
        for u in users:
            u.granted = 30
        admitted: dict[str, str] = {}
        stop = asyncio.Event()
        checker = InvariantChecker(database_url)
        tasks = [asyncio.create_task(simulate_user(cluster, u, stop, admitted)) for u in users]
        tasks.append(asyncio.create_task(check_continuously(checker, core, summary, stop)))
        tasks.append(asyncio.create_task(watch_loop_lag(summary, stop)))
        tasks.append(asyncio.create_task(fit_capacity_to_load(cluster, summary, stop)))
        watched_users = [WatchedUser(u.user_id) for u in users[:WATCHED_USERS]]
        watchers += [asyncio.create_task(watch_user(cluster, w)) for w in watched_users]
        chaos_tasks = [
            asyncio.create_task(chaos(cluster, database, stop, users)),
            asyncio.create_task(answer_fault_spells(core, summary, stop)),
            asyncio.create_task(listener_kills(cluster, stop)),
        ]
        started = time.monotonic()
        await asyncio.sleep(SECONDS)
        # Every fault the checks below count must have happened at least once: the last action
        # of the round has started only when every earlier one is through.
        round_through_by = time.monotonic() + FULL_ROUND_GRACE_SECONDS
        while summary.chaos[CHAOS_ACTIONS[-1]] == 0 and time.monotonic() < round_through_by:
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*chaos_tasks)
        await asyncio.gather(*tasks)

        # Heal and let the queue drain: every admitted job must reach a terminal status, every
        # ended job's run must be settled, and every reserved run of a failed admit canceled.
        core.unavailable = core.fail_releases = core.drop_callbacks = False
        core.answer_faults.clear()
        cluster.point_core_at_live_replicas()
        fitted_capacity = summary.capacity
        await restore_capacity(cluster, summary)
        healed_at = time.monotonic()
        deadline = healed_at + 60
        while time.monotonic() < deadline:
            active = checker.count("SELECT count(*) FROM analysis_jobs WHERE status IN ('queued', 'pending', 'running')")
            unsettled = checker.count("SELECT count(*) FROM analysis_jobs WHERE run_settle_due_at IS NOT NULL")
            reserved = checker.count("SELECT count(*) FROM run_reservations WHERE settled_at IS NULL")
            # A late arrival sent during the chaos may still be applied until LONGEST_FAULT_SECONDS after it.
            if active == 0 and unsettled == 0 and reserved == 0 and time.monotonic() > healed_at + LONGEST_FAULT_SECONDS:
                break
            if fitted_capacity and not summary.capacity_filled_in_drain:
                # As for the fitted capacity: whether the drain filled CAPACITY is read from the
                # fleet's own count (a starved machine holds a run's capacity in release and
                # completion longer than the core judges it).
                filled = checker.count(
                    f"""SELECT count(*) FROM (SELECT queue_capacity_in_use() AS in_use) c
                         WHERE c.in_use >= {CAPACITY}
                           AND EXISTS (SELECT 1 FROM analysis_jobs w WHERE w.status = 'pending'
                                        AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL)"""
                )
                summary.capacity_filled_in_drain = filled > 0
            await asyncio.sleep(0.5)
        else:
            summary.violations.append(
                f"not quiet 60 s after the chaos ended: {active} jobs active, {unsettled} runs unsettled, {reserved} runs reserved"
            )
        summary.violations.extend(checker.all_violations())
        check_core_judges_one_run_per_user(core, summary, set())
        check_core_judges_at_most_the_capacity(core, summary)
        if summary.capacity:
            ((most_passes, waited),) = checker.rows(_PASSED_OVER)
            summary.most_passed_over = int(most_passes)
            # I13 (docs/design.md): users have one slot each, so none has a first-pass run in use
            # while she waits, and each other user passes her at most once (waits during which she
            # had a re-check in use are left out: it ranks her; a queued job canceled with its run
            # unsettled is not in use).
            if most_passes > 1:
                summary.violations.append(f"I13: a waiting user was passed over {most_passes} times by one other user")
        # I10: no job is live, so the core may hold or judge no run at all.
        summary.i10_checks += 1
        orphans = core.live_runs()
        if orphans:
            jobs = dict(
                checker.rows(
                    "SELECT run_id::text, status || CASE WHEN delta_of_job_id IS NULL THEN '' ELSE ' delta' END FROM analysis_jobs"
                )
            )
            described = [
                f"{run_id} ({'held' if run.state == run_pb.RUN_STATE_HELD else 'judging'}, user {run.user_id}, job {jobs.get(run_id, 'none')})"
                for run_id, run in orphans.items()
            ]
            summary.violations.append(
                f"I10: the core still holds or judges {len(orphans)} runs with no live job: " + ", ".join(described[:10])
            )
        await check_streams_match_get_job(cluster, watched_users, quiet_seconds=2.0, timeout=30)
        counts = _final_checks(database_url, admitted, users, summary)
        summary.checks = checker.checks_run
        report = {
            "seconds": round(time.monotonic() - started, 1),
            "users": USERS,
            "operations": dict(summary.operations),
            "answers": dict(summary.codes),
            "refusals_by_reason": dict(summary.reasons),
            "jobs_by_status": counts,
            "kills": summary.kills,
            "restarts": summary.restarts,
            "drains": summary.drains,
            "database_restarts": summary.database_restarts,
            "core_outages": summary.core_outages,
            "lost_callback_spells": summary.lost_callback_spells,
            "chaos_actions": dict(sorted(summary.chaos.items())),
            "core_faults_injected": dict(sorted(core.faults_injected.items())),
            "invariant_checks": summary.checks,
            "i9_checks": summary.i9_checks,
            "i10_checks": summary.i10_checks,
            "i11_checks": summary.i11_checks,
            "capacity": fitted_capacity,
            "capacity_fitted_from_peak": summary.capacity_fitted_from_peak,
            "most_judging_at_fitted_capacity": summary.most_judging_at_fitted_capacity,
            "fitted_capacity_filled": summary.fitted_capacity_filled,
            "capacity_filled_in_drain": summary.capacity_filled_in_drain,
            "i12_checks": summary.i12_checks,
            "core_most_first_pass_judging": core.most_first_pass_judging,
            "core_most_judging": core.most_judging,
            "waiting_jobs_canceled": summary.waiting_canceled,
            "i13_most_passed_over_by_one_user": summary.most_passed_over,
            "stream_reconnects": summary.stream_reconnects,
            "stream_ends": dict(summary.stream_ends),
            "harness_max_loop_lag_seconds": round(summary.max_loop_lag, 3),
            "violations": len(summary.violations),
        }
        print("\ntorture summary:", json.dumps(report, indent=2))
        if os.environ.get("QUEUE_TORTURE_REPORT"):
            Path(os.environ["QUEUE_TORTURE_REPORT"]).write_text(json.dumps(report, indent=2))
        assert summary.violations == [], "\n".join(summary.violations[:30])
        assert sum(summary.operations.values()) > USERS
        assert summary.kills >= 1 and summary.drains >= 1 and summary.database_restarts >= 1
        assert summary.chaos["listener_kill"] >= 1 and sum(core.faults_injected.values()) > 0
        assert summary.chaos["stranger_lock"] >= 1 and summary.chaos["late_commits"] >= 1
        assert summary.i9_checks > 0 and summary.i10_checks > 0 and summary.i12_checks > 0
        if fitted_capacity:
            # The capacity in force was reached (the fitted one during the chaos, or CAPACITY in the
            # drain after it), so I12 and I13 were put to the test.
            reached_fitted = summary.capacity_fitted_from_peak and summary.fitted_capacity_filled
            assert reached_fitted or core.most_first_pass_judging == CAPACITY or summary.capacity_filled_in_drain, (
                f"the capacity was never reached: the fitted {fitted_capacity} never all in use with jobs waiting,"
                f" at most {core.most_first_pass_judging} first-pass runs judged at once under {CAPACITY},"
                f" and never all of {CAPACITY} in use with jobs waiting in the drain"
            )
            assert waited > 0, "no job waited for capacity: I13 was not put to the test"
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await cluster.stop()
        await core.stop()
        database.stop(mode="immediate")
        shutil.rmtree(state_dir, ignore_errors=True)
