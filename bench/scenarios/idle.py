"""The idle replica: what a replica costs when nobody calls it. A replica and a manual dev core on a fresh database,
metered for `idle_seconds` twice: with no job at all, then with work in flight but nothing due
(users with one job released and held RUNNING and one QUEUED behind it). Nothing calls the
service, so every CPU second here is the replica's own polling: its release dispatcher, its
sweeper (every 30 s, as deployed), its LISTEN connection. The dispatcher once read "nothing
PENDING" as "due now" and spun a claim and a due-time query back to back on every replica.
"""

from __future__ import annotations

import time
from typing import Any

from bench import dbsetup
from bench.context import Context
from bench.ghz import ADMIT, admit_data
from bench.measure import CpuMeter

_USERS_IN_FLIGHT = 50


def run(ctx: Context) -> dict[str, Any]:
    dsn = ctx.database("s8_idle")
    prefix = "s8-u"
    dbsetup.grant_credits(dsn, prefix, _USERS_IN_FLIGHT, 2)
    with ctx.stack(dsn, "s8_idle") as stack:
        time.sleep(1.0)  # past start-up: pools opened, first passes made
        empty = _metered(stack.cpu_roots(), ctx.sizes.idle_seconds)
        admitted = ctx.ghz(stack.address, ADMIT, admit_data(prefix, _USERS_IN_FLIGHT, "idle"), concurrency=4, total=2 * _USERS_IN_FLIGHT)
        if admitted.ok != 2 * _USERS_IN_FLIGHT:
            raise RuntimeError(f"s8_idle: only {admitted.ok}/{2 * _USERS_IN_FLIGHT} admits succeeded: {admitted.errors}")
        counts = dbsetup.wait_for(dsn, prefix, lambda c: c.get("running", 0) == _USERS_IN_FLIGHT, timeout=30)
        if counts.get("running", 0) != _USERS_IN_FLIGHT:
            raise RuntimeError(f"s8_idle: first jobs not all running: {counts}")
        in_flight = _metered(stack.cpu_roots(), ctx.sizes.idle_seconds)
    return {"idle_seconds": ctx.sizes.idle_seconds, "empty": empty, "in_flight": {**in_flight, "jobs": counts}}


def _metered(roots: dict[str, int], seconds: float) -> dict[str, Any]:
    meter = CpuMeter(roots).start()
    time.sleep(seconds)
    cpu = meter.stop()
    cpu.pop("system", None)
    return {"cpu_ms_per_second": {name: round(value * 1000 / seconds, 2) for name, value in cpu.items()}}
