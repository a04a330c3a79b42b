"""What every scenario shares: the sizes of this run, the database server, the work folder, and
measured load runs (ghz or the Python driver) that return one uniform result record."""

from __future__ import annotations

import dataclasses
import resource
from pathlib import Path
from typing import Any

from bench import procs, statements
from bench.ghz import GhzResult, run_ghz
from bench.measure import CpuMeter, peak_rss_mb, unattributed_cpu


@dataclasses.dataclass(frozen=True)
class Sizes:
    floor_calls: int = 10_000
    warmup_calls: int = 300
    many_users: int = 1_000
    many_users_admits: int = 20_000
    concurrencies: tuple[int, ...] = (16, 64)
    hot_user_callers: int = 50
    hot_user_admits: int = 2_000
    promotion_users: int = 200
    promotion_queue: int = 5
    promotion_light_users: int = 20
    judging_seconds: float = 0.2
    history_jobs: int = 1_000_000
    history_users: int = 100_000
    history_probe_users: int = 500  # users admitted 10 jobs each, then listed, in each phase
    history_jobs_per_probe_user: int = 10
    in_flight_users: int = 250  # x (1 running + 3 queued) = 1 000 jobs in flight
    in_flight_queued_per_user: int = 3
    sweeper_passes: int = 20
    deep_queue_users: int = 1_000  # the sweeper again with 1 000 users x (1 running + 10 queued)
    deep_queue_queued_per_user: int = 10
    watch_streams: int = 1_000
    watch_channels: int = 10
    watch_ticks: int = 20
    watch_interval_seconds: float = 0.5
    idle_seconds: float = 10.0
    capacity_users: int = 200  # x capacity_queue jobs against a capacity of `capacity` runs
    capacity_queue: int = 5
    capacity: int = 20


FULL = Sizes()
QUICK = Sizes(
    floor_calls=1_000,
    warmup_calls=100,
    many_users_admits=1_000,
    hot_user_admits=300,
    promotion_users=50,
    promotion_light_users=10,
    history_jobs=20_000,
    history_users=2_000,
    history_probe_users=50,
    in_flight_users=250,
    sweeper_passes=10,
    watch_streams=100,
    watch_channels=4,
    idle_seconds=3.0,
    watch_ticks=10,
    watch_interval_seconds=0.3,
    capacity_users=50,
    capacity=10,
)

# The service as deployed: defaults everywhere (JSON logs at info, sweeper every 30 s, pool 2..20)
# except what the bench must set to reach it.
SERVICE_ENV: dict[str, str] = {}


@dataclasses.dataclass
class Context:
    db: procs.Database
    workdir: Path
    sizes: Sizes
    protoset: Path
    _process_cpu: statements.PostgresCpuByProcess | None = None
    # How many statements a breakdown lists (`--statement-stats`), most time first.
    statements_top: int = statements.TOP

    def database(self, name: str) -> str:
        return procs.create_database(self.db, name)

    def stack(
        self,
        dsn: str,
        name: str,
        *,
        env: dict[str, str] | None = None,
        judging_seconds: float = 1.0,
        judging_spread_seconds: float = 0.0,
        service_command: list[str] | None = None,
    ) -> procs.Stack:
        """A fresh service replica and a manual dev core (see procs.Stack)."""
        return procs.Stack(
            self.db,
            dsn,
            self.workdir,
            name,
            service_env={**SERVICE_ENV, **(env or {})},
            judging_seconds=judging_seconds,
            judging_spread_seconds=judging_spread_seconds,
            manual=True,
            service_command=service_command,
        )

    def ghz(self, target: str, call: str, data: dict[str, Any], *, concurrency: int, total: int) -> GhzResult:
        return run_ghz(target, call, data, protoset=self.protoset, concurrency=concurrency, total=total)

    def statements_reset(self, database: str) -> None:
        """Starts a breakdown of PostgreSQL's work on `database` (`--statement-stats`); a no-op without it."""
        if self.db.statement_stats:
            statements.reset(self.db.dsn)
            self._process_cpu = statements.PostgresCpuByProcess(self.db.dsn, database, self.db.pid).start()

    def statements_since_reset(self, database: str, ops: int) -> dict[str, Any]:
        """The breakdown since `statements_reset`, per operation: each statement's time, and each
        kind of PostgreSQL process's CPU; {} without `--statement-stats`."""
        if not self.db.statement_stats or not ops:
            return {}
        by_process = self._process_cpu.stop() if self._process_cpu is not None else {}
        return {
            "statements": statements.per_operation(self.db.dsn, database, ops, top=self.statements_top),
            "postgres_cpu_ms_per_op_by_process": {label: round(seconds * 1000 / ops, 3) for label, seconds in by_process.items()},
        }

    def measured_ghz(
        self, target: str, call: str, data: dict[str, Any], *, concurrency: int, total: int, cpu_roots: dict[str, int]
    ) -> dict[str, Any]:
        """A ghz run with CPU of `cpu_roots` and of ghz itself ("loadgen") metered around it."""
        meter = CpuMeter(cpu_roots).start()
        children_before = _children_cpu()
        result = self.ghz(target, call, data, concurrency=concurrency, total=total)
        cpu = {**meter.stop(), "loadgen": _children_cpu() - children_before}
        return load_record(ok=result.ok, seconds=result.seconds, latency_ms=result.latency_dict(), cpu_seconds=cpu, errors=result.errors)

    def measured_driver(self, task: str, params: dict[str, Any], cpu_roots: dict[str, int]) -> tuple[dict[str, Any], dict[str, float]]:
        result, cpu = procs.run_driver(task, params, cpu_roots, self.workdir / f"driver-{task}.log")
        cpu["loadgen"] = cpu.pop("driver")
        return result, cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load_record(
    *, ok: int, seconds: float, latency_ms: dict[str, float], cpu_seconds: dict[str, float], errors: dict[str, int] | None = None
) -> dict[str, Any]:
    """One measured load run: throughput of successful calls, latency, CPU milliseconds per call."""
    cpu_seconds = dict(cpu_seconds)
    machine = cpu_seconds.pop("system", None)
    record = {
        "ops": ok,
        "seconds": round(seconds, 3),
        "throughput_per_s": round(ok / seconds, 1) if seconds else None,
        "latency_ms": {k: round(v, 3) if isinstance(v, float) else v for k, v in latency_ms.items()},
        "cpu_ms_per_op": {name: round(s * 1000 / ok, 3) if ok else None for name, s in cpu_seconds.items()},
        "cpu_seconds": {name: round(s, 3) for name, s in cpu_seconds.items()},
        "errors": errors or {},
    }
    if machine is not None:
        # Cores' worth of CPU the machine spent on anything not measured: noise from neighbours.
        other = unattributed_cpu({**cpu_seconds, "system": machine})
        record["machine_cpu_seconds"] = round(machine, 3)
        record["unattributed_cpu_cores"] = round(other / seconds, 2) if seconds else None
    return record


def with_peak_rss(record: dict[str, Any], pid: int) -> dict[str, Any]:
    record["service_peak_rss_mb"] = round(peak_rss_mb(pid) or float("nan"), 1)
    return record
