"""The service on asyncio's default event loop against uvloop, under the admit load of scenario 1
(1 000 users round-robin, 16 callers by default). Not part of `bench.run`; uvloop is installed apart
(`.venv/bin/pip install uvloop`), and the service runs through `bench.instrumented_serve` with
`BENCH_EVENT_LOOP` (no probes).

    .venv/bin/python -m bench.probes.loop_ab [--calls 5000] [--callers 16] [--repeats 3]

Each repeat runs both loops back to back (the order alternates), each on a fresh database and a
fresh replica after a warm-up, so each repeat's uvloop/asyncio ratio compares runs made under
the same machine load. Prints the table and writes bench/results/history/event-loop-ab.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench import dbsetup
from bench.context import FULL, Context
from bench.ghz import ADMIT, admit_data
from bench.measure import CpuMeter, unattributed_cpu
from bench.probes.rounds import RESULTS, ghz_figures, loadavg, median_ratio, new_report, scratch_database, write_medians
from bench.protoset import write_protoset

_USERS = 1000
LOOPS = ("asyncio", "uvloop")


def one_run(ctx: Context, loop: str, repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"loop_{loop}_{repeat}"
    dsn = ctx.database(name)
    dbsetup.grant_credits(dsn, "l-u", _USERS, args.calls // _USERS + 10)
    command = [sys.executable, "-m", "bench.instrumented_serve"]
    load = loadavg()
    with ctx.stack(dsn, name, env={"BENCH_EVENT_LOOP": loop}, service_command=command) as stack:
        ctx.ghz(stack.address, ADMIT, admit_data("l-u", _USERS, f"{name}-warm"), concurrency=args.callers, total=ctx.sizes.warmup_calls)
        meter = CpuMeter(stack.cpu_roots()).start()
        result = ctx.ghz(stack.address, ADMIT, admit_data("l-u", _USERS, name), concurrency=args.callers, total=args.calls)
        cpu = meter.stop()
    return {
        "loop": loop,
        "repeat": repeat,
        "loadavg": load,
        **ghz_figures(result),
        "cpu_ms_per_op": {k: round(v * 1000 / result.ok, 3) for k, v in cpu.items() if k != "system"},
        "unattributed_cpu_cores": round(unattributed_cpu(cpu) / result.seconds, 2),
        "errors": result.errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "event-loop-ab.json")
    args = parser.parse_args()
    report = new_report(calls=args.calls, callers=args.callers, users=_USERS, repeats=args.repeats, postgres_durable=True)
    runs: list[dict[str, Any]] = []
    with scratch_database("acurio-loop-ab-") as (db, workdir):
        ctx = Context(db, workdir, FULL, write_protoset(workdir / "queue.protoset"))
        for repeat in range(args.repeats):
            for loop in LOOPS if repeat % 2 == 0 else tuple(reversed(LOOPS)):
                run = one_run(ctx, loop, repeat, args)
                runs.append(run)
                lat = run["latency_ms"]
                print(
                    f"repeat {repeat} {loop:8} {run['throughput_per_s']:7.1f}/s  p50 {lat['p50']:6.1f}  p99 {lat['p99']:6.1f} ms  "
                    f"service CPU {run['cpu_ms_per_op']['service']:.3f} ms/op  load {run['loadavg'][0]}  other {run['unattributed_cpu_cores']} cores",
                    flush=True,
                )

    by_repeat = {(r["repeat"], r["loop"]): r for r in runs}

    def ratio(metric: Any) -> dict[str, Any]:
        return median_ratio(by_repeat, args.repeats, "uvloop", "asyncio", metric, per="per_repeat")

    summary = {
        "throughput_uvloop_over_asyncio": ratio(lambda r: r["throughput_per_s"]),
        "p50_uvloop_over_asyncio": ratio(lambda r: r["latency_ms"]["p50"]),
        "p99_uvloop_over_asyncio": ratio(lambda r: r["latency_ms"]["p99"]),
        "service_cpu_per_op_uvloop_over_asyncio": ratio(lambda r: r["cpu_ms_per_op"]["service"]),
    }
    write_medians(report, runs, summary, args.out, key="summary", width=42, per="per_repeat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
