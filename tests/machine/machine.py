"""The invariant machine: runs a sequence of steps (every RPC of every role, every fault of the
harness, waits and quiet periods) against a world, and checks every promise as it goes.

- At the instant the core starts judging a run: I9 (a user's first-pass runs) and I12 (all runs
  against the fleet's capacity), as the core sees them.
- After every step, on the rows: I1, I2, I3 (balance equals ledger; charged once, refunded at most
  once), I5 (a refused admit left no job), I6, I7.
- At every answer: a status the contract allows; a refusal of a caller with credits only for a
  stated reason; an operator's retry never refused by her free-work limit. An Admit answered
  "retry" is made again in the next quiet period (no fault in play): answered "retry" again, it
  is a request that can never succeed.
- All along (fault-free time): I4, no queued job beside a free slot longer than the sweeper allows.
- After each quiet period: I10 (the core's live runs against the live jobs), I11 (each open
  stream's last message per job against GetJob), the storage bound over the whole database, and
  the places at the capacity the operator's search shows (1..n for the n jobs waiting, 0 else).
- At the end: I13 (how often each waiting user was passed over), after a last quiet period.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import psycopg

from queue_service._gen.acurio.core.v1 import run_service_pb2 as run_pb
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.dev.core import DevRun
from tests.harness import InvariantChecker, error_info
from tests.machine import world as w
from tests.machine.model import Model, UserModel

CALL_TIMEOUT = 6.0
# The stub of `w.RoleStubs` each service's calls go through.
_STUB_OF_SERVICE = {
    "AnalysisQueueService": "queue",
    "CreditsService": "credits",
    "OperatorService": "operator",
    "CoreCallbackService": "callback",
}
# A period with no fault in play for this long is quiet: the fleet has had time to notice the
# core and PostgreSQL are back (the core's health, the pool's reconnects).
QUIET_AFTER = 8.0
# I4: a queued job beside a free slot is promoted by the tail call or, at the latest, the sweeper.
I4_GRACE = 3 * w.SWEEP_INTERVAL + 3.0
QUIESCE_TIMEOUT = 45.0
# After a quiet period: how long the service may take to reconcile the core's runs with its jobs
# (the listing every RECONCILE_INTERVAL, the probe of one job's run) before a mismatch is one (I10),
# and how long a stream may lag GetJob (a feed read; 5 s at most when a hint is lost) (I11).
I10_CONVERGE = 4 * w.RECONCILE_INTERVAL + 10.0
I11_CONVERGE = 8.0
# docs/security.md, "What one user can store": a job holds at most this much while it keeps
# its sources, and this much once they are pruned; a ledger entry a few hundred bytes.
STATED_BYTES_WITH_SOURCES = 2_100_000
STATED_BYTES_PRUNED = 36_000
STATED_BYTES_PER_LEDGER_ENTRY = 1_000
STORAGE_SLACK_BYTES = 4 * 1024 * 1024

# Codes any call may hear while faults are in play.
TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED}
ALLOWED_CODES = TRANSIENT | {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
}
# Reasons an Admit may be refused with, for a caller whose balance pays for it; each is checked
# against what the machine knows where it can be (`Machine._judge_admit_refusal`).
ADMIT_REASONS_WITH_CREDIT = {
    "INVALID_REQUEST",
    "CORE_REJECTED",
    "PROVIDER_BUDGET_EXHAUSTED",
    "USER_QUEUE_FULL",
    "USER_DELTA_LIMIT",
    "USER_FREE_WORK_LIMIT",
    "DELTA_BASE_NOT_FOUND",
    "DELTA_BASE_NOT_FINISHED",
    "INSUFFICIENT_CREDITS",
    # Transient, each with "retry with the same key": the core, the database, the replica busy or
    # draining, the user's lock held, a copy of the same admit still under way.
    "CORE_UNAVAILABLE",
    "OUTCOME_UNKNOWN",
    "REPLICA_BUSY",
    "DATABASE_UNAVAILABLE",
    "LOCK_TIMEOUT",
    "SHUTTING_DOWN",
    "CONFLICT",
    "",
}


@dataclasses.dataclass
class Step:
    do: str
    args: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"do": self.do, **self.args}


@dataclasses.dataclass
class Violation:
    invariant: str
    message: str
    step: int

    def __str__(self) -> str:
        return f"{self.invariant} at step {self.step}: {self.message}"


class Machine:
    def __init__(self, world: w.World, seed: int, users: int = 3) -> None:
        self.world = world
        self.rng = random.Random(seed)
        tag = f"{seed:x}-{world.database[-6:]}"
        self.model = Model([UserModel(i, f"m{tag}-u{i}") for i in range(users)])
        self.model.capacity = world.initial_capacity or None
        self.checker = InvariantChecker(world.database_url)
        self.violations: list[Violation] = []
        self.open_finds: list[str] = []
        self.step_index = 0
        self.streams: list[w.OpenStream] = []
        self._background: list[asyncio.Task[Any]] = []
        self._waiting_since: dict[str, float] = {}
        self._reported: set[str] = set()
        self.storage_baseline = 0
        self.storage_peak_allowance = 0
        self.quiesces = 0
        # Calls answered "retry" (UNAVAILABLE, ABORTED), to be made again in the next quiet period.
        self.retry_in_quiet: list[Callable[[], Awaitable[None]]] = []
        world.observer.on_begin.append(self._judging_began)

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        stubs = self.world.replicas[0].stubs
        for user in self.model.users:
            await stubs.credits.GrantCredits(
                _grant(user.user_id, 30, f"{user.user_id}-start"), metadata=w.RoleStubs.metadata("operator"), timeout=CALL_TIMEOUT
            )
            user.granted = 30
        self.storage_baseline = await asyncio.to_thread(self.database_bytes)
        for user in self.model.users:
            stream = w.OpenStream(user.user_id)
            stream.task = asyncio.create_task(w.keep_stream_open(self.world, stream, random.Random(user.index)))
            self.streams.append(stream)
        self._background.append(asyncio.create_task(self._watch_i4()))

    async def stop(self) -> None:
        for task in self._background + [s.task for s in self.streams if s.task]:
            task.cancel()
        await asyncio.gather(*self._background, *[s.task for s in self.streams if s.task], return_exceptions=True)

    def violate(self, invariant: str, message: str, *, once: str | None = None) -> None:
        if once is not None:
            if once in self._reported:
                return
            self._reported.add(once)
        found = Violation(invariant, message, self.step_index)
        known = _open_find(self, found)
        if known:
            # Found before, not fixed yet (OPEN_FINDS): said in the summary, so the
            # run goes on to everything else. Its file goes when the fix lands.
            self.open_finds.append(f"{known}: {found}")
            return
        self.violations.append(found)

    # -- calls -----------------------------------------------------------------------------------

    async def call(self, rpc: str, role: str, invoke: Callable[[w.RoleStubs, Any], Awaitable[Any]], *, replica: int = 0) -> Any:
        """One RPC through a replica (`replica` indexes the live ones), as `role`. Returns the
        response or the AioRpcError; checks the code against the contract and the quiet period."""
        self.model.rpcs_driven[rpc] += 1
        if not self.world.replicas:
            return None
        target = self.world.replicas[replica % len(self.world.replicas)]
        try:
            response = await invoke(target.stubs, w.RoleStubs.metadata(role))
            self.model.codes[f"{rpc}:OK"] += 1
            return response
        except grpc.aio.AioRpcError as exc:
            code, reason = exc.code(), error_info(exc)[1]
            self.model.codes[f"{rpc}:{code.name}/{reason or '-'}"] += 1
            if code not in ALLOWED_CODES:
                self.violate("contract", f"{rpc} as {role} answered {code.name} {reason}: {exc.details()}", once=f"code:{rpc}:{code.name}")
            return exc

    async def ask(self, rpc: str, role: str, request: Any, *, replica: int = 0) -> Any:
        """`call` of the usual shape: `request` sent as it is to the method `rpc` names, within
        CALL_TIMEOUT."""
        service, method = rpc.rsplit("/", 1)
        stub = _STUB_OF_SERVICE[service.rsplit(".", 1)[1]]
        return await self.call(
            rpc, role, lambda s, md: getattr(getattr(s, stub), method)(request, metadata=md, timeout=CALL_TIMEOUT), replica=replica
        )

    # -- checks at the core (I9, I12) ------------------------------------------------------------

    def _judging_began(self, run: DevRun, judging: dict[str, DevRun]) -> None:
        self.model.checks["I9"] += 1
        self.model.checks["I12"] += 1
        user = self._user_of(run.user_id)
        if run.first_pass and user is not None:
            same_user = [r for r in judging.values() if r.user_id == run.user_id and r.first_pass]
            if len(same_user) > user.max_active:
                self.violate("I9", f"the core judges {len(same_user)} first-pass runs of {run.user_id} at once (limit {user.max_active})")
        capacity = self.model.capacity
        if capacity is not None and len(judging) > capacity and run.run_id not in self.model.grandfathered_runs:
            self.violate(
                "I12",
                f"the core judges {len(judging)} runs at once, capacity {capacity}: run {run.run_id} of {run.user_id} started past it",
            )

    def _user_of(self, user_id: str) -> UserModel | None:
        for user in self.model.users:
            if user.user_id == user_id:
                return user
        return None

    # -- checks on the rows (after every step) ---------------------------------------------------

    def check_rows(self) -> None:
        try:
            # I1 against the largest limit each user had (a lowered one is reached as runs end).
            found = self.checker.i2_fifo() + self.checker.i3_ledger() + self.checker.i6_deltas()
            found += self._i1_slot_limit()
            self.settle_capacity()
            with psycopg.connect(self.world.database_url, autocommit=True) as conn:
                dup = conn.execute(
                    "SELECT user_id, idempotency_key FROM analysis_jobs GROUP BY 1, 2 HAVING count(*) > 1 LIMIT 3"
                ).fetchall()
                found += [f"I7: key {k} of {u} has two jobs" for u, k in dup]
                for user in self.model.users:
                    for key, reason in user.refused:
                        hit = conn.execute(
                            "SELECT job_id FROM analysis_jobs WHERE user_id = %s AND idempotency_key = %s", (user.user_id, key)
                        ).fetchone()
                        if hit:
                            found.append(f"I5: an Admit refused {reason} left job {hit[0]} (key {key})")
                twice = conn.execute(
                    """SELECT job_id, kind, count(*) FROM credit_ledger WHERE job_id IS NOT NULL AND kind IN ('charge', 'refund')
                        GROUP BY 1, 2 HAVING count(*) > 1 LIMIT 3"""
                ).fetchall()
                found += [f"I3: job {j} has {n} {k} entries" for j, k, n in twice]
        except psycopg.OperationalError:
            return  # PostgreSQL is restarting: the rows are checked after the next step
        self.model.checks["rows"] += 1
        for message in found:
            self.violate(message.split(":", 1)[0], message.split(":", 1)[1].strip(), once=message)

    def settle_capacity(self, *, quiet: bool = False) -> None:
        """After a SetCoreCapacity whose outcome was unknown: once the rows hold the capacity it
        asked for, that is the one in force (the runs judging then may run on); at a quiet
        period (`quiet`: every commit has landed) whatever the rows hold is."""
        asked = self.model.capacity_unsettled
        if asked is None:
            return
        with psycopg.connect(self.world.database_url, autocommit=True) as conn:
            row = conn.execute("SELECT capacity FROM queue_capacity").fetchone()
        in_force = row[0] if row else 0
        if in_force != asked and not quiet:
            return
        self.model.grandfathered_runs |= set(self.world.observer.judging)
        self.model.capacity = in_force or None
        self.model.capacity_unsettled = None

    def _i1_slot_limit(self) -> list[str]:
        limits = {u.user_id: u.max_active for u in self.model.users}
        with psycopg.connect(self.world.database_url, autocommit=True) as conn:
            rows = conn.execute(
                """SELECT user_id, count(*) FROM analysis_jobs WHERE status IN ('pending', 'running') AND delta_of_job_id IS NULL
                    GROUP BY user_id"""
            ).fetchall()
        return [f"I1: user {u} has {n} active first-pass jobs (limit {limits.get(u, 1)})" for u, n in rows if n > limits.get(u, 1)]

    # -- I4, all along -----------------------------------------------------------------------------

    async def _watch_i4(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            if self.model.faults or self.model.fleet_paused:
                self._waiting_since.clear()
                continue
            try:
                waiting = await asyncio.to_thread(self.checker.users_waiting_with_free_slot)
            except psycopg.Error:
                self._waiting_since.clear()
                continue
            self.model.checks["I4"] += 1
            now = time.monotonic()
            paused = {u.user_id for u in self.model.users if u.paused}
            for user in list(self._waiting_since):
                if user not in waiting or user in paused:
                    del self._waiting_since[user]
            for user in waiting - paused:
                since = self._waiting_since.setdefault(user, now)
                if now - since > I4_GRACE and self.model.quiet_for() > I4_GRACE:
                    self.violate("I4", f"{user} has a queued job beside a free slot for {now - since:.1f} s", once=f"I4:{user}")

    # -- quiet periods: I10, I11, storage --------------------------------------------------------

    async def quiesce(self) -> None:
        """Every fault off; waits until nothing is in motion (no job running or being released,
        no run to settle, no reservation open), except what a pause holds; then checks I10, I11
        and the storage bound."""
        await self.world.heal()
        for name in list(self.model.faults):
            self.model.fault_ended(name)
        self.quiesces += 1
        give_up = time.monotonic() + QUIESCE_TIMEOUT
        motion: list[tuple[Any, ...]] = []
        while time.monotonic() < give_up:
            try:
                motion = await asyncio.to_thread(self._in_motion)
            except psycopg.OperationalError:
                motion = [("database", "unreachable")]
            if not motion and not self.world.observer.judging:
                break
            await asyncio.sleep(0.25)
        else:
            described = ", ".join(" ".join(str(c) for c in row) for row in motion[:6])
            self.violate("I4/I10", f"not quiet {QUIESCE_TIMEOUT:.0f} s after every fault ended: {described}")
        await asyncio.to_thread(self.settle_capacity, quiet=True)
        await self.check_core_against_jobs()
        await self.check_streams()
        await asyncio.to_thread(self.check_storage)
        await asyncio.to_thread(self.check_fair_order)
        await self.check_capacity_positions()
        if self.retry_in_quiet:
            # Quiet long enough for the fleet to have noticed every fault is over.
            await asyncio.sleep(max(0.0, QUIET_AFTER - self.model.quiet_for()))
            retries, self.retry_in_quiet = self.retry_in_quiet, []
            for retry in retries[-10:]:
                await retry()

    def _in_motion(self) -> list[tuple[Any, ...]]:
        paused_users = [u.user_id for u in self.model.users if u.paused]
        with psycopg.connect(self.world.database_url, autocommit=True) as conn:
            rows = conn.execute(
                """SELECT 'job', status, job_id, user_id, last_error FROM analysis_jobs
                    WHERE (status = 'running' OR (status = 'pending' AND NOT (%(fleet)s OR user_id = ANY(%(paused)s))))
                   UNION ALL SELECT 'unsettled run', status, job_id, user_id, last_error FROM analysis_jobs WHERE run_settle_due_at IS NOT NULL
                   UNION ALL SELECT 'open reservation', '', run_id, user_id, '' FROM run_reservations WHERE settled_at IS NULL
                   LIMIT 20""",
                {"fleet": self.model.fleet_paused, "paused": paused_users},
            ).fetchall()
        # A job waiting for the capacity is PENDING, so it counts as in motion above: once the
        # core judges nothing, its turn is free and it must be granted.
        return rows

    async def check_core_against_jobs(self) -> None:
        """I10: every run the core holds or judges belongs to a live job, and every live job's
        run is held or judged by the core, once reconciliation has run (the service's listing
        and probe, every RECONCILE_INTERVAL): a mismatch that outlasts I10_CONVERGE is one."""
        self.model.checks["I10"] += 1
        give_up = time.monotonic() + I10_CONVERGE
        while True:
            problems = await asyncio.to_thread(self._core_against_jobs)
            if not problems or time.monotonic() > give_up:
                break
            await asyncio.sleep(0.5)
        for key, message in problems:
            self.violate("I10", message, once=f"I10:{key}")

    def _core_against_jobs(self) -> list[tuple[str, str]]:
        with psycopg.connect(self.world.database_url, autocommit=True) as conn:
            live = dict(
                conn.execute("SELECT run_id::text, status FROM analysis_jobs WHERE status IN ('queued', 'pending', 'running')").fetchall()
            )
        core = self.world.core
        held_or_judging = {
            run_id: run for run_id, run in list(core.runs.items()) if run.state in (run_pb.RUN_STATE_HELD, run_pb.RUN_STATE_JUDGING)
        }
        ours = {u.user_id for u in self.model.users}
        problems = []
        for run_id, run in held_or_judging.items():
            if run.user_id in ours and run_id not in live and not core._expired(run):
                doing = "judges" if run.state == run_pb.RUN_STATE_JUDGING else "holds"
                problems.append((run_id, f"the core {doing} run {run_id} of no live job"))
        for run_id, status in live.items():
            run = held_or_judging.get(run_id)
            if run is None:
                known = core.runs.get(run_id)
                state = "unknown to the core" if known is None else f"{run_pb.RunState.Name(known.state)} at the core"
                problems.append((run_id, f"a {status} job's run {run_id} is {state}"))
            elif core._expired(run):
                problems.append((run_id, f"a {status} job's held run {run_id} expired at the core"))
        return problems

    async def check_streams(self, quiet_seconds: float = 1.5, timeout: float = 20.0) -> None:
        """I11: once every stream has its snapshot and has been quiet a while, its last message
        per job equals GetJob (and a job GetJob does not find was said to have vanished). A
        stream may lag the database by a feed read (at most FEED_POLL when a hint is lost): a
        difference that outlasts I11_CONVERGE is one."""
        give_up = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if all(s.snapshot_done and now - s.last_message_at >= quiet_seconds for s in self.streams):
                break
            if now > give_up:
                self.violate("I11", f"the WatchJobs streams did not settle within {timeout:.0f} s of a quiet period")
                return
            await asyncio.sleep(0.2)
        give_up = time.monotonic() + I11_CONVERGE
        while True:
            differences = await self._streams_against_get_job()
            if not differences or time.monotonic() > give_up:
                break
            await asyncio.sleep(0.5)
        for invariant, key, message in differences:
            self.violate(invariant, message, once=key)

    async def _streams_against_get_job(self) -> list[tuple[str, str, str]]:
        found = []
        for stream in self.streams:
            for job_id, streamed in list(stream.last.items()):
                self.model.checks["I11"] += 1
                answer = await self.call(
                    "acurio.queue.v1.AnalysisQueueService/GetJob",
                    "web",
                    lambda s, md, job_id=job_id: s.queue.GetJob(queue_pb2.GetJobRequest(job_id=job_id), metadata=md, timeout=CALL_TIMEOUT),
                    replica=self.rng.randrange(8),
                )
                if isinstance(answer, grpc.aio.AioRpcError):
                    if answer.code() == grpc.StatusCode.NOT_FOUND and job_id in stream.last:
                        found.append(
                            (
                                "I11 vanished",
                                f"I11:gone:{job_id}",
                                f"a stream of {stream.user_id} still shows job {job_id}, which GetJob no longer finds",
                            )
                        )
                    continue
                if answer is None or job_id not in stream.last:
                    continue
                streamed = stream.last[job_id]
                current = answer.job
                fields = _COMPARED_FIELDS if job_id not in self.model.time_shifted else _COMPARED_FIELDS_BUT_TIMES
                differences = [
                    f"{field} {_shown(streamed, field)} but GetJob {_shown(current, field)}"
                    for field in fields
                    if _shown(streamed, field) != _shown(current, field)
                ]
                if differences:
                    found.append(
                        ("I11 fields", f"I11:{job_id}:{differences[0]}", f"job {job_id}: the stream says " + "; ".join(differences))
                    )
        return found

    def database_bytes(self) -> int:
        """Every relation of the database (tables with their TOAST and indexes, materialized
        views), from the catalog: a table added later counts without anyone naming it."""
        with psycopg.connect(self.world.database_url, autocommit=True) as conn:
            (total,) = conn.execute(
                """SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                    WHERE c.relkind IN ('r', 'm', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
                      AND n.nspname NOT LIKE 'pg_toast%%'"""
            ).fetchone()
        return int(total)

    def check_storage(self) -> None:
        """What the machine's users stored stays under the stated bound, over the whole database."""
        self.model.checks["storage"] += 1
        with psycopg.connect(self.world.database_url, autocommit=True) as conn:
            with_sources, pruned, entries = conn.execute(
                """SELECT count(*) FILTER (WHERE sources IS NOT NULL), count(*) FILTER (WHERE sources IS NULL),
                          (SELECT count(*) FROM credit_ledger) FROM analysis_jobs"""
            ).fetchone()
        allowance = with_sources * STATED_BYTES_WITH_SOURCES + pruned * STATED_BYTES_PRUNED + entries * STATED_BYTES_PER_LEDGER_ENTRY
        self.storage_peak_allowance = max(self.storage_peak_allowance, allowance)
        grown = self.database_bytes() - self.storage_baseline
        if grown > self.storage_peak_allowance + STORAGE_SLACK_BYTES:
            self.violate(
                "storage bound",
                f"the database grew {grown / 1e6:.1f} MB for {with_sources} jobs with sources, {pruned} pruned and {entries} ledger"
                f" entries; the stated bound allows {self.storage_peak_allowance / 1e6:.1f} MB (+{STORAGE_SLACK_BYTES / 1e6:.0f} MB)",
                once="storage",
            )

    async def check_capacity_positions(self) -> None:
        """What a user is told of her place at the fleet's capacity: at a quiet period (only a pause
        holds jobs waiting then), the PENDING jobs the operator's search shows number their places
        1..n, each once, n being the jobs waiting for a grant; a job that does not wait shows 0.
        A paused user's release that falls due during the check may go back to waiting meanwhile
        (the pause holds it): the rows are read before and after the search, and a check whose
        rows moved is left to the next quiet period."""
        self.model.checks["capacity positions"] += 1
        stubs = self.world.replicas[0].stubs
        try:
            before = await asyncio.to_thread(self._waiting_for_a_grant)
            pending: list[job_pb2.Job] = []
            token = ""
            while True:
                page = await stubs.operator.SearchJobs(
                    op_pb2.SearchJobsRequest(
                        filter=op_pb2.JobFilter(statuses=[job_pb2.JOB_STATUS_PENDING]), page_size=100, page_token=token
                    ),
                    metadata=w.RoleStubs.metadata("operator"),
                    timeout=CALL_TIMEOUT,
                )
                pending += page.jobs
                token = page.next_page_token
                if not token:
                    break
            waiting = await asyncio.to_thread(self._waiting_for_a_grant)
        except (grpc.aio.AioRpcError, psycopg.OperationalError):
            return  # a replica or PostgreSQL went away meanwhile: the next quiet period checks
        if waiting != before:
            self.model.checks["capacity positions moved"] += 1
            return
        self.model.checks["capacity places"] += len(waiting)
        places = sorted(job.capacity_position for job in pending if job.job_id in waiting)
        if places != list(range(1, len(waiting) + 1)):
            self.violate("capacity positions", f"the {len(waiting)} jobs waiting for a grant show places {places}", once=f"places:{places}")
        shown = [job.job_id for job in pending if job.job_id not in waiting and job.capacity_position != 0]
        if shown:
            self.violate("capacity positions", f"jobs that do not wait for a grant show a place: {shown[:3]}", once=f"placed:{shown[:3]}")

    def _waiting_for_a_grant(self) -> set[str]:
        with psycopg.connect(self.world.database_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT job_id FROM analysis_jobs WHERE status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL"
            ).fetchall()
        return {str(job_id) for (job_id,) in rows}

    # -- I13, at the end ---------------------------------------------------------------------------

    def check_fair_order(self) -> int:
        """I13: a job that waited for the capacity was passed over by at most one turn of each
        other user. A turn is a run's first release at the core (first-pass and re-check alike);
        a wait is from the job's capacity_wait_since to its own first release. Left out: waits in
        which her releases were paused or she had another run judging (it ranks her behind), and
        waits in which releases arrived late at the core (a late arrival is not a grant time)."""
        self.model.checks["I13"] += 1
        with psycopg.connect(self.world.database_url, autocommit=True) as conn:
            waited = conn.execute(
                """SELECT job_id::text, run_id::text, user_id, extract(epoch FROM capacity_wait_since)::float8
                     FROM analysis_jobs WHERE capacity_wait_since IS NOT NULL"""
            ).fetchall()
            owners = dict(conn.execute("SELECT run_id::text, user_id FROM analysis_jobs").fetchall())
        releases = self.world.observer.first_release
        spells = self.world.observer.spells
        most = 0
        for job_id, run_id, user_id, since in waited:
            granted = releases.get(run_id)
            user = self._user_of(user_id)
            if granted is None or user is None or granted <= since:
                continue
            if self.model.paused_during(user.index, since, granted) or self.model.fault_during(
                "answer:ReleaseRun:late_arrival", since, granted
            ):
                continue
            if self._had_another_run_in_use(user_id, run_id, since, granted, owners, releases, spells):
                continue
            passes = collections.Counter(
                owners.get(other_run) for other_run, at in releases.items() if since < at < granted and owners.get(other_run) != user_id
            )
            passes.pop(None, None)
            if passes:
                other, count = passes.most_common(1)[0]
                most = max(most, count)
                if count > 1:
                    self.violate(
                        "I13",
                        f"job {job_id} of {user_id} waited {granted - since:.1f} s and {other} took {count} turns meanwhile",
                        once=f"I13:{job_id}",
                    )
        return most

    @staticmethod
    def _had_another_run_in_use(
        user_id: str,
        run_id: str,
        since: float,
        granted: float,
        owners: dict[str, str],
        releases: dict[str, float],
        spells: list[tuple[str, str, bool, float, float | None]],
    ) -> bool:
        """Whether another run of hers was in use (from its first release at the core to the end
        of its judging) at some time of [since, granted]: it ranks her behind users with fewer."""
        ended = {r: e for r, _, _, _, e in spells}
        for other, released in releases.items():
            if other == run_id or owners.get(other) != user_id or released >= granted:
                continue
            end = ended.get(other, released + 1.0) if other in ended else released + 1.0
            if end is None or end > since:
                return True
        return False


# Off where an open find is looked at itself (tests.machine.shorten, a replay of its file).
TOLERATE_OPEN_FINDS = True


# The finds not fixed yet, each with its steps in an open-finds folder beside the replays: its name
# and a narrow test of a violation (the promise and the circumstance it was found in, so that the
# same promise broken any other way still fails the run). None is open now.
OPEN_FINDS: tuple[tuple[str, Callable[[Machine, Violation], bool]], ...] = ()


def _open_find(machine: Machine, found: Violation) -> str:
    """The open find this violation is, or ""."""
    if not TOLERATE_OPEN_FINDS:
        return ""
    return next((name for name, matches in OPEN_FINDS if matches(machine, found)), "")


_COMPARED_FIELDS = (
    "status",
    "queue_position",
    "capacity_position",
    "release_attempts",
    "last_error",
    "end_time",
    "refunded",
    "retried_as_job_ids",
)


_COMPARED_FIELDS_BUT_TIMES = tuple(f for f in _COMPARED_FIELDS if not f.endswith("_time"))


def _shown(job: job_pb2.Job, field: str) -> str:
    if field == "status":
        return job_pb2.JobStatus.Name(job.status)
    if field == "end_time":
        return job.end_time.ToJsonString() if job.HasField("end_time") else "unset"
    if field == "retried_as_job_ids":
        return ",".join(sorted(job.retried_as_job_ids))
    return repr(getattr(job, field))


def _grant(user_id: str, amount: int, key: str) -> Any:
    from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2

    return credits_pb2.GrantCreditsRequest(user_id=user_id, amount=amount, idempotency_key=key)


@contextlib.contextmanager
def fault(model: Model, name: str) -> Any:
    """A fault that lasts as long as the block."""
    model.fault_started(name)
    try:
        yield
    finally:
        model.fault_ended(name)
