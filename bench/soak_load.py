"""The soak's load (bench/soak.py): users clicking at a steady rate, and an operator at work.
Runs as its own process, so its CPU is not the service's:

    python -m bench.soak_load '<json params>'

Protocol: it opens its channels and prints `{"ready": true}`, waits for a line `go <t0 ns>` on
stdin (CLOCK_MONOTONIC, the start of the soak's first window), runs `seconds`, then prints one
JSON result line. Every figure is kept per window of `window_seconds` from t0.

The users (`<prefix>0 .. <prefix>{users-1}`) click at `rate` clicks per second altogether
(Poisson arrivals, open loop: a slow service does not slow the clicks down), each click one of:
- an upload (half the clicks): one to three documents admitted back to back (a thesis's chapters),
  each with a title and 3-40 sources (DOIs and citations as written); 3% of documents end FAILED
  at the core (`fail-judging`), 0.5% are refused by it (`unparseable`: CORE_REJECTED, asked for);
- a look at her jobs (the other half): ListJobs (a page of 10), then a re-check (a delta of one of
  her succeeded jobs admitted in this run, 35%) or a cancel of one of her active jobs (20%).
Besides the users, on timers: an operator's RetryJob of a job that failed or was canceled in the
last minute; a burst of 6 re-checks by one user at once (the limit is 4: its USER_DELTA_LIMIT
refusals are asked for); SetCoreCapacity turning between two capacities; the fleet's releases
paused and resumed; single users paused and resumed; and WatchJobs streams (a target number
open, each for a random 20-120 s, then closed) spread over both replicas.

Errors are counted per `action:code:reason`; `ASKED_FOR` lists the ones the load provokes on
purpose or by a race a user makes (a cancel of a job that ended meanwhile).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import math
import random
import sys
import time
import uuid
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2_grpc as queue_grpc

# (action, reason) of the refusals the load asks for: over a limit on purpose, a document the core
# rejects on purpose, the free-work limit its re-checks and cancels run into, and a user's cancel
# of a job that ended between her look and her click.
ASKED_FOR = {
    ("delta_burst", "USER_DELTA_LIMIT"),
    ("delta", "USER_DELTA_LIMIT"),
    ("delta_burst", "USER_FREE_WORK_LIMIT"),
    ("delta", "USER_FREE_WORK_LIMIT"),
    ("admit", "USER_FREE_WORK_LIMIT"),
    ("admit_rejected", "CORE_REJECTED"),
    ("cancel", "JOB_ALREADY_FINISHED"),
    # A re-check of a job she saw succeed, pruned since (an hour after its admit, at the soak's retention).
    ("delta", "DELTA_BASE_NOT_FOUND"),
    ("delta_burst", "DELTA_BASE_NOT_FOUND"),
    # A cancel of a job she last saw active, ended and pruned since her last look.
    ("cancel", "JOB_NOT_FOUND"),
}
ACTIVE = {job_pb2.JOB_STATUS_QUEUED, job_pb2.JOB_STATUS_PENDING, job_pb2.JOB_STATUS_RUNNING}
RETRYABLE = {job_pb2.JOB_STATUS_FAILED, job_pb2.JOB_STATUS_CANCELED}
DEADLINE = 10.0
WORDS = (
    "queues citations fairness graphs retrieval provenance plagiarism bibliometrics scheduling networks semantics "
    "ontologies archives metadata libraries repositories review authorship impact indexing ranking clustering "
    "embeddings corpora annotation evaluation reproducibility licensing preprints journals conferences funding"
).split()
SURNAMES = "Smith Garcia Müller Rossi Dubois Nowak Tanaka Okafor Silva Jensen Kowalski Haddad Ivanova Chen Novak".split()


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def error_key(action: str, exc: grpc.aio.AioRpcError) -> tuple[str, str]:
    """(`action:code:reason`, reason) of a failed call; the reason from its ErrorInfo."""
    reason = ""
    try:
        status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    except ValueError:
        status = None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
    return f"{action}:{exc.code().name}:{reason}", reason


class Windows:
    """Latencies and counts per window of the soak."""

    def __init__(self, t0_ns: int, window_seconds: float) -> None:
        self.t0_ns, self.window_ns = t0_ns, int(window_seconds * 1e9)
        self.latencies: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
        self.counts: dict[tuple[int, str], int] = collections.Counter()

    def index(self, at_ns: int | None = None) -> int:
        return max(0, ((at_ns or time.monotonic_ns()) - self.t0_ns) // self.window_ns)

    def latency(self, kind: str, started_ns: int, seconds: float) -> None:
        self.latencies[(self.index(started_ns), kind)].append(seconds)

    def count(self, key: str, n: int = 1) -> None:
        self.counts[(self.index(), key)] += n


class Load:
    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.random = random.Random(params.get("seed", 1))
        self.users = [f"{params['user_prefix']}{i}" for i in range(params["users"])]
        self.channels: list[grpc.aio.Channel] = []
        self.stream_channels: list[grpc.aio.Channel] = []
        self.turn = itertools.count()
        # What the load knows of each user's jobs: job id -> (status, admitted at (monotonic), ended at (epoch seconds, the service's clock)).
        self.jobs: dict[str, collections.OrderedDict[str, list[Any]]] = collections.defaultdict(collections.OrderedDict)
        self.retryable: collections.deque[tuple[float, str]] = collections.deque(maxlen=500)
        self.errors: collections.Counter[str] = collections.Counter()
        self.asked: collections.Counter[str] = collections.Counter()
        self.fleet_pauses: list[list[int]] = []
        self.user_pauses: list[list[Any]] = []
        self.in_flight: set[asyncio.Task[None]] = set()
        self.streams: set[asyncio.Task[None]] = set()
        self.stream_figures: collections.Counter[str] = collections.Counter()
        self.shed = 0
        self.windows: Windows | None = None
        self.until = math.inf  # when the clicks stop (a pause ends by then too)

    # -- helpers ---------------------------------------------------------------------------------

    def _stub(self, user: str) -> queue_grpc.AnalysisQueueServiceStub:
        return self.queue[next(self.turn) % len(self.queue)]

    def _operator(self) -> op_grpc.OperatorServiceStub:
        return self.operator[next(self.turn) % len(self.operator)]

    async def _call(self, action: str, call: Any) -> Any:
        """Runs one call, timing it and counting its outcome; None when it failed."""
        assert self.windows is not None
        started_ns = time.monotonic_ns()
        try:
            answer = await call
        except grpc.aio.AioRpcError as exc:
            key, reason = error_key(action, exc)
            (self.asked if (action, reason) in ASKED_FOR else self.errors)[key] += 1
            self.windows.count(f"error:{action}")
            return None
        self.windows.latency(action, started_ns, (time.monotonic_ns() - started_ns) / 1e9)
        self.windows.count(f"ok:{action}")
        return answer

    def _note(self, job: job_pb2.Job) -> None:
        known = self.jobs[job.user_id]
        entry = known.get(job.job_id)
        if entry is None:
            return
        entry[0] = job.status
        if job.status in RETRYABLE and entry[2] is None:
            # When it ended by the service's clock, not when the load saw it end: a user's next look
            # comes up to a minute later, and an operator's retry picked by the time seen came after
            # the inputs' retention (JOB_INPUTS_PRUNED, a refusal the load had not meant to ask for).
            entry[2] = job.end_time.ToNanoseconds() / 1e9 if job.HasField("end_time") else time.time()
            self.retryable.append((entry[2], job.job_id))

    def _remember(self, job: job_pb2.Job) -> None:
        known = self.jobs[job.user_id]
        known[job.job_id] = [job.status, time.monotonic(), None]
        while len(known) > 20:
            known.popitem(last=False)

    def _document(self, user: str) -> tuple[queue_pb2.AdmitRequest, str]:
        r = self.random.random()
        action, marker = "admit", ""
        if r < 0.005:
            action, marker = "admit_rejected", "unparseable-"
        elif r < 0.035:
            marker = "fail-judging-"
        words = self.random.sample(WORDS, 4)
        title = f"{words[0].capitalize()} and {words[1]}: {words[2]} of {words[3]}, chapter {self.random.randint(1, 9)}"
        sources = []
        for _ in range(self.random.randint(3, 40)):
            author, year = self.random.choice(SURNAMES), self.random.randint(1975, 2025)
            cited = " ".join(self.random.sample(WORDS, 5)).capitalize()
            sources.append(
                job_pb2.Source(
                    doi=f"10.{self.random.randint(1000, 9998)}/{self.random.choice(WORDS)}.{self.random.randint(1, 10**6)}",
                    citation=f"{author}, {author[0]}. ({year}). {cited}. Journal of {self.random.choice(WORDS).capitalize()}, "
                    f"{self.random.randint(1, 60)}({self.random.randint(1, 12)}), {self.random.randint(1, 400)}-{self.random.randint(401, 900)}.",
                )
            )
        request = queue_pb2.AdmitRequest(
            user_id=user,
            idempotency_key=f"soak-{uuid.uuid4()}",
            document=job_pb2.Document(uri=f"s3://theses/{user}/{marker}{uuid.uuid4()}.pdf", title=title),
            sources=sources,
        )
        return request, action

    # -- the users -------------------------------------------------------------------------------

    async def upload(self, user: str) -> None:
        for _ in range(self.random.choice((1, 1, 1, 2, 2, 3))):
            request, action = self._document(user)
            answer = await self._call(action, self._stub(user).Admit(request, timeout=DEADLINE))
            if answer is not None:
                self._remember(answer.job)

    async def look(self, user: str) -> None:
        answer = await self._call(
            "list", self._stub(user).ListJobs(queue_pb2.ListJobsRequest(user_id=user, page_size=10), timeout=DEADLINE)
        )
        if answer is None:
            return
        for job in answer.jobs:
            self._note(job)
        known = self.jobs[user]
        r = self.random.random()
        if r < 0.35:
            # A re-check of a succeeded job of this run (older ones may be pruned meanwhile).
            bases = [job_id for job_id, (status, _, _) in known.items() if status == job_pb2.JOB_STATUS_SUCCEEDED]
            if bases:
                await self.delta(user, self.random.choice(bases), "delta")
        elif r < 0.55:
            active = [job_id for job_id, (status, _, _) in known.items() if status in ACTIVE]
            if active:
                job_id = self.random.choice(active)
                cancel = self._stub(user).CancelJob(queue_pb2.CancelJobRequest(job_id=job_id, user_id=user), timeout=DEADLINE)
                answer = await self._call("cancel", cancel)
                if answer is not None:
                    self._note(answer.job)

    async def delta(self, user: str, base: str, action: str) -> None:
        request = queue_pb2.AdmitRequest(
            user_id=user,
            idempotency_key=f"soak-delta-{uuid.uuid4()}",
            delta_of_job_id=base,
            sources=[job_pb2.Source(doi=f"10.5555/changed.{self.random.randint(1, 10**6)}", citation="A citation changed since")],
        )
        await self._call(action, self._stub(user).Admit(request, timeout=DEADLINE))

    async def click(self) -> None:
        user = self.random.choice(self.users)
        if self.random.random() < 0.5:
            await self.upload(user)
        else:
            await self.look(user)

    async def clicks(self, until: float) -> None:
        rate, most = self.p["rate"], self.p.get("max_in_flight", 400)
        next_at = time.monotonic()
        while True:
            next_at += self.random.expovariate(rate)
            if next_at >= until:
                return
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if len(self.in_flight) >= most:
                self.shed += 1  # the service is this far behind: the click is dropped, and counted
                continue
            task = asyncio.create_task(self.click())
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)

    # -- the operator and the timers -------------------------------------------------------------

    async def every(self, seconds: float, action: Any, until: float) -> None:
        if seconds <= 0:
            return
        next_at = time.monotonic() + seconds * self.random.uniform(0.2, 1.0)
        while next_at < until:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await action()
            next_at += seconds

    async def retry(self) -> None:
        # A job that ended within the last minute (seen in any order: by each user's next look).
        while self.retryable:
            ended_at, job_id = self.retryable.popleft()
            if time.time() - ended_at > 60:
                continue
            await self._call("retry", self._operator().RetryJob(op_pb2.RetryJobRequest(job_id=job_id), timeout=DEADLINE))
            return

    async def delta_burst(self) -> None:
        users = [u for u, known in self.jobs.items() if any(status == job_pb2.JOB_STATUS_SUCCEEDED for status, _, _ in known.values())]
        if users:
            user = self.random.choice(users)
            # Her latest success (noted last), as a user re-checks: the oldest is likely pruned.
            base = [job_id for job_id, (status, _, _) in self.jobs[user].items() if status == job_pb2.JOB_STATUS_SUCCEEDED][-1]
            await asyncio.gather(*(self.delta(user, base, "delta_burst") for _ in range(6)))

    async def capacity_turn(self) -> None:
        self._capacity_low = not getattr(self, "_capacity_low", False)
        capacity = self.p["capacity_low"] if self._capacity_low else self.p["capacity"]
        await self._call(
            "set_capacity", self._operator().SetCoreCapacity(op_pb2.SetCoreCapacityRequest(capacity=capacity), timeout=DEADLINE)
        )

    async def fleet_pause(self) -> None:
        pause = [time.monotonic_ns(), 0]
        self.fleet_pauses.append(pause)
        request = op_pb2.SetReleasesPausedRequest(paused=True, note="soak: a fleet pause")
        await self._call("pause", self._operator().SetReleasesPaused(request, timeout=DEADLINE))
        await asyncio.sleep(min(self.p["fleet_pause_seconds"], max(0.0, self.until - time.monotonic())))
        resume = op_pb2.SetReleasesPausedRequest(paused=False, note="soak: resumed")
        await self._call("resume", self._operator().SetReleasesPaused(resume, timeout=DEADLINE))
        pause[1] = time.monotonic_ns()

    async def user_pause(self) -> None:
        user = self.random.choice(self.users)
        pause = [user, time.monotonic_ns(), 0]
        self.user_pauses.append(pause)
        request = op_pb2.SetReleasesPausedRequest(paused=True, user_id=user, note="soak: a user's pause")
        await self._call("pause_user", self._operator().SetReleasesPaused(request, timeout=DEADLINE))
        await asyncio.sleep(min(self.p["user_pause_seconds"], max(0.0, self.until - time.monotonic())))
        resume = op_pb2.SetReleasesPausedRequest(paused=False, user_id=user, note="soak: resumed")
        await self._call("resume_user", self._operator().SetReleasesPaused(resume, timeout=DEADLINE))
        pause[2] = time.monotonic_ns()

    # -- WatchJobs streams -----------------------------------------------------------------------

    async def watch(self, user: str, seconds: float) -> None:
        assert self.windows is not None
        stub = self.stream_stubs[next(self.turn) % len(self.stream_stubs)]
        call = stub.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user))
        self.stream_figures["opened"] += 1
        self.windows.count("streams_opened")

        async def read() -> None:
            async for message in call:
                self.stream_figures["messages"] += 1
                if message.HasField("job"):
                    self._note(message.job)

        try:
            await asyncio.wait_for(read(), timeout=seconds)
            self.stream_figures["ended_by_server"] += 1
        except TimeoutError:
            call.cancel()
            self.stream_figures["closed"] += 1
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                key, reason = error_key("watch", exc)
                self.errors[key] += 1
                self.windows.count("error:watch")

    async def keep_streams(self, until: float) -> None:
        target = self.p["streams"]
        while time.monotonic() < until:
            for _ in range(min(25, target - len(self.streams))):
                seconds = self.random.uniform(self.p.get("stream_min_seconds", 20), self.p.get("stream_max_seconds", 120))
                task = asyncio.create_task(self.watch(self.random.choice(self.users), min(seconds, until - time.monotonic())))
                self.streams.add(task)
                task.add_done_callback(self.streams.discard)
            self.stream_figures["most_open"] = max(self.stream_figures["most_open"], len(self.streams))
            await asyncio.sleep(0.2)

    # -- the run ---------------------------------------------------------------------------------

    def _open_channels(self) -> None:
        """The channels, on the running loop: one per replica for unary calls, a few per replica
        for the streams (each its own HTTP/2 connection, as separate web backends would have)."""
        params = self.p
        options = [("grpc.use_local_subchannel_pool", 1)]
        self.channels = [grpc.aio.insecure_channel(address, options=options) for address in params["addresses"]]
        self.stream_channels = [
            grpc.aio.insecure_channel(address, options=options)
            for address in params["addresses"]
            for _ in range(params.get("stream_channels_per_replica", 4))
        ]
        self.queue = [queue_grpc.AnalysisQueueServiceStub(c) for c in self.channels]
        self.operator = [op_grpc.OperatorServiceStub(c) for c in self.channels]
        self.stream_stubs = [queue_grpc.AnalysisQueueServiceStub(c) for c in self.stream_channels]

    async def run(self) -> dict[str, Any]:
        self._open_channels()
        for channel in self.channels + self.stream_channels:
            await asyncio.wait_for(channel.channel_ready(), timeout=30)
        _emit({"ready": True})
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        t0_ns = int(line.split()[1])
        self.windows = Windows(t0_ns, self.p["window_seconds"])
        until = self.until = t0_ns / 1e9 + self.p["seconds"]
        p = self.p
        timers = [
            self.every(p["retry_every_seconds"], self.retry, until),
            self.every(p["delta_burst_every_seconds"], self.delta_burst, until),
            self.every(p["capacity_turn_seconds"], self.capacity_turn, until),
            self.every(p["fleet_pause_every_seconds"], self.fleet_pause, until),
            self.every(p["user_pause_every_seconds"], self.user_pause, until),
        ]
        await asyncio.gather(self.clicks(until), self.keep_streams(until), *timers)
        done, late = await asyncio.wait(self.in_flight, timeout=30) if self.in_flight else (set(), set())
        for task in list(self.streams) + list(late):
            task.cancel()
        await asyncio.gather(*self.streams, *late, return_exceptions=True)
        for channel in self.channels + self.stream_channels:
            await channel.close()
        return self.result(late=len(late))

    def result(self, late: int) -> dict[str, Any]:
        assert self.windows is not None
        per_window: dict[int, dict[str, Any]] = collections.defaultdict(lambda: {"latency_ms": {}, "counts": {}})
        for (index, kind), seconds in self.windows.latencies.items():
            ordered = sorted(seconds)

            def rank(q: float, ordered: list[float] = ordered) -> float:
                return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000, 3)

            per_window[index]["latency_ms"][kind] = {"count": len(ordered), "p50": rank(0.5), "p99": rank(0.99), "max": rank(1.0)}
        for (index, key), n in self.windows.counts.items():
            per_window[index]["counts"][key] = n
        return {
            "windows": {str(k): v for k, v in sorted(per_window.items())},
            # Every admit's latency by window, for p99s pooled over minutes (bench.soak's targets).
            "admit_seconds": {str(index): seconds for (index, kind), seconds in self.windows.latencies.items() if kind == "admit"},
            "errors": dict(self.errors),
            "asked_for": dict(self.asked),
            "fleet_pauses_ns": self.fleet_pauses,
            "user_pauses_ns": self.user_pauses,
            "streams": dict(self.stream_figures),
            "clicks_shed": self.shed,
            "calls_unfinished_at_end": late,
        }


def main() -> None:
    params = json.loads(sys.argv[1])
    result = asyncio.run(Load(params).run())
    _emit({"result": result})


if __name__ == "__main__":
    main()
