"""The soak: two replicas under a steady, realistic load for a configurable time, sampled every
window, to show that nothing grows (memory, descriptors, tasks, the database, latency).

    .venv/bin/python -m bench.soak --minutes 30 --users 1000    # the figures: bench/results/soak.json + soak/*.svg
    .venv/bin/python -m bench.soak --minutes 1 --sample-seconds 10 --users 200 --out /tmp/soak.json --plots-dir /tmp/soak

What runs (each its own process, as in bench.run): an embedded PostgreSQL (durable), the dev core
(judging every run for `--judging-seconds`, completions spread round-robin over both replicas),
two `queue-service serve` replicas with their Prometheus endpoints, and the load
(`bench.soak_load`: users clicking, an operator's retries, capacity turns, pauses, WatchJobs
streams). The job retention is short (QUEUE_JOB_RETENTION_SECONDS, QUEUE_JOB_INPUTS_RETENTION_SECONDS)
so the pruner works on every sweep; since it never deletes a job within an hour of its admit,
the database starts with the hour of finished jobs the same load leaves behind (`--history-minutes`):
from the first minute on, the pruner deletes about as many jobs as the load admits, as in a
service in its steady state. See bench/README.md ("The soak") for what each sample holds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg

from bench import dbsetup, procs, soak_analysis
from bench.measure import tree_cpu_seconds
from bench.procs import (
    QUEUE_SERVICE,
    REPO_ROOT,
    Database,
    ManagedProcess,
    _minimal_env,
    _tail,
    create_database,
    start_module,
    wait_history_reconciled,
    wait_port,
    wait_serving,
)
from queue_service.dev.embedded_postgres import free_port

RESULTS = Path(__file__).resolve().parent / "results"
USER_PREFIX = "soak-u"
# Jobs the load admits per click, on average: half the clicks upload 1-3 documents (mean 5/3),
# some looks add a re-check; what the seeded hour of history is sized by.
JOBS_PER_CLICK = 0.9


def _log(started: float, message: str) -> None:
    print(f"[{time.monotonic() - started:7.1f}s] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--minutes", type=float, default=30.0, help="how long the load runs (default 30)")
    add("--users", type=int, default=1000, help="users clicking (default 1000)")
    add("--rate", type=float, default=20.0, help="clicks per second, all users together (default 20: each user every 50 s)")
    add("--sample-seconds", type=float, default=30.0, help="the sampling window (default 30)")
    add("--warmup-minutes", type=float, help="left out of the slopes (default: 5, or a quarter of a run under 20 minutes)")
    add("--streams", type=int, default=300, help="WatchJobs streams kept open across both replicas (default 300)")
    add("--judging-seconds", type=float, default=2.0, help="how long the dev core judges each run (default 2)")
    add(
        "--capacity",
        type=int,
        default=80,
        help="the fleet's capacity at the core (default 80: about twice the runs the default load keeps judging)",
    )
    add("--capacity-low", type=int, default=60, help="the capacity it turns to and back from (default 60)")
    add("--capacity-turn-seconds", type=float, default=240.0, help="time between capacity turns (default 240; 0: none)")
    add("--fleet-pause-every-seconds", type=float, default=180.0, help="a fleet pause this often (default 180; 0: none)")
    add("--fleet-pause-seconds", type=float, default=5.0, help="how long each fleet pause lasts (default 5)")
    add("--user-pause-every-seconds", type=float, default=20.0, help="one user paused this often (default 20; 0: none)")
    add("--user-pause-seconds", type=float, default=30.0, help="how long a user's pause lasts (default 30)")
    add("--retry-every-seconds", type=float, default=3.0, help="an operator's RetryJob this often (default 3)")
    add("--delta-burst-every-seconds", type=float, default=30.0, help="a user's burst of 6 re-checks (limit 4) this often (default 30)")
    add("--history-minutes", type=float, default=60.0, help="finished jobs seeded at the load's rate over this many minutes (default 60)")
    add("--job-retention-seconds", type=float, default=600.0, help="QUEUE_JOB_RETENTION_SECONDS (default 600)")
    add("--inputs-retention-seconds", type=float, default=120.0, help="QUEUE_JOB_INPUTS_RETENTION_SECONDS (default 120)")
    add("--out", type=Path, default=RESULTS / "soak.json", help="the JSON report (default bench/results/soak.json)")
    add("--plots-dir", type=Path, default=RESULTS / "soak", help="where the SVG plots go (default bench/results/soak/)")
    add("--no-durable", dest="durable", action="store_false", help="PostgreSQL with fsync off (default: durable)")
    add("--keep-workdir", action="store_true", help="keep the temp folder (database, logs, the core's record)")
    return parser.parse_args(argv)


# -- the fleet -------------------------------------------------------------------------------------


class Fleet:
    """The dev core and two replicas on one database, each replica with a Prometheus endpoint."""

    def __init__(self, db: Database, dsn: str, workdir: Path, args: argparse.Namespace) -> None:
        self.record_path = workdir / "soak.core-events.jsonl"
        service_ports = [free_port(), free_port()]
        self.addresses = [f"127.0.0.1:{port}" for port in service_ports]
        self.metrics_ports = [free_port(), free_port()]
        core_port = free_port()
        core_args = [QUEUE_SERVICE, "core", "--listen", f"127.0.0.1:{core_port}", "--callback", ",".join(self.addresses)]
        core_args += ["--judging-seconds", str(args.judging_seconds), "--record", str(self.record_path)]
        self.core = ManagedProcess("core", core_args, _minimal_env({}), workdir / "soak.core.log")
        self.replicas: list[ManagedProcess] = []
        try:
            wait_port(core_port, self.core.process, self.core.log_path)
            for index, (address, metrics_port) in enumerate(zip(self.addresses, self.metrics_ports, strict=True)):
                env = {
                    "DATABASE_URL": dsn,
                    "QUEUE_CORE_ADDR": f"127.0.0.1:{core_port}",
                    "QUEUE_LISTEN_ADDR": address,
                    "QUEUE_MIGRATE_ON_START": "false",
                    "QUEUE_METRICS_ADDR": f"127.0.0.1:{metrics_port}",
                    "QUEUE_CORE_CAPACITY": str(args.capacity),
                    "QUEUE_JOB_RETENTION_SECONDS": str(args.job_retention_seconds),
                    "QUEUE_JOB_INPUTS_RETENTION_SECONDS": str(args.inputs_retention_seconds),
                }
                replica = ManagedProcess(
                    f"replica{index + 1}", [QUEUE_SERVICE, "serve"], _minimal_env(env), workdir / f"soak.replica{index + 1}.log"
                )
                self.replicas.append(replica)
                wait_serving(address, replica.process, replica.log_path)
                wait_history_reconciled(dsn, replica.process, replica.log_path)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        # The core first: it writes the rest of its record as it stops.
        self.core.stop()
        for replica in self.replicas:
            replica.stop()


# -- sampling --------------------------------------------------------------------------------------


def _proc_status(pid: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "VmRSS":
                figures["rss_mb"] = round(int(value.split()[0]) / 1024, 2)
            elif key == "Threads":
                figures["threads"] = int(value)
        figures["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        pass
    return figures


def scrape(port: int) -> dict[str, float]:
    """The replica's own gauges from its Prometheus endpoint: the event loop's lag (its recent
    peak, halving every 5 s) and live tasks, and its open WatchJobs streams."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    figures: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.split("{")[0].split(" ")[0], line.rsplit(" ", 1)[1]
        if name in ("queue_loop_lag_seconds", "queue_loop_tasks", "queue_watch_streams"):
            figures[name] = figures.get(name, 0.0) + float(value)
    return figures


POSTGRES_SAMPLE = """
SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS connections,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = current_database()) AS connections_here,
       (SELECT sum(pg_relation_size(c.oid, 'main') + pg_relation_size(c.oid, 'fsm') + pg_relation_size(c.oid, 'vm'))
          FROM pg_class c WHERE c.relkind IN ('r', 'i', 't', 'm', 'S', 'p')) AS relations_bytes,
       pg_database_size(current_database()) AS database_bytes,
       (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relname IN ('credit_ledger', 'queue_setting_changes', 'queue_operator_actions')) AS audit_trail_bytes,
       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables) AS dead_tuples,
       (SELECT coalesce(sum(n_live_tup), 0) FROM pg_stat_user_tables) AS live_tuples,
       (SELECT coalesce(sum(autovacuum_count), 0) FROM pg_stat_user_tables) AS autovacuums,
       (SELECT coalesce(sum(autoanalyze_count), 0) FROM pg_stat_user_tables) AS autoanalyzes,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') AS wal_bytes
"""

TOP_RELATIONS = """
SELECT c.relname, pg_total_relation_size(c.oid) AS bytes, s.n_dead_tup, s.n_live_tup
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.relkind = 'r' AND n.nspname = 'public'
 ORDER BY bytes DESC LIMIT 8
"""


def sample_postgres(conn: psycopg.Connection) -> dict[str, Any]:
    cur = conn.execute(POSTGRES_SAMPLE)
    names = [column.name for column in cur.description or ()]
    row = cur.fetchone()
    figures = {name: float(value) if value is not None else None for name, value in zip(names, row or (), strict=True)}
    figures["top_tables"] = [
        {"table": name, "bytes": int(size), "dead_tuples": int(dead or 0), "live_tuples": int(live or 0)}
        for name, size, dead, live in conn.execute(TOP_RELATIONS).fetchall()
    ]
    return figures


class Sampler:
    """Reads every process and PostgreSQL at each window's end; scrapes the replicas' gauges more
    often (every 5 s at most) so a window's loop lag is its peak, not a moment's."""

    def __init__(self, fleet: Fleet, db: Database, dsn: str, driver_pid: int) -> None:
        self.fleet, self.db, self.driver_pid = fleet, db, driver_pid
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.lag_peak = [0.0 for _ in fleet.replicas]
        self.scrape_failures = 0
        self.samples: list[dict[str, Any]] = []
        self.cpu_roots = {
            **{r.name: r.pid for r in fleet.replicas},
            "dev_core": fleet.core.pid,
            "postgres": db.pid,
            "load": driver_pid,
        }

    def scrape_all(self) -> list[dict[str, float]]:
        figures = []
        for index, port in enumerate(self.fleet.metrics_ports):
            try:
                scraped = scrape(port)
            except OSError:
                self.scrape_failures += 1
                scraped = {}
            self.lag_peak[index] = max(self.lag_peak[index], scraped.get("queue_loop_lag_seconds", 0.0))
            figures.append(scraped)
        return figures

    def sample(self, index: int, t0_ns: int) -> dict[str, Any]:
        scraped = self.scrape_all()
        replicas = []
        for number, replica in enumerate(self.fleet.replicas):
            figures: dict[str, Any] = {"name": replica.name, **_proc_status(replica.pid)}
            figures["tasks"] = scraped[number].get("queue_loop_tasks")
            figures["watch_streams"] = scraped[number].get("queue_watch_streams")
            figures["loop_lag_ms_peak"] = round(self.lag_peak[number] * 1000, 3)
            figures["cpu_seconds"] = round(tree_cpu_seconds(replica.pid), 2)
            replicas.append(figures)
        self.lag_peak = [0.0 for _ in self.fleet.replicas]
        sample = {
            "index": index,
            "second": round((time.monotonic_ns() - t0_ns) / 1e9, 2),
            "replicas": replicas,
            "dev_core": {**_proc_status(self.fleet.core.pid), "cpu_seconds": round(tree_cpu_seconds(self.fleet.core.pid), 2)},
            "postgres": {**sample_postgres(self.conn), "cpu_seconds": round(tree_cpu_seconds(self.db.pid), 2)},
            "load_cpu_seconds": round(tree_cpu_seconds(self.driver_pid), 2),
            "loadavg": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]],
        }
        self.samples.append(sample)
        return sample

    def close(self) -> None:
        self.conn.close()


# -- the load --------------------------------------------------------------------------------------


def start_load(fleet: Fleet, args: argparse.Namespace, workdir: Path) -> subprocess.Popen[str]:
    params = {
        "addresses": fleet.addresses,
        "user_prefix": USER_PREFIX,
        "users": args.users,
        "rate": args.rate,
        "seconds": args.minutes * 60,
        "window_seconds": args.sample_seconds,
        "streams": args.streams,
        "capacity": args.capacity,
        "capacity_low": args.capacity_low,
        "capacity_turn_seconds": args.capacity_turn_seconds,
        "fleet_pause_every_seconds": args.fleet_pause_every_seconds,
        "fleet_pause_seconds": args.fleet_pause_seconds,
        "user_pause_every_seconds": args.user_pause_every_seconds,
        "user_pause_seconds": args.user_pause_seconds,
        "retry_every_seconds": args.retry_every_seconds,
        "delta_burst_every_seconds": args.delta_burst_every_seconds,
    }
    log = open(workdir / "soak.load.log", "ab")  # noqa: SIM115 - closed with the process
    return start_module("bench.soak_load", json.dumps(params), log=log)


def service_log_problems(paths: list[Path]) -> dict[str, int]:
    """The replicas' log lines at warning or error, counted by level and message (numbers and ids
    stripped from the message so alike lines count together)."""
    import re

    counts: dict[str, int] = {}
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("level") in ("warning", "error", "critical"):
                message = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+(\.\d+)?", "#", str(entry.get("message", "")))[:160]
                key = f"{entry['level']}: {message}"
                counts[key] = counts.get(key, 0) + 1
    return counts


# -- the report ------------------------------------------------------------------------------------


def window_series(samples: list[dict[str, Any]], load: dict[str, Any], gaps: dict[str, Any]) -> dict[str, list[tuple[float, float | None]]]:
    """Every sampled figure as a series of (second, value); per-window figures (WAL per job,
    autovacuum runs, latencies) are placed at their window's end."""
    series: dict[str, list[tuple[float, float | None]]] = {}

    def put(name: str, second: float, value: float | None) -> None:
        series.setdefault(name, []).append((second, value))

    for previous, sample in zip([None, *samples], samples, strict=False):
        second = sample["second"]
        for replica in sample["replicas"]:
            for key in ("rss_mb", "fds", "threads", "tasks", "loop_lag_ms_peak", "watch_streams"):
                put(f"{replica['name']}.{key}", second, replica.get(key))
        pg = sample["postgres"]
        for key in (
            "connections",
            "connections_here",
            "relations_bytes",
            "database_bytes",
            "dead_tuples",
            "live_tuples",
            "audit_trail_bytes",
        ):
            put(f"postgres.{key}", second, pg.get(key))
        if pg.get("audit_trail_bytes") is not None:
            # What the retention bounds: all but the audit trail, which is kept (docs/security.md).
            put("postgres.relations_bytes_but_audit_trail", second, pg["relations_bytes"] - pg["audit_trail_bytes"])
        for table in pg["top_tables"]:
            put(f"table.{table['table']}.bytes", second, table["bytes"])
        if previous is None:
            continue
        window = load["windows"].get(str(sample["index"] - 1), {"latency_ms": {}, "counts": {}})
        counts = window["counts"]
        jobs = sum(counts.get(f"ok:{a}", 0) for a in ("admit", "delta", "delta_burst", "retry"))
        wal = pg["wal_bytes"] - previous["postgres"]["wal_bytes"]
        put("postgres.wal_bytes_per_job", second, wal / jobs if jobs else None)
        put("postgres.autovacuum_runs", second, pg["autovacuums"] - previous["postgres"]["autovacuums"])
        put("postgres.autoanalyze_runs", second, pg["autoanalyzes"] - previous["postgres"]["autoanalyzes"])
        put("load.jobs_admitted", second, jobs)
        for kind in ("admit", "delta", "list"):
            figures = window["latency_ms"].get(kind)
            put(f"latency.{kind}.p50_ms", second, figures["p50"] if figures else None)
            put(f"latency.{kind}.p99_ms", second, figures["p99"] if figures else None)
        gap = gaps["per_window"].get(str(sample["index"] - 1))
        put("promotion_gap.p50_ms", second, gap["p50"] if gap and gap["count"] else None)
        put("promotion_gap.p99_ms", second, gap["p99"] if gap and gap["count"] else None)
        put("promotion_gap.count", second, gap["count"] if gap else 0)
    return series


PLOTS = {
    "rss": ("Resident memory of each replica", "MB", ["replica1.rss_mb", "replica2.rss_mb"]),
    "descriptors": ("Open file descriptors of each replica", "descriptors", ["replica1.fds", "replica2.fds"]),
    "threads": ("Threads of each replica", "threads", ["replica1.threads", "replica2.threads"]),
    "tasks": ("asyncio tasks of each replica (queue.loop.tasks)", "tasks", ["replica1.tasks", "replica2.tasks"]),
    "loop_lag": (
        "Event-loop lag of each replica, the window's peak (queue.loop.lag)",
        "ms",
        ["replica1.loop_lag_ms_peak", "replica2.loop_lag_ms_peak"],
    ),
    "pg_connections": ("PostgreSQL client connections", "connections", ["postgres.connections", "postgres.connections_here"]),
    "database_size": (
        "Database size: every relation of pg_class, all but the audit trail, and the largest tables",
        "MB",
        ["postgres.relations_bytes", "postgres.relations_bytes_but_audit_trail"],
    ),
    "dead_tuples": ("Dead tuples (pg_stat_user_tables)", "tuples", ["postgres.dead_tuples", "postgres.live_tuples"]),
    "wal_per_job": ("WAL bytes per job admitted, per window", "bytes", ["postgres.wal_bytes_per_job"]),
    "autovacuum": ("Autovacuum and autoanalyze runs per window", "runs", ["postgres.autovacuum_runs", "postgres.autoanalyze_runs"]),
    "admit_latency": (
        "Admit latency per window (the load's view)",
        "ms",
        ["latency.admit.p50_ms", "latency.admit.p99_ms", "latency.delta.p99_ms"],
    ),
    "promotion_gap": (
        "Promotion gap per window: CompleteRun returned -> next ReleaseRun",
        "ms",
        ["promotion_gap.p50_ms", "promotion_gap.p99_ms"],
    ),
}
# Series held in bytes, plotted in MB.
_MB_SERIES = ("postgres.relations_bytes", "table.")
# Series whose slope is the soak's point; the rest are shown and fitted too.
TRENDED = (
    "replica1.rss_mb", "replica2.rss_mb", "replica1.fds", "replica2.fds", "replica1.threads", "replica2.threads",
    "replica1.tasks", "replica2.tasks", "replica1.loop_lag_ms_peak", "replica2.loop_lag_ms_peak",
    "postgres.connections", "postgres.relations_bytes", "postgres.database_bytes", "postgres.dead_tuples",
    "postgres.wal_bytes_per_job", "postgres.autovacuum_runs", "latency.admit.p50_ms", "latency.admit.p99_ms",
    "latency.delta.p99_ms", "latency.list.p99_ms", "promotion_gap.p50_ms", "promotion_gap.p99_ms",
)  # fmt: skip


def write_plots(
    plots_dir: Path, series: dict[str, list[tuple[float, float | None]]], trends: dict[str, Any], warmup_seconds: float
) -> list[str]:
    written = []
    tables = sorted((name for name in series if name.startswith("table.")), key=lambda n: -(series[n][-1][1] or 0))[:5]
    for name, (title, unit, names) in PLOTS.items():
        chosen = names + (tables if name == "database_size" else [])
        lines, fits = {}, {}
        for key in chosen:
            if key not in series:
                continue
            scale = 1 / 1e6 if key.startswith(_MB_SERIES) else 1.0
            label = key.removeprefix("table.").removesuffix(".bytes") if key.startswith("table.") else key
            lines[label] = [(t / 60, None if v is None else v * scale) for t, v in series[key]]
            fit = trends.get(key)
            if fit and fit.get("slope_per_hour") is not None:
                fits[label] = (fit["slope_per_hour"] * scale, fit["intercept"] * scale)
        path = plots_dir / f"{name}.svg"
        soak_analysis.svg_chart(path, title, unit, lines, warmup_minutes=warmup_seconds / 60, fits=fits)
        written.append(str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path))
    return written


def _p99_drift(series: list[tuple[float, float | None]], warmup_seconds: float) -> dict[str, Any]:
    steady = [(t, v) for t, v in series if t > warmup_seconds and v is not None]
    if len(steady) < 2:
        return {"first_steady": None, "last": None, "ratio": None}
    first, last = steady[0][1], steady[-1][1]
    return {"first_steady": first, "last": last, "ratio": round(last / first, 3) if first else None}


# The span each p99 of the drift target is pooled over (soak_analysis.pooled_p99_drift).
P99_SPAN_SECONDS = 300.0


def database_after_turnover(series: dict[str, Any], turnover_seconds: float) -> dict[str, Any]:
    """The growth of what the retention bounds (every relation but the audit trail: the ledger,
    the setting changes and the operator's actions, kept as the audit trail is) once the seeded
    history has turned over: the pruner deletes no job within an hour of its admit, so until then
    it deletes seeded rows while the load writes its own, larger ones (their sources, their
    updates' dead space). From then on the load's rows replace the load's rows, and what the bytes
    do is the steady state."""
    points = series.get("postgres.relations_bytes_but_audit_trail", [])
    return soak_analysis.trend([t for t, _ in points], [v for _, v in points], turnover_seconds)


def evaluate(
    trends: dict[str, Any], series: dict[str, Any], warmup_seconds: float, errors: dict[str, Any], pooled: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The issue's targets, each with the figure it was judged on. The p99 drift is judged pooled
    (`pooled`: the first steady minutes against the last); the drift of single windows is kept
    beside it, as information."""

    def growth(name: str) -> float | None:
        return (trends.get(name) or {}).get("slope_pct_of_mean_per_hour")

    targets: dict[str, Any] = {}
    for name in ("replica1.rss_mb", "replica2.rss_mb", "replica1.fds", "replica2.fds", "postgres.relations_bytes"):
        value = growth(name)
        targets[f"{name} growth < 5%/h"] = {"value_pct_per_hour": value, "pass": value is not None and value < 5}
    turnover = trends.get("postgres.relations_bytes_but_audit_trail after the seeded history turned over")
    if turnover and turnover.get("samples", 0) >= 10:
        value = turnover["slope_pct_of_mean_per_hour"]
        targets["postgres.relations_bytes_but_audit_trail growth < 5%/h after the seeded history turned over"] = {
            "value_pct_per_hour": value,
            "from_second": turnover["from_second"],
            "pass": value is not None and value < 5,
        }
    for name in ("latency.admit.p99_ms", "promotion_gap.p99_ms"):
        drift = pooled[name]
        targets[
            f"{name} of the last {drift.get('span_minutes', '?')} min <= 1.1 x the first steady {drift.get('span_minutes', '?')} min"
        ] = {
            **drift,
            "single_windows": _p99_drift(series.get(name, []), warmup_seconds),
            "pass": drift["ratio"] is not None and drift["ratio"] <= 1.1,
        }
    unexpected = sum(errors["unexpected"].values()) + sum(n for k, n in errors["service_log"].items() if k.startswith("error"))
    targets["no errors the load did not ask for"] = {"value": unexpected, "pass": unexpected == 0}
    return targets


def render(document: dict[str, Any]) -> str:
    lines = [f"soak: {document['meta']['minutes']} min, {document['meta']['users']} users, {document['meta']['rate']} clicks/s"]
    lines.append(f"{'series (after warm-up)':42} {'mean':>14} {'slope/h':>14} {'%/h':>8}")
    for name, fit in document["trends"].items():
        if fit.get("mean") is None:
            continue
        pct = fit["slope_pct_of_mean_per_hour"]
        lines.append(f"{name:42} {fit['mean']:>14.6g} {fit['slope_per_hour']:>14.6g} {'' if pct is None else f'{pct:8.2f}'}")
    lines.append("targets:")
    for name, verdict in document["targets"].items():
        figures = {k: v for k, v in verdict.items() if k != "pass"}
        lines.append(f"  {'PASS' if verdict['pass'] else 'MISS'}  {name}  {figures}")
    errors = document["errors"]
    lines.append(f"errors asked for: {errors['asked_for']}")
    lines.append(f"errors not asked for: {errors['unexpected']}")
    lines.append(f"service log warnings/errors: {errors['service_log']}")
    return "\n".join(lines)


# -- the run ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="acurio-soak-"))
    db = Database(workdir, durable=args.durable)
    fleet: Fleet | None = None
    driver: subprocess.Popen[str] | None = None
    sampler: Sampler | None = None
    succeeded = False
    try:
        db.start()
        dsn = create_database(db, "soak")
        dbsetup.grant_credits(dsn, USER_PREFIX, args.users, 1_000_000)
        seeded = int(args.rate * JOBS_PER_CLICK * args.history_minutes * 60)
        if seeded:
            seconds = dbsetup.load_history(
                dsn, jobs=seeded, users=args.users, user_prefix=USER_PREFIX, span_seconds=args.history_minutes * 60, ended_after_seconds=5
            )
            _log(started, f"seeded {seeded} finished jobs over the last {args.history_minutes:g} min in {seconds:.1f}s")
        fleet = Fleet(db, dsn, workdir, args)
        _log(started, f"fleet up: replicas {fleet.addresses}, work folder {workdir}")
        driver = start_load(fleet, args, workdir)
        assert driver.stdin is not None and driver.stdout is not None
        if not driver.stdout.readline().strip():
            raise RuntimeError(f"the load failed before it was ready:\n{_tail(workdir / 'soak.load.log')}")
        sampler = Sampler(fleet, db, dsn, driver.pid)
        t0_ns = time.monotonic_ns()
        driver.stdin.write(f"go {t0_ns}\n")
        driver.stdin.flush()
        sampler.sample(0, t0_ns)
        windows = math.ceil(args.minutes * 60 / args.sample_seconds)
        scrape_every = min(5.0, args.sample_seconds)
        for index in range(1, windows + 1):
            boundary = t0_ns + int(min(index * args.sample_seconds, args.minutes * 60) * 1e9)
            while (left := (boundary - time.monotonic_ns()) / 1e9) > 0:
                time.sleep(min(left, scrape_every))
                if (boundary - time.monotonic_ns()) / 1e9 > 0.5:
                    sampler.scrape_all()
            sample = sampler.sample(index, t0_ns)
            rss = ", ".join(f"{r['rss_mb']:.0f}" for r in sample["replicas"] if "rss_mb" in r)
            _log(started, f"window {index}/{windows}: RSS {rss} MB, database {sample['postgres']['relations_bytes'] / 1e6:.1f} MB")
            for replica in fleet.replicas:
                if replica.process.poll() is not None:
                    raise RuntimeError(f"{replica.name} exited with {replica.process.returncode}:\n{_tail(replica.log_path)}")
        line = driver.stdout.readline()
        driver.wait(60)
        if not line.strip():
            raise RuntimeError(f"the load ended without its result:\n{_tail(workdir / 'soak.load.log')}")
        load = json.loads(line)["result"]
        sampler.close()
        fleet.stop()
        gaps = soak_analysis.promotion_gaps(
            soak_analysis.read_record(fleet.record_path),
            t0_ns=t0_ns,
            window_seconds=args.sample_seconds,
            fleet_pauses=load["fleet_pauses_ns"],
            user_pauses=load["user_pauses_ns"],
        )
        service_log = service_log_problems([r.log_path for r in fleet.replicas])
        succeeded = True
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait()
        if sampler is not None:
            sampler.close()
        if fleet is not None:
            fleet.stop()
        db.stop()
        if args.keep_workdir:
            print(f"logs and data kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            if not succeeded:
                print("the soak failed; run again with --keep-workdir to keep its logs and data", file=sys.stderr)
    return assemble(args, sampler.samples, load, gaps, service_log, started, sampler.scrape_failures, seeded)


def assemble(
    args: argparse.Namespace,
    samples: list[dict[str, Any]],
    load: dict[str, Any],
    gaps: dict[str, Any],
    service_log: dict[str, int],
    started: float,
    scrape_failures: int,
    seeded: int,
) -> dict[str, Any]:
    warmup_minutes = args.warmup_minutes if args.warmup_minutes is not None else (5.0 if args.minutes >= 20 else args.minutes / 4)
    warmup_seconds = warmup_minutes * 60
    series = window_series(samples, load, gaps)
    trends = {
        name: soak_analysis.trend([t for t, _ in series[name]], [v for _, v in series[name]], warmup_seconds)
        for name in TRENDED
        if name in series
    }
    # The pruner deletes no job within an hour of its admit: the seeded history is gone an hour in.
    turnover_seconds = max(args.history_minutes, 60.0) * 60
    trends["postgres.relations_bytes_but_audit_trail after the seeded history turned over"] = database_after_turnover(
        series, turnover_seconds
    )
    audit = series.get("postgres.audit_trail_bytes", [])
    trends["postgres.audit_trail_bytes after the seeded history turned over"] = soak_analysis.trend(
        [t for t, _ in audit], [v for _, v in audit], turnover_seconds
    )
    errors = {"asked_for": load["asked_for"], "unexpected": load["errors"], "service_log": service_log}
    spans = {"window_seconds": args.sample_seconds, "warmup_seconds": warmup_seconds, "span_seconds": P99_SPAN_SECONDS}
    pooled = {
        "latency.admit.p99_ms": soak_analysis.pooled_p99_drift(load["admit_seconds"], **spans),
        "promotion_gap.p99_ms": soak_analysis.pooled_p99_drift(gaps["seconds_by_window"], **spans),
    }
    first, last = samples[0], samples[-1]
    cpu = {
        name: round((last_value - first_value) / (last["second"] - first["second"]), 3)
        for name, first_value, last_value in [
            *[
                (r["name"], f.get("cpu_seconds", 0), r.get("cpu_seconds", 0))
                for f, r in zip(first["replicas"], last["replicas"], strict=True)
            ],
            ("dev_core", first["dev_core"]["cpu_seconds"], last["dev_core"]["cpu_seconds"]),
            ("postgres", first["postgres"]["cpu_seconds"], last["postgres"]["cpu_seconds"]),
            ("load", first["load_cpu_seconds"], last["load_cpu_seconds"]),
        ]
    }
    totals: dict[str, int] = {}
    for window in load["windows"].values():
        for key, n in window["counts"].items():
            totals[key] = totals.get(key, 0) + n
    document = {
        "meta": {
            "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "git_head": procs.git_head(),
            "minutes": args.minutes,
            "users": args.users,
            "rate": args.rate,
            "sample_seconds": args.sample_seconds,
            "warmup_minutes": warmup_minutes,
            "settings": {k: (_shown_path(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "seeded_history_jobs": seeded,
            "duration_seconds": round(time.monotonic() - started, 1),
            "cpus": os.cpu_count(),
            "machine": platform.platform(),
            "loadavg_first_last": [first["loadavg"], last["loadavg"]],
            "metric_scrape_failures": scrape_failures,
            "units": "rss_mb in MiB; *_bytes in bytes; latencies in ms; slope_per_hour in the series' unit per hour; "
            "slope_pct_of_mean_per_hour = 100 x slope / mean (growth an hour, extrapolated)",
        },
        "cpu_cores": cpu,
        "totals": totals,
        "streams": load["streams"],
        "clicks_shed": load["clicks_shed"],
        "calls_unfinished_at_end": load["calls_unfinished_at_end"],
        "fleet_pauses": len(load["fleet_pauses_ns"]),
        "user_pauses": len(load["user_pauses_ns"]),
        "promotion_gap_ms": {"all": gaps["all"], "held_by_pause": gaps["held_by_pause"]},
        "errors": errors,
        "trends": trends,
        "targets": evaluate(trends, series, warmup_seconds, errors, pooled),
        "samples": samples,
        "windows": {
            "load": load["windows"],
            "promotion_gap_ms": gaps["per_window"],
        },
    }
    document["plots"] = write_plots(args.plots_dir, series, trends, warmup_seconds)
    return document


def _shown_path(path: Path) -> str:
    """A path as the report records it: relative to the checkout when inside it (a report is
    committed, and names no folder of the machine that wrote it)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    document = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(render(document))
    print(f"\nwrote {args.out} and {len(document['plots'])} plots in {args.plots_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
