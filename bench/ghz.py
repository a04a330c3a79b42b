"""Running ghz and reading its JSON report."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

GHZ = shutil.which("ghz") or os.path.expanduser("~/go/bin/ghz")

ADMIT = "acurio.queue.v1.AnalysisQueueService/Admit"
LIST_JOBS = "acurio.queue.v1.AnalysisQueueService/ListJobs"
HEALTH_CHECK = "grpc.health.v1.Health/Check"
GET_OVERVIEW = "acurio.queue.v1.OperatorService/GetOverview"
SEARCH_JOBS = "acurio.queue.v1.OperatorService/SearchJobs"
# The console's reads: the overview of the last hour, and a first page of the job search.
OVERVIEW_DATA: dict[str, Any] = {"window_minutes": 60}


def admit_data(user_prefix: str, users: int, key_prefix: str) -> dict[str, Any]:
    """An Admit request spread round-robin over `users` users, with a unique idempotency key
    per request (ghz's templates: `.RequestNumber`, sprig's `mod`)."""
    return {
        "user_id": f"{user_prefix}{{{{mod .RequestNumber {users}}}}}",
        "idempotency_key": f"{key_prefix}-{{{{.RequestNumber}}}}",
        "document": {"uri": "s3://theses/bench.pdf", "title": "bench"},
        "sources": [{"doi": "10.1234/bench", "citation": "Bench et al. 2024"}],
    }


def search_jobs_data(user_prefix: str | None, users: int, page_size: int) -> dict[str, Any]:
    """SearchJobs: the newest jobs of all users (`user_prefix` None), or of one user each call."""
    if user_prefix is None:
        return {"filter": {}, "page_size": page_size}
    return {"filter": {"user_id": f"{user_prefix}{{{{mod .RequestNumber {users}}}}}"}, "page_size": page_size}


def list_jobs_data(user_prefix: str, users: int, page_size: int) -> dict[str, Any]:
    return {"user_id": f"{user_prefix}{{{{mod .RequestNumber {users}}}}}", "page_size": page_size}


@dataclasses.dataclass(frozen=True)
class GhzResult:
    count: int
    ok: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    errors: dict[str, int]

    def latency_dict(self) -> dict[str, float]:
        return {"count": self.count, "p50": self.p50_ms, "p90": self.p90_ms, "p99": self.p99_ms, "max": self.max_ms, "mean": self.mean_ms}


def run_ghz(
    target: str,
    call: str,
    data: dict[str, Any],
    *,
    protoset: Path,
    concurrency: int,
    total: int,
    connections: int = 1,
    cpus: int = 1,
) -> GhzResult:
    """One ghz run; `cpus` caps ghz's own Go threads so it leaves the 2 cores to what is measured."""
    report = ghz_report(target, call, data, protoset=protoset, concurrency=concurrency, total=total, connections=connections, cpus=cpus)
    return summarize_report(report)


def ghz_report(
    target: str, call: str, data: dict[str, Any], *, protoset: Path, concurrency: int, total: int, connections: int = 1, cpus: int = 1
) -> dict[str, Any]:
    """ghz's whole JSON report, with `details`: each call's start (`timestamp`), latency (ns) and status."""
    args = [
        GHZ,
        "--insecure",
        "--protoset",
        str(protoset),
        "--call",
        call,
        "--format",
        "json",
        "-c",
        str(concurrency),
        "-n",
        str(total),
        "--connections",
        str(connections),
        "--cpus",
        str(cpus),
        "--timeout",
        "30s",
        "-d",
        json.dumps(data),
        target,
    ]
    completed = subprocess.run(args, capture_output=True, text=True, check=False)
    if completed.returncode != 0 and not completed.stdout.strip():
        raise RuntimeError(f"ghz failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return json.loads(completed.stdout)


def summarize_report(report: dict[str, Any]) -> GhzResult:
    percentiles = {int(p["percentage"]): p["latency"] / 1e6 for p in report.get("latencyDistribution") or []}
    codes = report.get("statusCodeDistribution") or {}
    errors = dict(report.get("errorDistribution") or {})
    return GhzResult(
        count=int(report["count"]),
        ok=int(codes.get("OK", 0)),
        seconds=report["total"] / 1e9,
        rps=report["rps"],
        p50_ms=percentiles.get(50, float("nan")),
        p90_ms=percentiles.get(90, float("nan")),
        p99_ms=percentiles.get(99, float("nan")),
        max_ms=report["slowest"] / 1e6,
        mean_ms=report["average"] / 1e6,
        errors={**{code: n for code, n in codes.items() if code != "OK"}, **errors},
    )
