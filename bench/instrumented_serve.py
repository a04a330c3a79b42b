"""`queue-service serve` with bench probes, for the stall hunt (`bench.probes.stall_probe`) and the event
loop A/B (`bench.probes.loop_ab`). Not used by `bench.run`: the production process stays unmodified there.

Environment (besides the service's own settings):

- `BENCH_EVENT_LOOP=uvloop` runs the service on uvloop instead of asyncio's default loop
  (`.venv/bin/pip install uvloop`); grpc.aio accepts any asyncio loop.
- `BENCH_PROBE_EVENTS=FILE` appends one JSON line per event, with wall-clock `t` (time.time(), to
  line up with ghz's per-call timestamps and PostgreSQL's log): garbage collections of 2 ms or
  more, event-loop lag of 20 ms or more (a task that sleeps 5 ms and measures how late it wakes),
  the pool's grow/shrink/discard events and its waiting requests, each refresh of the queued-job
  estimate (`recent_judging_seconds`) and each sweeper pass, with their durations.
- `BENCH_GC_FREEZE=1` (or `0`) freezes (or unfreezes) the garbage collector's objects once the
  replica serves, for an A/B of `gc.freeze()`.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import sys
import time
from typing import Any

_GC_MIN_MS = 2.0
_LAG_MIN_MS = 20.0
_LAG_TICK_S = 0.005
_POOL_TICK_S = 0.02


class EventFile:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - line-buffered for the process's life

    def write(self, kind: str, **fields: Any) -> None:
        self._file.write(json.dumps({"t": round(time.time(), 4), "kind": kind, **fields}) + "\n")


def _install_gc_probe(events: EventFile) -> None:
    started: dict[str, float] = {}

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started["t"], started["cpu"] = time.perf_counter(), time.thread_time()
        elif "t" in started:
            ms = (time.perf_counter() - started.pop("t")) * 1000
            cpu_ms = (time.thread_time() - started.pop("cpu")) * 1000
            if ms >= _GC_MIN_MS:
                # cpu_ms is the collection's own work; ms - cpu_ms is time the thread waited for a CPU.
                events.write(
                    "gc",
                    generation=info["generation"],
                    ms=round(ms, 2),
                    cpu_ms=round(cpu_ms, 2),
                    collected=info["collected"],
                    tracked=len(gc.get_objects(2)) if info["generation"] == 2 else None,
                )

    gc.callbacks.append(callback)


class _PoolLogFilter(logging.Filter):
    """The pool's life events only, not its per-loan chatter."""

    WORDS = ("growing", "adding", "discarding", "shrinking", "error", "failed", "broken", "expired")

    def __init__(self, events: EventFile) -> None:
        super().__init__()
        self._events = events

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(word in message for word in self.WORDS):
            self._events.write("pool_log", message=message)
        return False


async def _lag_probe(events: EventFile) -> None:
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(_LAG_TICK_S)
        lag_ms = (loop.time() - before - _LAG_TICK_S) * 1000
        if lag_ms >= _LAG_MIN_MS:
            events.write("loop_lag", ms=round(lag_ms, 1))


async def _pool_probe(events: EventFile, pools: list[Any]) -> None:
    last: tuple[int, int] | None = None
    while True:
        await asyncio.sleep(_POOL_TICK_S)
        for pool in pools:
            stats = pool.get_stats()
            state = (stats.get("pool_size", 0), stats.get("requests_waiting", 0))
            if state != last:
                events.write("pool", name=pool.name, pool_size=state[0], waiting=state[1], available=stats.get("pool_available"))
                last = state


def _timed(events: EventFile, kind: str, owner: Any, name: str) -> None:
    original = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            events.write(kind, ms=round((time.perf_counter() - started) * 1000, 2))

    setattr(owner, name, wrapper)


def install_probes(path: str) -> None:
    from queue_service import cli, server
    from queue_service.engine import sweeper
    from queue_service.store import Statements

    events = EventFile(path)
    _install_gc_probe(events)
    pool_logger = logging.getLogger("psycopg.pool")
    pool_logger.addFilter(_PoolLogFilter(events))
    pools: list[Any] = []
    original_create_pool = server.create_pool

    def create_pool(*args: Any, **kwargs: Any) -> Any:
        pool = original_create_pool(*args, **kwargs)
        pools.append(pool)
        return pool

    server.create_pool = create_pool  # type: ignore[assignment]
    _timed(events, "estimate_refresh", Statements, "recent_judging_seconds")
    _timed(events, "sweep_pass", sweeper.Sweeper, "sweep_once")
    original_serve = cli._serve_until_signal

    async def serve(config: Any, **kwargs: Any) -> None:
        pool_logger.setLevel(logging.INFO)  # after the service's logging set-up, which quiets it
        probes = [asyncio.create_task(_lag_probe(events)), asyncio.create_task(_pool_probe(events, pools))]
        events.write("serving", loop=type(asyncio.get_running_loop()).__module__)

        def on_serving(app: Any) -> None:
            # BENCH_GC_FREEZE=1/0: start-up objects out of (1) or back into (0) the collector's reach.
            if os.environ.get("BENCH_GC_FREEZE") == "1":
                gc.freeze()
            elif os.environ.get("BENCH_GC_FREEZE") == "0":
                gc.unfreeze()
            events.write("gc_state", frozen=gc.get_freeze_count(), tracked=len(gc.get_objects()))

        try:
            await original_serve(config, on_serving=on_serving, **kwargs)
        finally:
            for probe in probes:
                probe.cancel()

    cli._serve_until_signal = serve  # type: ignore[assignment]


def main() -> int:
    if os.environ.get("BENCH_EVENT_LOOP") == "uvloop":
        import uvloop

        uvloop.install()
    if path := os.environ.get("BENCH_PROBE_EVENTS"):
        install_probes(path)
    from queue_service import cli

    return cli.main(["serve"])


if __name__ == "__main__":
    sys.exit(main())
