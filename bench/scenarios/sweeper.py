"""Scenario 5: the cost of one sweeper pass with 100 000 idle users and 1 000 jobs in flight.

On the history database (1 000 000 finished jobs), after ending whatever the history scenario
left in flight and adding `in_flight_users` users with one RUNNING job and three QUEUED behind it
(nothing due: no promotion, expiry or reconciliation to do, which is the steady state). The
driver times `Sweeper.sweep_once()` in process, then each of its statements alone. No service is
running, so nothing else competes; the core address is unused when nothing is due.

A second, smaller measurement (`deep_queues`: 1 000 users x 10 queued) shows how the pass grows
with the number of *queued jobs* rather than users (see users_needing_promotion in explain.txt).
"""

from __future__ import annotations

from typing import Any

from bench import dbsetup
from bench.context import Context
from bench.measure import unattributed_cpu

IN_FLIGHT_PREFIX = "fl-u"
_UNUSED_CORE = "127.0.0.1:9"


def prepare_in_flight(
    ctx: Context, dsn: str, *, users: int | None = None, queued_per_user: int | None = None, prefix: str = IN_FLIGHT_PREFIX
) -> int:
    dbsetup.finish_in_flight(dsn)
    return dbsetup.add_in_flight(
        dsn,
        users=users or ctx.sizes.in_flight_users,
        queued_per_user=queued_per_user or ctx.sizes.in_flight_queued_per_user,
        user_prefix=prefix,
    )


def _measure(ctx: Context, dsn: str, passes: int) -> dict[str, Any]:
    params = {"dsn": dsn, "core_addr": _UNUSED_CORE, "passes": passes}
    result, cpu = ctx.measured_driver("sweeper", params, {"postgres": ctx.db.pid})
    result["unattributed_cpu_seconds"] = round(unattributed_cpu(cpu), 3)
    cpu.pop("system")
    result["cpu_ms_per_pass"] = {name: round(seconds * 1000 / passes, 3) for name, seconds in cpu.items()}
    return result


def run(ctx: Context, dsn: str) -> dict[str, Any]:
    sizes = ctx.sizes
    deep_in_flight = prepare_in_flight(
        ctx, dsn, users=sizes.deep_queue_users, queued_per_user=sizes.deep_queue_queued_per_user, prefix="deep-u"
    )
    deep = _measure(ctx, dsn, max(3, sizes.sweeper_passes // 4))
    deep.update(in_flight=deep_in_flight, users_with_queue=sizes.deep_queue_users)

    # The brief's state last, so the EXPLAIN that follows sees it too.
    in_flight = prepare_in_flight(ctx, dsn)
    table = dbsetup.table_sizes(dsn)
    result = _measure(ctx, dsn, sizes.sweeper_passes)
    result.update(table=table, in_flight=in_flight, idle_users=table["idle_users"], deep_queues=deep)
    return result
