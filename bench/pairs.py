"""Interleaved pairs: this checkout's benchmark against a baseline checkout's, run by turns.

    .venv/bin/python -m bench.pairs --baseline /path/to/baseline-checkout [--rounds 2] [--quick]
        [--statement-stats] [--only admit_many_users promotion_gap idle_replica]
        --out bench/results/history/NAME.json

The baseline is another checkout of this repository (for example a `git worktree add --detach`
of an older commit) with its own `.venv`; each side runs its own `bench.run`, so each measures its
own service. The order alternates per round (this, baseline; baseline, this; ...), so a drift of
the machine's load over the hour falls on both sides. A figure is compared within its round
(`this / baseline`), and each run's own floors (the minimal gRPC Admit server, the same
concurrency without a capacity) stay ratios within that run, as `bench.run` reports them.

Prints one table per round and writes every run's figures, the ratios and the load average at
each run's start to `--out`. With `--statement-stats` both sides run with pg_stat_statements
(`bench.run --statement-stats`), so each side pays the extension's few per cent alike, and each
run's breakdowns (every statement's time per operation, PostgreSQL's CPU by process) go into the
report beside its figures, so that a difference between the heads can be put on a statement with
the machine's load the same on both. Scenarios the baseline does not know (it predates them) are run on
this side only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.probes.rounds import loadavg, new_report, write_report
from bench.procs import REPO_ROOT

DEFAULT_SCENARIOS = ("admit_many_users", "promotion_gap", "idle_replica", "capacity_saturated", "watch_fanout", "sweeper")

# (label, path into the report's `results`, smaller is better). The ratios a round reports.
FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("admit@16 service CPU ms/admit", ("admit_many_users", "c16", "cpu_ms_per_op", "service")),
    ("admit@16 minimal floor CPU ms/admit", ("admit_many_users", "c16", "floors", "minimal", "cpu_ms_per_op", "service")),
    ("admit@16 service CPU / minimal floor", ("admit_many_users", "c16", "ratios", "minimal", "cpu_service")),
    ("admit@16 throughput / minimal floor", ("admit_many_users", "c16", "ratios", "minimal", "throughput")),
    # The floor with the core's CreateRun (a tree without it reports none).
    ("admit@16 minimal_core floor / minimal floor CPU", ("admit_many_users", "c16", "floors", "minimal_core", "cpu_over_minimal")),
    ("admit@16 service CPU / minimal_core floor", ("admit_many_users", "c16", "ratios", "minimal_core", "cpu_service")),
    ("admit@16 throughput / minimal_core floor", ("admit_many_users", "c16", "ratios", "minimal_core", "throughput")),
    ("admit@16 throughput /s", ("admit_many_users", "c16", "throughput_per_s")),
    ("admit@64 throughput / minimal floor", ("admit_many_users", "c64", "ratios", "minimal", "throughput")),
    # Issue 52's yardstick at 64 callers: the service against the floor with the core's CreateRun.
    ("admit@64 service CPU ms/admit", ("admit_many_users", "c64", "cpu_ms_per_op", "service")),
    ("admit@64 minimal_core floor CPU ms/admit", ("admit_many_users", "c64", "floors", "minimal_core", "cpu_ms_per_op", "service")),
    ("admit@64 service CPU / minimal_core floor", ("admit_many_users", "c64", "ratios", "minimal_core", "cpu_service")),
    ("admit@64 throughput / minimal_core floor", ("admit_many_users", "c64", "ratios", "minimal_core", "throughput")),
    ("admit@64 throughput /s", ("admit_many_users", "c64", "throughput_per_s")),
    ("admit@64 PostgreSQL CPU ms/admit", ("admit_many_users", "c64", "cpu_ms_per_op", "postgres")),
    ("admit@64 other (unattributed) cores", ("admit_many_users", "c64", "unattributed_cpu_cores")),
    ("admit@16 PostgreSQL CPU ms/admit", ("admit_many_users", "c16", "cpu_ms_per_op", "postgres")),
    ("burst PostgreSQL CPU ms/completed job", ("promotion_gap", "burst", "cpu_ms_per_op", "postgres")),
    ("burst service CPU ms/completed job", ("promotion_gap", "burst", "cpu_ms_per_op", "service")),
    ("burst promotion gap p50 ms", ("promotion_gap", "burst", "latency_ms", "p50")),
    ("burst promotion gap p99 ms", ("promotion_gap", "burst", "latency_ms", "p99")),
    ("light promotion gap p99 ms", ("promotion_gap", "light", "latency_ms", "p99")),
    ("idle, empty: service CPU ms/s", ("idle_replica", "empty", "cpu_ms_per_second", "service")),
    ("idle, empty: PostgreSQL CPU ms/s", ("idle_replica", "empty", "cpu_ms_per_second", "postgres")),
    ("idle, in flight: service CPU ms/s", ("idle_replica", "in_flight", "cpu_ms_per_second", "service")),
    ("idle, in flight: PostgreSQL CPU ms/s", ("idle_replica", "in_flight", "cpu_ms_per_second", "postgres")),
    ("capacity: service CPU/job vs same concurrency", ("capacity_saturated", "ratios_to_paced", "cpu_per_job_service")),
    ("capacity: PostgreSQL CPU/job vs same concurrency", ("capacity_saturated", "ratios_to_paced", "cpu_per_job_postgres")),
    ("capacity: PostgreSQL CPU ms/job", ("capacity_saturated", "capacity", "cpu_ms_per_op", "postgres")),
    ("capacity paced: PostgreSQL CPU ms/job", ("capacity_saturated", "paced", "cpu_ms_per_op", "postgres")),
    ("WatchJobs latency p99 ms", ("watch_fanout", "latency_ms", "p99")),
    ("sweeper pass p50 ms", ("sweeper", "pass_ms", "p50")),
    ("history: admit p99 ms", ("history", "history", "admit", "latency_ms", "p99")),
)


def _get(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _scenarios_of(checkout: Path) -> set[str]:
    """The scenarios a checkout's `bench.run` accepts (an older one predates some)."""
    text = (checkout / "bench" / "run.py").read_text()
    return {name for name in DEFAULT_SCENARIOS + ("history", "admit_hot_user", "explain") if f'"{name}"' in text}


def _run(checkout: Path, scenarios: list[str], quick: bool, statement_stats: bool, out: Path) -> dict[str, Any]:
    command = [str(checkout / ".venv" / "bin" / "python"), "-m", "bench.run", "--out", str(out), "--only", *scenarios]
    if quick:
        command.append("--quick")
    if statement_stats:
        command.append("--statement-stats")
    with tempfile.TemporaryDirectory(prefix="bench-pairs-explain-") as scratch:
        command += ["--explain-out", str(Path(scratch) / "explain.txt")]
        print(f"$ (cd {checkout} && {' '.join(command)})", file=sys.stderr, flush=True)
        subprocess.run(command, cwd=checkout, check=True)
    return json.loads(out.read_text())


def _head(checkout: Path) -> str:
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=False
    )
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    return {label: _get(report["results"], path) for label, path in FIGURES}


def _breakdowns(results: Any, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every statement breakdown in a run's results, by where it sits ("admit_many_users/c16")."""
    if not isinstance(results, dict):
        return {}
    found: dict[str, Any] = {}
    if "statements" in results:
        found["/".join(path)] = {key: results[key] for key in ("statements", "postgres_cpu_ms_per_op_by_process") if key in results}
    for key, value in results.items():
        if key != "statements":
            found.update(_breakdowns(value, (*path, key)))
    return found


def _table(round_number: int, this: dict[str, Any], baseline: dict[str, Any]) -> str:
    lines = [f"round {round_number}: {'figure':48} {'this':>10} {'baseline':>10} {'this/base':>10}"]
    for label, _ in FIGURES:
        mine, theirs = this.get(label), baseline.get(label)
        ratio = f"{mine / theirs:9.2f}x" if isinstance(mine, int | float) and isinstance(theirs, int | float) and theirs else f"{'-':>10}"
        lines.append(f"{'':9}{label:48} {_fmt(mine)} {_fmt(theirs)} {ratio}")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    return f"{value:>10.3f}" if isinstance(value, int | float) else f"{'-':>10}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pairs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of this repository, with its own .venv")
    parser.add_argument("--rounds", type=int, default=2, help="pairs to run (default 2)")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke of the method, not figures to cite)")
    parser.add_argument(
        "--statement-stats", action="store_true", help="both sides with pg_stat_statements; each run's breakdowns go into the report"
    )
    parser.add_argument("--only", nargs="+", default=list(DEFAULT_SCENARIOS), help=f"scenarios (default {' '.join(DEFAULT_SCENARIOS)})")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON of every round goes")
    args = parser.parse_args(argv)
    this_checkout, baseline = REPO_ROOT, args.baseline.resolve()
    baseline_scenarios = [name for name in args.only if name in _scenarios_of(baseline)]
    # The commits, not the folders: a report is committed, and a folder names a developer's machine.
    report = new_report(
        what="interleaved pairs",
        this=_head(this_checkout),
        baseline=_head(baseline),
        quick=args.quick,
        statement_stats=args.statement_stats,
        scenarios=args.only,
    )
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-pairs-") as scratch:
        for number in range(1, args.rounds + 1):
            order = [("this", this_checkout, list(args.only)), ("baseline", baseline, baseline_scenarios)]
            if number % 2 == 0:
                order.reverse()
            figures: dict[str, Any] = {"round": number, "order": [side for side, _, _ in order]}
            for side, checkout, scenarios in order:
                load = loadavg()
                result = _run(checkout, scenarios, args.quick, args.statement_stats, Path(scratch) / f"{side}-{number}.json")
                figures[side] = {"loadavg_at_start": load, "figures": _figures(result), "meta": result.get("meta")}
                if args.statement_stats:
                    figures[side]["breakdowns"] = _breakdowns(result["results"])
            figures["this_over_baseline"] = {
                label: round(mine / theirs, 3)
                for label, mine in figures["this"]["figures"].items()
                if isinstance(mine, int | float) and isinstance(theirs := figures["baseline"]["figures"].get(label), int | float) and theirs
            }
            rounds.append(figures)
            print(_table(number, figures["this"]["figures"], figures["baseline"]["figures"]), flush=True)
    report["rounds"] = rounds
    write_report(report, args.out)


if __name__ == "__main__":
    main()
