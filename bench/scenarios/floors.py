"""The three floors every admit figure is divided by, measured in the same run:

- grpc: ghz against grpc.health.v1.Health/Check of the very service replica under test (what a
  unary call through this server costs with no work behind it);
- db: the bare admit's database work (reservation with state read + the locked admit statement) from the Python
  driver, no gRPC at all;
- minimal: bench/minimal_server.py, a gRPC Admit doing only that transaction;
- minimal_core: the same, making the core's CreateRun of a held run first, as every real admit
  must (the contract's synchronous check at the core): what is left between it and the real
  Admit is the service's own overhead.
"""

from __future__ import annotations

from typing import Any

from bench import dbsetup
from bench.context import Context, load_record
from bench.ghz import ADMIT, HEALTH_CHECK, admit_data
from bench.measure import ratio
from bench.procs import MinimalServer, Stack


def grpc_floor(ctx: Context, stack: Stack, callers: int, calls: int) -> dict[str, Any]:
    ctx.ghz(stack.address, HEALTH_CHECK, {"service": ""}, concurrency=callers, total=min(calls, 500))
    return ctx.measured_ghz(
        stack.address, HEALTH_CHECK, {"service": ""}, concurrency=callers, total=calls, cpu_roots={"service": stack.service.pid}
    )


def db_floor(ctx: Context, name: str, users: int, callers: int, calls: int) -> dict[str, Any]:
    dsn = ctx.database(f"{name}_db_floor")
    prefix = f"{name}-dbf-u"
    warmup = ctx.sizes.warmup_calls
    dbsetup.grant_credits(dsn, prefix, users, (calls + warmup) // users + 10)
    params = {"dsn": dsn, "user_prefix": prefix, "users": users, "concurrency": callers, "total": calls, "warmup": warmup}
    result, cpu = ctx.measured_driver("db_floor", params, {"postgres": ctx.db.pid})
    return load_record(ok=result["count"], seconds=result["seconds"], latency_ms=result["latency_ms"], cpu_seconds=cpu)


def minimal_floor(ctx: Context, name: str, users: int, callers: int, calls: int, *, with_core: bool = False) -> dict[str, Any]:
    """The minimal server's Admit; `with_core`: each admit makes its CreateRun at a dev core first."""
    kind = "minimal_core" if with_core else "minimal"
    dsn = ctx.database(f"{name}_{kind}_floor")
    prefix = f"{name}-{'minc' if with_core else 'min'}-u"
    warmup = ctx.sizes.warmup_calls
    dbsetup.grant_credits(dsn, prefix, users, (calls + warmup) // users + 10)
    with MinimalServer(dsn, ctx.workdir, with_core=with_core) as server:
        ctx.ghz(server.address, ADMIT, admit_data(prefix, users, "warm"), concurrency=callers, total=warmup)
        return ctx.measured_ghz(
            server.address,
            ADMIT,
            admit_data(prefix, users, "measure"),
            concurrency=callers,
            total=calls,
            cpu_roots={"service": server.pid, "postgres": ctx.db.pid},
        )


def ratios_against(run: dict[str, Any], floors: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """run / floor for throughput, every latency percentile and CPU per call (the service's
    process against the floor's server process; PostgreSQL against PostgreSQL)."""
    out = {}
    for name, floor in floors.items():
        figures = {"throughput": ratio(run["throughput_per_s"], floor["throughput_per_s"])}
        for key in ("p50", "p90", "p99", "max"):
            figures[key] = ratio(run["latency_ms"][key], floor["latency_ms"][key])
        for key in ("service", "postgres"):
            if key in floor["cpu_ms_per_op"]:
                figures[f"cpu_{key}"] = ratio(run["cpu_ms_per_op"].get(key), floor["cpu_ms_per_op"][key])
        out[name] = figures
    return out
