"""Where the service's CPU goes: py-spy under Admit (or ListJobs) load, and A/B runs of the same
load with an environment change. Not part of `bench.run` (profiling slows the profiled process).
py-spy comes from PyPI: `.venv/bin/pip install py-spy`.

    .venv/bin/python -m bench.probes.profile [--calls 5000] [--callers 16] [--call admit|list_jobs] [--native]
    .venv/bin/python -m bench.probes.profile --ab OTEL_SDK_DISABLED=true     # no py-spy: throughput and CPU/op, A vs B

The profile's collapsed stacks (flamegraph input) go to bench/results/profile-<call>.txt; the
summary shows the share of samples per package (by the innermost Python frame, so time inside
libpq or a syscall counts for the Python package that made the call) and the hottest functions.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import dbsetup
from bench.context import QUICK, Context
from bench.ghz import ADMIT, LIST_JOBS, admit_data, list_jobs_data
from bench.measure import CpuMeter
from bench.procs import BIN, Database, MinimalServer
from bench.protoset import write_protoset

RESULTS = Path(__file__).resolve().parents[1] / "results" / "history"
_USERS = 1000
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::\d+)?\)$")

# Package of a frame, from its full file name; the first match wins.
_CATEGORIES = [
    ("opentelemetry (spans, instrumentation)", "/opentelemetry/"),
    ("psycopg_pool", "/psycopg_pool/"),
    ("psycopg (incl. libpq send/recv)", "/psycopg"),
    ("grpc (python + cython)", "/grpc"),
    ("protobuf", "/google/protobuf/"),
    ("tenacity", "/tenacity/"),
    ("queue_service", "/queue_service/"),
    ("logging", "/logging/"),
    ("asyncio + selectors (event loop)", "/asyncio/"),
    ("asyncio + selectors (event loop)", "/selectors.py"),
]


def _category(file: str) -> str:
    if file.endswith("threading.py"):
        # A thread whose target is C code: grpc's completion-queue poller in this process.
        return "grpc poller thread (C core)"
    for name, needle in _CATEGORIES:
        if needle in file:
            return name
    return "other: " + Path(file).name


# Inclusive shares: protobuf's own code, Python (google/protobuf) or native (the upb extension,
# `_message*.so`, whose C functions are named upb_*; seen with --native).
_INCLUSIVE = {
    "protobuf (python + upb)": re.compile(r"/google/protobuf/|_message\.|\bupb_|_upb"),
}


def _inclusive(collapsed: Path) -> dict[str, int]:
    counts = dict.fromkeys(_INCLUSIVE, 0)
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or stack.rsplit(";", 1)[-1].startswith(("epoll_wait", "poll ", "select ")):
            continue
        for name, pattern in _INCLUSIVE.items():
            if pattern.search(stack):
                counts[name] += int(count_text)
    return counts


def shares(collapsed: Path) -> dict[str, Any]:
    """The summary as data (bench/results/profile-<call>.json): busy samples, share per package
    (innermost Python frame) and the inclusive shares, with the protobuf backend in use."""
    from google.protobuf.internal import api_implementation

    by_category: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = [m for m in (_FRAME.match(f) for f in stack.split(";")) if m] if stack else []
        if not frames or frames[-1]["func"] in ("epoll_wait", "poll", "select"):
            continue
        python = [f for f in frames if f["file"].endswith(".py") or f["file"].startswith("<")]
        by_category[_category((python[-1] if python else frames[-1])["file"])] += int(count_text)
        total += int(count_text)
    return {
        "protobuf_backend": api_implementation.Type(),
        "busy_samples": total,
        "share_by_package": {name: round(n / total, 4) for name, n in by_category.most_common() if n / total >= 0.001},
        "inclusive_share": {name: round(n / total, 4) for name, n in _inclusive(collapsed).items()},
        "loadavg": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]],
    }


def _busy(collapsed: Path) -> int:
    """Samples not idle in the selector's wait (py-spy's rate x CPU seconds, roughly)."""
    return shares(collapsed)["busy_samples"]


def summarize(collapsed: Path, top: int) -> str:
    by_category: collections.Counter[str] = collections.Counter()
    exclusive: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [m for m in (_FRAME.match(f) for f in stack.split(";")) if m]
        if frames and frames[-1]["func"] in ("epoll_wait", "poll", "select"):
            idle += count
            continue
        python = [f for f in frames if f["file"].endswith(".py") or f["file"].startswith("<")]
        innermost = python[-1] if python else frames[-1]
        total += count
        by_category[_category(innermost["file"])] += count
        exclusive[f"{frames[-1]['func']} ({Path(frames[-1]['file']).name})"] += count
    lines = [f"{total} busy samples ({idle} idle in epoll not counted)", "", "by package (innermost Python frame):"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in by_category.most_common()]
    lines += ["", "inclusive (a sample counts when any frame of its stack matches):"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in _inclusive(collapsed).items()]
    lines += ["", "hottest frames (exclusive):"]
    lines += [f"  {n / total:6.1%}  {label}" for label, n in exclusive.most_common(top)]
    return "\n".join(lines)


def _load(ctx: Context, address: str, call: str, calls: int, callers: int, key: str):  # type: ignore[no-untyped-def]
    data = admit_data("p-u", _USERS, key) if call == "admit" else list_jobs_data("p-u", _USERS, 10)
    return ctx.ghz(address, ADMIT if call == "admit" else LIST_JOBS, data, concurrency=callers, total=calls)


def profile(ctx: Context, args: argparse.Namespace) -> None:
    py_spy = shutil.which("py-spy") or str(BIN / "py-spy")
    dsn = ctx.database("profile")
    dbsetup.grant_credits(dsn, "p-u", _USERS, args.calls // _USERS + 10)
    floor = args.target != "service"
    if floor and args.call != "admit":
        raise SystemExit(f"the {args.target} floor serves Admit only")
    out = (
        RESULTS
        / f"profile-{args.call}{'-' + args.target.replace('_', '-') if floor else ''}{f'-c{args.callers}' if args.callers != 16 else ''}{'-native' if args.native else ''}.txt"
    )
    # The service as deployed, or a floor (bench/minimal_server.py --core [--contract]) under the same load.
    server = MinimalServer(dsn, ctx.workdir, with_core=True, contract=args.target == "minimal_contract") if floor else None
    with server or ctx.stack(dsn, "profile") as target:
        address, pid = (target.address, target.pid) if isinstance(target, MinimalServer) else (target.address, target.service.pid)
        _load(ctx, address, "admit", 500, args.callers, "warm")
        spy = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                "250",
                "--format",
                "raw",
                "--full-filenames",
                "--output",
                str(out),
            ]
            + (["--native"] if args.native else ["--nonblocking"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)
        result = _load(ctx, address, args.call, args.calls, args.callers, "measure")
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(60)
    if not out.exists():
        raise RuntimeError(f"py-spy wrote nothing: {spy.stderr.read().decode()[-2000:] if spy.stderr else ''}")
    print(f"{args.call}: {result.ok} ok, {result.ok / result.seconds:.0f}/s under py-spy, p50 {result.p50_ms:.1f} ms")
    print(summarize(out, args.top))
    summary = {
        "target": args.target,
        "call": args.call,
        "callers": args.callers,
        "native": args.native,
        "ok": result.ok,
        "throughput_per_s_under_py_spy": round(result.ok / result.seconds, 1),
        "busy_samples_per_call": round(_busy(out) / result.ok, 3),
        **shares(out),
    }
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\ncollapsed stacks: {out}")


def ab(ctx: Context, args: argparse.Namespace) -> None:
    """The same load on two fresh replicas: as configured (A) and with the env change (B)."""
    key, _, value = args.ab.partition("=")
    for label, env in (("A (as deployed)", {}), (f"B ({key}={value})", {key: value})):
        dsn = ctx.database("ab_" + ("a" if not env else "b"))
        dbsetup.grant_credits(dsn, "p-u", _USERS, args.calls // _USERS + 10)
        with ctx.stack(dsn, "ab", env=env) as stack:
            _load(ctx, stack.address, "admit", 500, args.callers, "warm")
            meter = CpuMeter(stack.cpu_roots()).start()
            result = _load(ctx, stack.address, args.call, args.calls, args.callers, "measure")
            cpu = meter.stop()
        per_op = ", ".join(f"{name} {seconds * 1000 / result.ok:.2f}" for name, seconds in cpu.items())
        print(
            f"{label:40} {result.ok / result.seconds:7.1f}/s  p50 {result.p50_ms:6.1f} ms  p99 {result.p99_ms:6.1f} ms  CPU ms/op: {per_op}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--call", choices=("admit", "list_jobs"), default="admit")
    parser.add_argument(
        "--target",
        choices=("service", "minimal_core", "minimal_contract"),
        default="service",
        help="profile the service as deployed, or a floor under the same load (bench/minimal_server.py with its core: minimal_core; with the contract's work too: minimal_contract)",
    )
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--native", action="store_true", help="include C frames (libpq, grpc core); slower sampling")
    parser.add_argument("--ab", metavar="KEY=VALUE", help="compare throughput and CPU/op without and with this service env setting")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="acurio-profile-"))
    db = Database(workdir, durable=True)
    try:
        db.start()
        ctx = Context(db, workdir, QUICK, write_protoset(workdir / "queue.protoset"))
        (ab if args.ab else profile)(ctx, args)
    finally:
        db.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
