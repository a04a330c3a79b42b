"""Hunting the rare ListJobs stall: the history scenario's empty-table phase, repeated, with every
call's latency kept and lined up against what else happened at that moment.

    .venv/bin/python -m bench.probes.stall_probe [--rounds 8] [--calls 5000] [--no-durable] [--env KEY=VALUE ...]

Each round is what `bench.run`'s history scenario does on the empty table: a fresh database and
a fresh replica (`bench.instrumented_serve`, with probes), warm-up, 500 users admit 10 jobs each
(16 callers), then ListJobs of those users (page of 10, 16 callers). A *stall* is a run of calls
slower than `--slow-ms` (default 100 ms) whose spans overlap; for each, the report lists what
overlaps it (±50 ms):

- the service's probes: garbage collections, event-loop lag, the pool's growth and waiting
  requests, the estimate's refresh, sweeper passes;
- PostgreSQL's log: checkpoints, autovacuum/autoanalyze, lock waits, statements of 50 ms or
  more, new connections (`log_checkpoints`, `log_autovacuum_min_duration=0`, `log_lock_waits`,
  `log_min_duration_statement=50`, `log_connections`);
- the machine's load average (`/proc/loadavg`) at the round's start, and the CPU the machine
  spent outside the measured processes during the round.

The JSON report (default bench/results/history/stall-probe.json) keeps every stall with its overlapping
events, and per round the latency summary of each load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import dbsetup
from bench.context import FULL, Context
from bench.ghz import ADMIT, LIST_JOBS, admit_data, ghz_report, list_jobs_data, summarize_report
from bench.measure import CpuMeter, unattributed_cpu
from bench.procs import Database
from bench.protoset import write_protoset

RESULTS = Path(__file__).resolve().parents[1] / "results" / "history"
_CALLERS = 16
_USERS = 500
_PAGE = 10
_WINDOW_S = 0.05
_PG_LOG_LINE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) (?P<tz>\S+) \[(?P<pid>\d+)\] (?P<text>.*)$")
_PG_LOGGING = {
    "log_checkpoints": "on",
    "log_autovacuum_min_duration": "0",
    "log_lock_waits": "on",
    "log_min_duration_statement": "50",
    "log_connections": "on",
    "log_line_prefix": "%m [%p] ",
    "log_timezone": "UTC",
}


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def configure_pg_logging(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, value in _PG_LOGGING.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


def pg_log_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        match = _PG_LOG_LINE.match(line)
        if not match:
            continue
        when = dt.datetime.strptime(match["ts"], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=dt.UTC)
        events.append({"t": when.timestamp(), "kind": "postgres", "pid": int(match["pid"]), "text": match["text"][:300]})
    return events


def call_spans(report: dict[str, Any]) -> list[tuple[float, float, str]]:
    """(start, end, status) of every call, in wall-clock seconds."""
    spans = []
    for call in report.get("details") or []:
        # ghz's timestamps carry nanoseconds and a zone offset; keep microseconds for fromisoformat.
        stamp = re.sub(r"(\.\d{6})\d+", r"\1", call["timestamp"])
        start = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        spans.append((start, start + call["latency"] / 1e9, call.get("status", "")))
    return spans


def stalls(spans: list[tuple[float, float, str]], slow_ms: float) -> list[dict[str, Any]]:
    slow = sorted((s for s in spans if (s[1] - s[0]) * 1000 >= slow_ms), key=lambda s: s[0])
    groups: list[dict[str, Any]] = []
    for start, end, _ in slow:
        if groups and start <= groups[-1]["end"]:
            group = groups[-1]
            group["end"] = max(group["end"], end)
            group["calls"] += 1
            group["max_ms"] = max(group["max_ms"], (end - start) * 1000)
        else:
            groups.append({"start": start, "end": end, "calls": 1, "max_ms": (end - start) * 1000})
    for group in groups:
        group["max_ms"] = round(group["max_ms"], 1)
    return groups


def overlapping(group: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    low, high = group["start"] - _WINDOW_S, group["end"] + _WINDOW_S
    return [{**e, "at_ms": round((e["t"] - group["start"]) * 1000, 1)} for e in events if low <= e["t"] <= high]


def pg_category(text: str) -> str | None:
    """What a PostgreSQL log line is about, or None for lines not worth counting (DETAIL, ...)."""
    for needle, category in (
        ("checkpoint", "pg_checkpoint"),
        ("automatic vacuum", "pg_autovacuum"),
        ("automatic analyze", "pg_autoanalyze"),
        ("still waiting", "pg_lock_wait"),
        ("connection received", "pg_new_connection"),
    ):
        if needle in text:
            return category
    if "duration:" in text:
        return "pg_slow_commit" if text.rstrip().endswith("COMMIT") else "pg_slow_statement"
    return None


def digest(events: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kind of overlapping event: how many, and the largest and summed duration where it has one."""
    out: dict[str, dict[str, float]] = {}
    for event in events:
        kind = event["kind"] if event["kind"] != "postgres" else pg_category(event["text"])
        if kind is None:
            continue
        entry = out.setdefault(kind, {"n": 0})
        entry["n"] += 1
        ms = event.get("ms")
        if ms is None and "duration:" in event.get("text", ""):
            ms = float(event["text"].split("duration:")[1].split()[0])
        if ms is not None:
            entry["max_ms"] = max(entry.get("max_ms", 0.0), ms)
            entry["sum_ms"] = round(entry.get("sum_ms", 0.0) + ms, 1)
    return out


def _psi_totals() -> dict[str, int]:
    """Microseconds some/all tasks were stalled on CPU and on IO since boot (/proc/pressure)."""
    totals = {}
    for resource_name in ("cpu", "io"):
        path = Path(f"/proc/pressure/{resource_name}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            kind, *fields = line.split()
            totals[f"{resource_name}_{kind}"] = int(dict(f.split("=") for f in fields)["total"])
    return totals


class Sampler(threading.Thread):
    """Every 20 ms: the machine's CPU and IO pressure (PSI) and PostgreSQL's active client backends
    with their wait event, so a stall shows whether PostgreSQL waited (on what) or ran short of CPU."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self._dsn = dsn
        self._stop_event = threading.Event()
        self.events: list[dict[str, Any]] = []

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self._dsn, autocommit=True) as conn:
            last = _psi_totals()
            last_t = time.time()
            while not self._stop_event.wait(0.02):
                now = time.time()
                totals = _psi_totals()
                share = {k: round((totals[k] - last[k]) / 1e6 / (now - last_t), 3) for k in totals}
                self.events.append({"t": now, "kind": "psi", "window_s": round(now - last_t, 3), **share})
                last, last_t = totals, now
                rows = conn.execute(
                    "SELECT pid, wait_event_type, wait_event, (extract(epoch FROM now() - query_start) * 1000)::float8, left(query, 50)"
                    " FROM pg_stat_activity WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ).fetchall()
                for pid, wait_type, wait, running_ms, query in rows:
                    if wait_type is not None or (running_ms or 0) >= 20:
                        self.events.append(
                            {
                                "t": now,
                                "kind": "pg_active",
                                "pid": pid,
                                "wait": f"{wait_type}:{wait}",
                                "running_ms": round(running_ms or 0, 1),
                                "query": query,
                            }
                        )

    def stop(self) -> list[dict[str, Any]]:
        self._stop_event.set()
        self.join(10)
        return self.events


def _wait_counts(samples: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sample in samples:
        counts[sample["wait"]] = counts.get(sample["wait"], 0) + 1
    return counts


def psi_during(group: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, float]:
    """Mean PSI shares over the samples inside the stall (share of wall time some task waited)."""
    inside = [e for e in events if e["kind"] == "psi" and group["start"] <= e["t"] <= group["end"] + 0.02]
    keys = ("cpu_some", "io_some", "io_full")
    return {k: round(sum(e.get(k, 0) for e in inside) / len(inside), 2) for k in keys} if inside else {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(
    ctx: Context, address: str, call: str, data: dict[str, Any], total: int, cpu_roots: dict[str, int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    meter = CpuMeter(cpu_roots).start()
    children_before = _children_cpu()
    report = ghz_report(address, call, data, protoset=ctx.protoset, concurrency=_CALLERS, total=total)
    cpu = {**meter.stop(), "loadgen": _children_cpu() - children_before}
    summary = summarize_report(report)
    record = {
        "ok": summary.ok,
        "throughput_per_s": round(summary.rps, 1),
        "latency_ms": {k: round(v, 2) for k, v in summary.latency_dict().items() if k != "count"},
        "unattributed_cpu_cores": round(unattributed_cpu(cpu) / summary.seconds, 2) if summary.seconds else None,
    }
    return record, report


def run_round(ctx: Context, index: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    name = f"stall{index}"
    dsn = ctx.database(name)
    prefix, warm = f"{name}-u", f"{name}-w"
    per_user = args.calls // _USERS
    dbsetup.grant_credits(dsn, prefix, _USERS, per_user + 5)
    dbsetup.grant_credits(dsn, warm, 50, ctx.sizes.warmup_calls)
    events_path = ctx.workdir / f"{name}.events.jsonl"
    command = [sys.executable, "-m", "bench.instrumented_serve"]
    load_at_start = loadavg()
    with ctx.stack(dsn, name, env={"BENCH_PROBE_EVENTS": str(events_path), **env}, service_command=command) as stack:
        ctx.ghz(stack.address, ADMIT, admit_data(warm, 50, f"{name}-warm"), concurrency=_CALLERS, total=ctx.sizes.warmup_calls)
        ctx.ghz(stack.address, LIST_JOBS, list_jobs_data(warm, 50, _PAGE), concurrency=_CALLERS, total=ctx.sizes.warmup_calls)
        roots = stack.cpu_roots()
        sampler = Sampler(dsn)
        sampler.start()
        admit, admit_report = measured(ctx, stack.address, ADMIT, admit_data(prefix, _USERS, name), _USERS * per_user, roots)
        listing, list_report = measured(ctx, stack.address, LIST_JOBS, list_jobs_data(prefix, _USERS, _PAGE), args.calls, roots)
        sampled = sampler.stop()
    events = [json.loads(line) for line in events_path.read_text().splitlines()] if events_path.exists() else []
    events += sampled
    events += pg_log_events(ctx.db.embedded.data_dir / "server.log")
    events.sort(key=lambda e: e["t"])
    found = []
    for load, report in (("admit", admit_report), ("list_jobs", list_report)):
        for group in stalls(call_spans(report), args.slow_ms):
            near = overlapping(group, events)
            detail = load == "list_jobs"  # every sample only for ListJobs: admit stalls are many and long
            found.append(
                {
                    "load": load,
                    **group,
                    "overlapping": digest([e for e in near if e["kind"] not in ("psi", "pg_active")]),
                    "psi_during": psi_during(group, events),
                    "pg_waits_during": _wait_counts(e for e in near if e["kind"] == "pg_active"),
                    **(
                        {
                            "pg_active": [e for e in near if e["kind"] == "pg_active"],
                            "service_events": [e for e in near if e["kind"] not in ("postgres", "psi", "pg_active")],
                            "postgres_events": [
                                e for e in near if e["kind"] == "postgres" and pg_category(e["text"]) not in (None, "pg_slow_commit")
                            ],
                        }
                        if detail
                        else {}
                    ),
                }
            )
    probe_counts: dict[str, int] = {}
    for event in events:
        probe_counts[event["kind"]] = probe_counts.get(event["kind"], 0) + 1
    return {
        "round": index,
        "loadavg_at_start": load_at_start,
        "admit": admit,
        "list_jobs": listing,
        "stalls": found,
        "event_counts": probe_counts,
        "gc_pauses": [e for e in events if e["kind"] == "gc" and e["ms"] >= 20],
        "pool_and_postgres_events": [
            e
            for e in events
            if e["kind"] in ("pool_log", "estimate_refresh", "sweep_pass")
            or (e["kind"] == "postgres" and pg_category(e["text"]) in ("pg_checkpoint", "pg_autovacuum", "pg_autoanalyze", "pg_lock_wait"))
        ],
        "gc_max_ms": max((e["ms"] for e in events if e["kind"] == "gc"), default=0),
        "loop_lag_max_ms": max((e["ms"] for e in events if e["kind"] == "loop_lag"), default=0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=5000, help="ListJobs calls per round (and admits: 500 users x calls/500)")
    parser.add_argument("--slow-ms", type=float, default=100.0)
    parser.add_argument("--print-admit-ms", type=float, default=300.0, help="print admit stalls from this long")
    parser.add_argument("--no-durable", action="store_true")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="a service setting for every round")
    parser.add_argument("--alternate-env", metavar="KEY=VALUE", help="a service setting for odd rounds only (an A/B in one run)")
    parser.add_argument("--out", type=Path, default=RESULTS / "stall-probe.json")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    workdir = Path(tempfile.mkdtemp(prefix="acurio-stall-"))
    db = Database(workdir, durable=not args.no_durable)
    started = time.time()
    try:
        db.start()
        configure_pg_logging(db.dsn)
        ctx = Context(db, workdir, FULL, write_protoset(workdir / "queue.protoset"))
        rounds = []
        for index in range(args.rounds):
            round_env = dict(env)
            if args.alternate_env and index % 2 == 1:
                key, _, value = args.alternate_env.partition("=")
                round_env[key] = value
            result = run_round(ctx, index, args, round_env)
            result["service_env"] = round_env
            rounds.append(result)
            lj, ad = result["list_jobs"]["latency_ms"], result["admit"]["latency_ms"]
            print(
                f"round {index} {round_env or ''}: load {result['loadavg_at_start']}  admit p99/max {ad['p99']}/{ad['max']} ms  "
                f"ListJobs p50/p99/max {lj['p50']}/{lj['p99']}/{lj['max']} ms  stalls {len(result['stalls'])}  "
                f"gc max {result['gc_max_ms']} ms  loop lag max {result['loop_lag_max_ms']} ms",
                flush=True,
            )
            for stall in result["stalls"]:
                if stall["load"] == "list_jobs" or stall["max_ms"] >= args.print_admit_ms:
                    print(
                        f"    {stall['load']} stall: {stall['calls']} calls, max {stall['max_ms']} ms; PSI {stall['psi_during']}; "
                        f"PostgreSQL waits {stall['pg_waits_during']}; overlapping: {stall['overlapping']}",
                        flush=True,
                    )
    finally:
        db.stop()
    report = {
        "meta": {
            "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "durable": not args.no_durable,
            "rounds": args.rounds,
            "calls": args.calls,
            "slow_ms": args.slow_ms,
            "service_env": env,
            "alternate_env": args.alternate_env,
            "duration_seconds": round(time.time() - started, 1),
            "loadavg_at_end": loadavg(),
        },
        "rounds": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"report: {args.out}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
