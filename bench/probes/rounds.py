"""What the one-off probes share: a scratch PostgreSQL for their rounds, the machine's load to
stand beside each figure, the JSON report each writes to bench/results/history/, the ratios of
two runs made in the same round with their median, and the arguments and step schedule of the
turnover probes (rows kept at a constant count, replaced a
step at a time)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.ghz import GhzResult
from bench.procs import Database

RESULTS = Path(__file__).resolve().parents[1] / "results" / "history"


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


@contextlib.contextmanager
def scratch_database(prefix: str, *, durable: bool = True, statement_stats: bool = False) -> Iterator[tuple[Database, Path]]:
    """A PostgreSQL of its own in a temporary folder, stopped and removed after the rounds
    (`statement_stats`: with pg_stat_statements, see bench/statements.py)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    db = Database(workdir, durable=durable, statement_stats=statement_stats)
    try:
        db.start()
        yield db, workdir
    finally:
        db.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def new_report(**meta: Any) -> dict[str, Any]:
    """A report whose `meta` says when, on how many CPUs, under what load it started, and `meta`
    (its start time rides along as `_started` until `write_report`)."""
    return {
        "meta": {
            "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "loadavg_at_start": loadavg(),
            **meta,
        },
        "_started": time.time(),
    }


def write_report(report: dict[str, Any], out: Path) -> None:
    """Adds the load at the end and the duration to `meta`, writes the report and says where."""
    started = report.pop("_started")
    report["meta"]["loadavg_at_end"] = loadavg()
    report["meta"]["duration_seconds"] = round(time.time() - started, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"report: {out}")


def median_ratio(
    by_round: Mapping[tuple[int, str], dict[str, Any]],
    rounds: int,
    this: str,
    base: str,
    metric: Callable[[dict[str, Any]], float],
    *,
    per: str = "per_round",
) -> dict[str, Any]:
    """`metric` of the run `this` over the run `base` in each round (runs keyed by (round, name)),
    three decimals, and their median: {"median": ..., per: [...]}."""
    ratios = [round(metric(by_round[(i, this)]) / metric(by_round[(i, base)]), 3) for i in range(rounds)]
    return {"median": statistics.median(ratios), per: ratios}


def print_medians(summary: Mapping[str, Mapping[str, Any]], *, width: int, per: str = "per_round") -> None:
    """One line per `median_ratio` of `summary`: its name, its median and each round's ratio."""
    print()
    for key, value in summary.items():
        print(f"{key:{width}} median {value['median']:.3f}  {per.replace('_', ' ')} {value[per]}")


def write_medians(
    report: dict[str, Any],
    runs: list[dict[str, Any]],
    summary: dict[str, dict[str, Any]],
    out: Path,
    *,
    key: str,
    width: int,
    per: str = "per_round",
) -> None:
    """Prints the medians of `summary` and writes the report with every run and `summary` (as `key`)."""
    print_medians(summary, width=width, per=per)
    report.update({"runs": runs, key: summary})
    write_report(report, out)


def print_and_write_forms(
    values: Mapping[str, list[float]], report: dict[str, Any], out: Path | None, *, heading: str, key: str, digits: int
) -> None:
    """One line per form of `values` (a figure per round): its median and every round's; with
    `out`, the report with them as `key` ({form: {"median": ..., "rounds": [...]}})."""
    summary = {form: {"median": round(statistics.median(v), digits), "rounds": [round(x, digits) for x in v]} for form, v in values.items()}
    print(heading)
    for form, figures in summary.items():
        print(f"  {form:22} {figures['median']:>9}  ({', '.join(str(x) for x in figures['rounds'])})")
    if out:
        report[key] = summary
        write_report(report, out)


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """`names` in round `round_index`'s order: each round starts one further along, so a drift of
    the machine's load falls on each in turn."""
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def ghz_figures(result: GhzResult) -> dict[str, Any]:
    """A ghz run's calls answered, throughput and latency percentiles, rounded for a report."""
    return {
        "ok": result.ok,
        "throughput_per_s": round(result.ok / result.seconds, 1),
        "latency_ms": {k: round(v, 2) for k, v in result.latency_dict().items() if k != "count"},
    }


def turnover_arguments(description: str, *, step: int, out_name: str) -> argparse.Namespace:
    """A turnover probe's command line: `--window` rows kept, `--step` replaced at a time,
    `--turnovers` times over, the report to `--out`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=int, default=20_000, help="rows kept (default 20000)")
    parser.add_argument("--step", type=int, default=step, help=f"rows replaced per step (default {step})")
    parser.add_argument("--turnovers", type=int, default=8, help="how many times the window turns over (default 8)")
    parser.add_argument("--out", type=Path, default=RESULTS / out_name)
    return parser.parse_args()


def turnover_steps(window: int, step: int, turnovers: int) -> Iterator[float | None]:
    """One value per step of a turnover probe: before a step that begins a turnover, how many the
    window has made (0.0 first: the moment to measure), else None."""
    per_turnover = window // step
    for n in range(turnovers * per_turnover + 1):
        yield n * step / window if n % per_turnover == 0 else None
