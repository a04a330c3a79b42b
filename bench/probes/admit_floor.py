"""The admit against its floors at one concurrency, by rounds: the service, the `minimal_core`
floor and the `minimal_contract` floor (bench/minimal_server.py: the minimal Admit with the core's
CreateRun; the same with the rest of the contract's work on every admit, done by the service's own
code: the road and its gate, validation, the admit's span and counter, the audit lines, the whole
answer with its estimate).

The load is the profile's (bench.probes.profile): 1 000 users round-robin, a warm-up of 500 admits,
then `--calls` admits from `--callers` callers, each target on a fresh database and a fresh process
(with a dev core of its own). The server process's CPU per admit and the throughput are compared
within each round, the order of the targets rotating from round to round, so a drift of the
machine's load falls on every target; the medians of the per-round ratios are printed.

    .venv/bin/python -m bench.probes.admit_floor [--callers 64] [--calls 8000] [--rounds 3] [--out bench/results/history/admit-floor.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench import dbsetup
from bench.context import FULL, Context
from bench.ghz import ADMIT, admit_data
from bench.measure import CpuMeter
from bench.probes.rounds import RESULTS, ghz_figures, loadavg, median_ratio, new_report, rotated, scratch_database, write_medians
from bench.procs import MinimalServer
from bench.protoset import write_protoset

_USERS = 1000
_WARMUP_CALLS = 500
TARGETS = ("service", "minimal_core", "minimal_contract")


def one_run(ctx: Context, target: str, round_index: int, args: argparse.Namespace) -> dict[str, Any]:
    name = f"admit_floor_{target}_{round_index}"
    dsn = ctx.database(name)
    dbsetup.grant_credits(dsn, "p-u", _USERS, (args.calls + _WARMUP_CALLS) // _USERS + 10)
    load = loadavg()
    server = (
        ctx.stack(dsn, name)
        if target == "service"
        else MinimalServer(dsn, ctx.workdir, with_core=True, contract=target == "minimal_contract")
    )
    with server:
        pid = server.pid if isinstance(server, MinimalServer) else server.service.pid
        ctx.ghz(server.address, ADMIT, admit_data("p-u", _USERS, "warm"), concurrency=args.callers, total=_WARMUP_CALLS)
        meter = CpuMeter({"server": pid, "postgres": ctx.db.pid}).start()
        result = ctx.ghz(server.address, ADMIT, admit_data("p-u", _USERS, "measure"), concurrency=args.callers, total=args.calls)
        cpu = meter.stop()
    if result.ok != args.calls:
        raise RuntimeError(f"{name}: only {result.ok}/{args.calls} admits succeeded: {result.errors}")
    return {
        "target": target,
        "round": round_index,
        "loadavg": load,
        **ghz_figures(result),
        "cpu_ms_per_admit": {k: round(v * 1000 / result.ok, 3) for k, v in cpu.items() if k in ("server", "postgres")},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--calls", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "admit-floor.json")
    args = parser.parse_args()
    report = new_report(rounds=args.rounds, callers=args.callers, calls=args.calls, users=_USERS, warmup_calls=_WARMUP_CALLS)
    runs: list[dict[str, Any]] = []
    with scratch_database("acurio-admit-floor-") as (db, workdir):
        ctx = Context(db, workdir, FULL, write_protoset(workdir / "queue.protoset"))
        for round_index in range(args.rounds):
            for target in rotated(TARGETS, round_index):
                run = one_run(ctx, target, round_index, args)
                runs.append(run)
                print(
                    f"round {round_index} {target:17} server {run['cpu_ms_per_admit']['server']:.3f} ms/admit  "
                    f"PostgreSQL {run['cpu_ms_per_admit']['postgres']:.3f} ms/admit  {run['throughput_per_s']:7.1f}/s  "
                    f"p50 {run['latency_ms']['p50']:.1f} ms  load {run['loadavg'][0]}",
                    flush=True,
                )
    by = {(r["round"], r["target"]): r for r in runs}
    ratios: dict[str, dict[str, Any]] = {}
    for target, floor in (("service", "minimal_core"), ("service", "minimal_contract"), ("minimal_contract", "minimal_core")):
        ratios[f"{target}_cpu_over_{floor}"] = median_ratio(by, args.rounds, target, floor, lambda r: r["cpu_ms_per_admit"]["server"])
        ratios[f"{target}_throughput_over_{floor}"] = median_ratio(by, args.rounds, target, floor, lambda r: r["throughput_per_s"])
    write_medians(report, runs, ratios, args.out, key="ratios", width=48)
    return 0


if __name__ == "__main__":
    sys.exit(main())
