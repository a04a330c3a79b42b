"""What a WatchJobs stream whose client never reads may hold: memory measured as the RSS of a real
`queue-service serve` process, with stalled readers on raw HTTP/2 connections.

A stalled reader opens WatchJobs and then never grants the stream more HTTP/2 window: the server
may send it `STALLED_WINDOW` bytes and must then wait. What the replica holds for such a stream
(the snapshot or resync it is sending, the changes queued behind it, gRPC's own buffers) is what
the budget in docs/operations.md bounds. Growth is measured against a baseline taken in the same
test, after the same process has already served (and closed) one stream, so that imports, pools
and caches are warm; the bounds are generous on purpose and still far below what an unbounded
stream takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import urllib.request

import h2.config
import h2.connection
import h2.events
import h2.settings
import psycopg

from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.dev.embedded_postgres import free_port
from tests.harness import S, new_user

STALLED_WINDOW = 4096
MIB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class StalledWatches:
    """One raw HTTP/2 connection whose WatchJobs streams each accept `STALLED_WINDOW` bytes and are
    then not read again until `resume`. The socket itself is read (settings, pings, the bytes the
    window allows), so what the server holds back is held by HTTP/2 flow control alone, as for a
    client whose application stopped reading one stream while its connection stays healthy."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.received: dict[int, int] = {}
        self.ended: dict[int, str] = {}
        self._data: dict[int, bytearray] = {}
        self._resumed: set[int] = set()
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, address: str) -> StalledWatches:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        watches = cls(reader, writer)
        watches._h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STALLED_WINDOW, h2.settings.SettingCodes.ENABLE_PUSH: 0},
        )
        watches._h2.initiate_connection()
        # The connection's window never limits: only each stream's own does.
        watches._h2.increment_flow_control_window(2**30)
        await watches._flush()
        watches._pump = asyncio.create_task(watches._read())
        return watches

    async def watch(self, user_id: str) -> int:
        stream_id = self._h2.get_next_available_stream_id()
        self._h2.send_headers(
            stream_id,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/acurio.queue.v1.AnalysisQueueService/WatchJobs"),
                (":authority", "queue"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        body = queue_pb2.WatchJobsRequest(user_id=user_id).SerializeToString()
        self._h2.send_data(stream_id, struct.pack(">BI", 0, len(body)) + body, end_stream=True)
        self.received[stream_id] = 0
        self._data[stream_id] = bytearray()
        await self._flush()
        return stream_id

    async def resume(self, stream_id: int) -> None:
        """The client reads the stream again: its window opens and stays open."""
        self._resumed.add(stream_id)
        self._h2.acknowledge_received_data(self.received[stream_id], stream_id)
        self._h2.increment_flow_control_window(2**20, stream_id=stream_id)
        await self._flush()

    def messages(self, stream_id: int) -> list[queue_pb2.WatchJobsResponse]:
        """The messages the stream has received so far (gRPC's length-prefixed frames)."""
        data, at, found = bytes(self._data[stream_id]), 0, []
        while at + 5 <= len(data):
            (length,) = struct.unpack(">I", data[at + 1 : at + 5])
            if at + 5 + length > len(data):
                break
            found.append(queue_pb2.WatchJobsResponse.FromString(data[at + 5 : at + 5 + length]))
            at += 5 + length
        return found

    def stalled(self) -> bool:
        """Every stream has used up its window: the server holds the rest."""
        return all(n >= STALLED_WINDOW for n in self.received.values())

    async def _flush(self) -> None:
        self._writer.write(self._h2.data_to_send())
        await self._writer.drain()

    async def _read(self) -> None:
        while data := await self._reader.read(65536):
            for event in self._h2.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.received[event.stream_id] += event.flow_controlled_length
                    self._data[event.stream_id] += event.data
                    if event.stream_id in self._resumed:
                        self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    # Otherwise never acknowledged: the stream's window stays closed.
                elif isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    headers = dict(event.headers)
                    if "grpc-status" in headers:  # trailers, or a refusal (trailers only)
                        self.ended[event.stream_id] = f"{headers['grpc-status']} {headers.get('grpc-message', '')}"
                elif isinstance(event, h2.events.StreamReset):
                    self.ended[event.stream_id] = f"reset {event.error_code}"
            await self._flush()

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await self._pump
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()


async def _until(check, what: str, timeout: float = 60, details=lambda: "") -> None:  # type: ignore[no-untyped-def]
    """Waits on a condition, not a clock; the timeout only ends a test that would hang."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + timeout
    while not check():
        if loop.time() > give_up_at:
            raise AssertionError(f"timed out waiting for {what} {details()}")
        await asyncio.sleep(0.05)


async def _user_with_running_deltas(stubs, core, database_url: str, count: int) -> str:  # type: ignore[no-untyped-def]
    """A user whose `count` delta re-checks are all RUNNING: one made through the API, the rest
    copies of its row (with their own ids and queue places), which is how the database would look
    had each been admitted."""
    user = new_user()
    await stubs.grant(user, 1)
    base = await stubs.admit(user)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_RUNNING)
    await core.finish(base.run_id)
    await stubs.wait_for(base.job_id, S.JOB_STATUS_SUCCEEDED)
    delta = await stubs.admit(user, uri="", delta_of=base.job_id)
    await stubs.wait_for(delta.job_id, S.JOB_STATUS_RUNNING)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq,
                                          delta_of_job_id, price, release_attempts, next_reconcile_at,
                                          create_time, promote_time, start_time)
               SELECT gen_random_uuid(), user_id, gen_random_uuid(), idempotency_key || '-copy-' || n, request_digest,
                      status, nextval('analysis_jobs_queue_seq'), delta_of_job_id, price, release_attempts,
                      next_reconcile_at, create_time, promote_time, start_time
                 FROM analysis_jobs, generate_series(1, %s) AS n
                WHERE job_id = %s""",
            (count - 1, delta.job_id),
        )
    return user


def _open_watch_streams(metrics_port: int) -> float:
    """The replica's own count of open WatchJobs streams (its `queue.watch.streams` gauge)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line.startswith("queue_watch_streams"))


async def _warm_up(stubs, user: str, metrics_port: int) -> None:  # type: ignore[no-untyped-def]
    """One stream served and closed, so the baseline includes what any first stream loads."""
    call = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=user), timeout=30)
    async for message in call:
        if message.snapshot_complete:
            break
    assert _open_watch_streams(metrics_port) == 1  # the gauge this wait reads does count the stream
    call.cancel()
    # The replica lets go of a canceled stream a moment later; until then it still counts against
    # the user's cap of 16, and the 16th stalled stream would be refused.
    await _until(lambda: _open_watch_streams(metrics_port) == 0, "the replica to close the warm-up stream")


async def _user_with_queue(stubs, database_url: str, queued: int) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    """A user with a running job and `queued` jobs behind it: the first two queued admitted through
    the API (and returned), the rest copies of the second's row, which is how the database would
    look had each been admitted."""
    user = new_user()
    await stubs.grant(user, 3)
    running = await stubs.admit(user)
    front = [await stubs.admit(user), await stubs.admit(user)]
    await stubs.wait_for(running.job_id, S.JOB_STATUS_RUNNING)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO analysis_jobs (job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq,
                                          price, create_time)
               SELECT gen_random_uuid(), user_id, gen_random_uuid(), idempotency_key || '-copy-' || n, request_digest,
                      status, nextval('analysis_jobs_queue_seq'), price, create_time
                 FROM analysis_jobs, generate_series(1, %s) AS n
                WHERE job_id = %s""",
            (queued - 2, front[1].job_id),
        )
    return user, [job.job_id for job in front]


async def _stall(replica, streams: list[str]):  # type: ignore[no-untyped-def]
    connection = await StalledWatches.open(replica.address)
    for user in streams:
        await connection.watch(user)
    await _until(
        lambda: connection.stalled() or connection.ended,
        "every stream to use up its window",
        details=lambda: (
            f"({sum(n < STALLED_WINDOW for n in connection.received.values())} of {len(connection.received)} streams short of it)"
        ),
    )
    assert not connection.ended, f"streams ended: {connection.ended}"
    return connection


async def test_stalled_watch_streams_of_a_user_with_1500_running_deltas_hold_a_page_of_the_snapshot_each(
    services, database_url: str
) -> None:  # type: ignore[no-untyped-def]
    """16 streams (the per-user cap) of a user with 1 500 running delta re-checks, none read past
    the first 4 KB. Unbounded, each held the whole snapshot: 2.6 MB each, +41 MiB in all."""
    core = await services.core()
    metrics_port = free_port()
    replica = await services.start_process(
        core, QUEUE_MAX_ACTIVE_DELTAS_PER_USER="2000", QUEUE_LOG_LEVEL="warning", QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}"
    )
    stubs = replica.stubs
    user = await _user_with_running_deltas(stubs, core, database_url, 1500)
    await _warm_up(stubs, user, metrics_port)
    baseline = rss_bytes(replica.process.pid)

    connection = await _stall(replica, [user] * 16)
    try:
        # The replica keeps serving while its streams stall.
        assert len(await stubs.jobs(user)) == 1501
        grown = rss_bytes(replica.process.pid) - baseline
    finally:
        await connection.close()
    per_stream = grown / 16
    print(f"RSS {baseline / MIB:.1f} MiB, +{grown / MIB:.1f} MiB for 16 stalled streams, {per_stream / 1024:.0f} KB each")
    assert per_stream < 256 * 1024, f"each stalled stream of a 1 500-job user holds {per_stream / 1024:.0f} KB"


async def test_stalled_watch_streams_of_users_whose_queues_move_hold_a_bounded_backlog_each(services, database_url: str) -> None:  # type: ignore[no-untyped-def]
    """24 users, each with a running job and 100 queued behind it, each watched by a stream that
    stops reading after 4 KB. Then each user cancels the two front jobs of the queue, and each
    cancel sends the stalled stream the new position of every job behind it (~200 changes).
    Unbounded, each stream held its snapshot and every change (up to 256): ~0.4 MB each. A stream
    whose reader then resumes catches up: after its resync, its last message for each job says
    what ListJobs says (I11), the canceled jobs included."""
    core = await services.core()
    metrics_port = free_port()
    replica = await services.start_process(core, QUEUE_LOG_LEVEL="warning", QUEUE_METRICS_ADDR=f"127.0.0.1:{metrics_port}")
    stubs = replica.stubs
    users = [await _user_with_queue(stubs, database_url, 100) for _ in range(24)]
    await _warm_up(stubs, users[0][0], metrics_port)
    baseline = rss_bytes(replica.process.pid)

    connection = await _stall(replica, [user for user, _ in users])
    first_user, first_stream = users[0][0], min(connection.received)
    # A stream that keeps reading tells when the hub has handed on the last cancel (it hands on
    # changes in the order they were made, to every stream of the user at once).
    last_user, last_front = users[-1]
    reading = stubs.queue.WatchJobs(queue_pb2.WatchJobsRequest(user_id=last_user), timeout=120)
    messages: list[queue_pb2.WatchJobsResponse] = []

    async def read() -> None:
        async for message in reading:
            messages.append(message)

    reader = asyncio.create_task(read())
    try:
        await _until(lambda: any(m.snapshot_complete for m in messages) or reader.done(), "the reading stream's snapshot")
        for user, front in users:
            for job_id in front:
                await stubs.queue.CancelJob(queue_pb2.CancelJobRequest(job_id=job_id, user_id=user), timeout=10)
        await _until(
            lambda: reader.done() or any(m.job.job_id == last_front[1] and m.job.status == S.JOB_STATUS_CANCELED for m in messages),
            "the last cancel to reach the streams",
        )
        assert not reader.done(), reader
        assert not connection.ended, f"streams ended: {connection.ended}"
        grown = rss_bytes(replica.process.pid) - baseline
        per_stream = grown / len(users)
        print(f"RSS {baseline / MIB:.1f} MiB, +{grown / MIB:.1f} MiB for {len(users)} stalled streams, {per_stream / 1024:.0f} KB each")
        assert per_stream < 256 * 1024, f"each stalled stream of a user with 100 queued jobs holds {per_stream / 1024:.0f} KB"

        await connection.resume(first_stream)
        expected = {job.job_id: (job.status, job.queue_position) for job in await stubs.jobs(first_user)}
        assert len(expected) == 101 and sum(status == S.JOB_STATUS_CANCELED for status, _ in expected.values()) == 2

        def caught_up() -> bool:
            messages = connection.messages(first_stream)
            last = {m.job.job_id: (m.job.status, m.job.queue_position) for m in messages if m.HasField("job")}
            return any(m.resync_complete for m in messages) and last == expected

        await _until(lambda: caught_up() or first_stream in connection.ended, "the resumed stream to catch up")
        assert first_stream not in connection.ended, connection.ended[first_stream]
        assert sum(m.snapshot_complete for m in connection.messages(first_stream)) == 1
    finally:
        reading.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await connection.close()
