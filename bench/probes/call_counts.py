"""Python function calls per admit in the service's event-loop thread, and in the minimal server's:
counts that a loaded machine does not blur, where its CPU figures are noise. Each server runs
under cProfile, switched on and off by SIGUSR2 around the measured admits (warm-up excluded); the
counts per function go to the JSON report. Not part of `bench.run` (profiling slows the server).

    .venv/bin/python -m bench.probes.call_counts [--admits 2000] [--users 200] [--base-path DIR]

`--base-path DIR` also counts a service whose `queue_service` package is the one in DIR (say a
`git archive REV queue_service | tar -x -C DIR` of an earlier revision), on the same database
server, for a before/after of a change.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import dbsetup
from bench.context import QUICK, Context
from bench.ghz import ADMIT, admit_data
from bench.probes.rounds import RESULTS, new_report, scratch_database, write_report
from bench.procs import REPO_ROOT, free_port, wait_port
from bench.protoset import write_protoset

_CALLERS = 16
_WARM_USERS, _WARM_ADMITS = 50, 300
_TOGGLE = signal.SIGUSR2


def _profiled(argv: list[str], out: str) -> None:
    """Runs a server's `main` with the profiler toggled by SIGUSR2 (the second one writes `out`)."""
    profile = cProfile.Profile()
    on = False

    def toggle(signum: int, frame: object) -> None:
        nonlocal on
        if on:
            profile.disable()
            profile.dump_stats(out + ".part")
            os.replace(out + ".part", out)  # whole, or not there yet
        else:
            profile.enable()
        on = not on

    signal.signal(_TOGGLE, toggle)
    if argv[0] == "serve":
        from queue_service.cli import main

        sys.argv = ["queue-service", "serve"]
    else:
        from bench.minimal_server import main

        sys.argv = ["minimal_server", *argv[1:]]
    main()


def _count(ctx: Context, pid: int, address: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    ctx.ghz(address, ADMIT, admit_data("w-u", _WARM_USERS, "warm"), concurrency=_CALLERS, total=_WARM_ADMITS)
    os.kill(pid, _TOGGLE)
    result = ctx.ghz(address, ADMIT, admit_data("p-u", args.users, "measure"), concurrency=_CALLERS, total=args.admits)
    os.kill(pid, _TOGGLE)
    for _ in range(100):
        if out.exists():
            break
        time.sleep(0.1)
    stats = pstats.Stats(str(out))
    per_function: collections.Counter[str] = collections.Counter()
    for (file, line, name), (_, calls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        per_function[f"{name} ({Path(file).name}:{line})"] += calls
    ok = result.ok
    return {
        "admits": ok,
        "calls_per_admit": round(stats.total_calls / ok, 1),  # type: ignore[attr-defined]
        "top_per_admit": {name: round(calls / ok, 2) for name, calls in per_function.most_common(60)},
    }


def _database(ctx: Context, name: str, args: argparse.Namespace) -> str:
    dsn = ctx.database(name)
    dbsetup.grant_credits(dsn, "p-u", args.users, args.admits // args.users + 10)
    dbsetup.grant_credits(dsn, "w-u", _WARM_USERS, _WARM_ADMITS // _WARM_USERS + 10)
    return dsn


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--profiled":
        _profiled(sys.argv[3:], sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--admits", type=int, default=2000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--base-path", help="a folder holding an earlier queue_service package, counted too")
    parser.add_argument("--out", type=Path, default=RESULTS / "admit-call-counts.json")
    args = parser.parse_args()
    report = new_report(probe="call_counts", admits=args.admits, users=args.users, callers=_CALLERS)
    # The working folder (the repository) leaves the path: a base revision's queue_service, first
    # in PYTHONPATH, must not be shadowed by this one.
    profiled = [sys.executable, "-c", "import sys; del sys.path[0]; from bench.probes.call_counts import main; main()", "--profiled"]
    with scratch_database("acurio-call-counts-") as (db, workdir):
        ctx = Context(db, workdir, QUICK, write_protoset(workdir / "queue.protoset"))
        variants = {"service": {}} | ({"service_base": {"PYTHONPATH": args.base_path}} if args.base_path else {})
        for name, env in variants.items():
            out = workdir / f"{name}.prof"
            dsn = _database(ctx, name, args)
            command = [*profiled, str(out), "serve"]
            path = f"{env['PYTHONPATH']}:{REPO_ROOT}" if env else str(REPO_ROOT)
            with ctx.stack(dsn, name, env={"PYTHONPATH": path}, service_command=command) as stack:
                report[name] = _count(ctx, stack.service.pid, stack.address, args, out)
            print(f"{name}: {report[name]['calls_per_admit']} calls per admit", flush=True)
        out = workdir / "minimal.prof"
        dsn = _database(ctx, "minimal", args)
        port = free_port()
        log = workdir / "minimal.log"
        with log.open("wb") as log_file:
            server = subprocess.Popen(
                [*profiled, str(out), "minimal", "--listen", f"127.0.0.1:{port}", "--dsn", dsn],
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_port(port, server, log)
            report["minimal"] = _count(ctx, server.pid, f"127.0.0.1:{port}", args, out)
        finally:
            server.terminate()
            server.wait(10)
        print(f"minimal: {report['minimal']['calls_per_admit']} calls per admit", flush=True)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
