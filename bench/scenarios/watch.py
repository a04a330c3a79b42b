"""Scenario 6: WatchJobs fan-out. N streams (1 000; quick: 100) watch one user over 10 HTTP/2
connections; the driver commits a status change of one of that user's jobs every
`watch_interval_seconds` and measures, per change, the time until the first and until the last
watcher received it. Stream caps are raised via QUEUE_MAX_STREAMS(_PER_USER).
"""

from __future__ import annotations

from typing import Any

from bench import dbsetup
from bench.context import Context, load_record, with_peak_rss

WATCHED_USER = "s6-watched"


def run(ctx: Context) -> dict[str, Any]:
    sizes = ctx.sizes
    dsn = ctx.database("s6_watch")
    tick_job = dbsetup.add_watched_user(dsn, WATCHED_USER)
    env = {"QUEUE_MAX_STREAMS_PER_USER": str(sizes.watch_streams + 10), "QUEUE_MAX_STREAMS": str(sizes.watch_streams + 100)}
    params = {
        "address": "",
        "dsn": dsn,
        "user_id": WATCHED_USER,
        "tick_job_id": tick_job,
        "streams": sizes.watch_streams,
        "channels": sizes.watch_channels,
        "ticks": sizes.watch_ticks,
        "interval": sizes.watch_interval_seconds,
    }
    with ctx.stack(dsn, "s6_watch", env=env) as stack:
        params["address"] = stack.address
        result, cpu = ctx.measured_driver("watch_fanout", params, stack.cpu_roots())
        peak = with_peak_rss({}, stack.service.pid)["service_peak_rss_mb"]
    ticks = result["ticks"]
    record = load_record(ok=ticks, seconds=ticks * sizes.watch_interval_seconds, latency_ms=result["last_watcher_ms"], cpu_seconds=cpu)
    record.update(
        streams=result["streams"],
        first_watcher_ms=result["first_watcher_ms"],
        last_watcher_ms=result["last_watcher_ms"],
        streams_open_seconds=round(result["open_seconds"], 2),
        missing_messages=result["missing_messages"],
        stream_errors=result["stream_errors"],
        service_cpu_us_per_message=round(cpu["service"] * 1e6 / (ticks * result["streams"]), 1),
        service_peak_rss_mb=peak,
    )
    record["latency_note"] = "latency_ms is change committed -> last watcher's message; ops are changes"
    return record
