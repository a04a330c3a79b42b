"""What each of an idle replica's own loops costs: the same idle replica metered with the
service's settings as deployed and with one loop slowed to a crawl through its own setting, so
the difference is that loop's share. Run from a checkout's root with its venv (any version whose
`bench.procs.Stack` takes `service_env`, so it measures older commits too):

    .venv/bin/python -m bench.probes.idle_split [--seconds 30] [--repeat 2] [--out FILE]
    .venv/bin/python -m bench.probes.idle_split --variant health_off=QUEUE_HEALTH_INTERVAL_SECONDS=60

Per variant and phase (`empty`: no job; `in_flight`: 50 users with one job RUNNING and one QUEUED,
nothing due), on one durable PostgreSQL 18 and a manual dev core as `bench.run` starts them, every
database vacuumed and analyzed before the window: the service's CPU per thread (the event loop's
and gRPC's own threads apart) and every PostgreSQL process's, in ms per second. CPU is read from
/proc in ticks of 10 ms, so a 30 s window resolves 0.33 ms/s: repeat, and read the figures on a
quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import dbsetup, procs
from bench.ghz import ADMIT, admit_data, run_ghz
from bench.measure import tree_cpu_seconds
from bench.protoset import write_protoset

_USERS_IN_FLIGHT = 50
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
_DEFAULT_VARIANTS = {"as_deployed": {}, "health_off": {"QUEUE_HEALTH_INTERVAL_SECONDS": "60"}}


def _thread_ticks(pid: int) -> dict[str, tuple[str, int]]:
    """Each thread of `pid`: its name and CPU ticks (user + system)."""
    out: dict[str, tuple[str, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = (name, int(fields[11]) + int(fields[12]))
    return out


def _metered(stack: procs.Stack, db: procs.Database, seconds: float) -> dict[str, Any]:
    pid = stack.service.pid
    threads_before, postgres_before = _thread_ticks(pid), tree_cpu_seconds(db.pid)
    started = time.monotonic()
    time.sleep(seconds)
    threads_after, postgres_after = _thread_ticks(pid), tree_cpu_seconds(db.pid)
    elapsed = time.monotonic() - started
    by_thread: dict[str, float] = {}
    for tid, (name, ticks) in threads_after.items():
        if tid in threads_before:
            kind = "event loop" if tid == str(pid) else name
            by_thread[kind] = by_thread.get(kind, 0.0) + (ticks - threads_before[tid][1]) * 1000 / _TICKS_PER_SECOND / elapsed
    return {
        "service_ms_per_s": round(sum(by_thread.values()), 2),
        "service_by_thread_ms_per_s": {kind: round(value, 2) for kind, value in by_thread.items()},
        "postgres_ms_per_s": round((postgres_after - postgres_before) * 1000 / elapsed, 2),
        "load_average": os.getloadavg()[0],
    }


def _settled(db: procs.Database, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    time.sleep(3.0)


def _variant(db: procs.Database, workdir: Path, protoset: Path, name: str, env: dict[str, str], seconds: float) -> dict[str, Any]:
    dsn = procs.create_database(db, f"split_{name}")
    prefix = f"{name}-u"
    dbsetup.grant_credits(dsn, prefix, _USERS_IN_FLIGHT, 2)
    with procs.Stack(db, dsn, workdir, name, manual=True, service_env=env) as stack:
        _settled(db, dsn)
        empty = _metered(stack, db, seconds)
        run_ghz(
            stack.address, ADMIT, admit_data(prefix, _USERS_IN_FLIGHT, "idle"), protoset=protoset, concurrency=4, total=2 * _USERS_IN_FLIGHT
        )
        dbsetup.wait_for(dsn, prefix, lambda c: c.get("running", 0) == _USERS_IN_FLIGHT, timeout=30)
        _settled(db, dsn)
        in_flight = _metered(stack, db, seconds)
    return {"env": env, "empty": empty, "in_flight": in_flight}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[], help="NAME=KEY=VALUE[,KEY=VALUE]; default: as deployed and health off")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    variants = dict(_DEFAULT_VARIANTS) if not args.variant else {}
    for spec in args.variant:
        name, _, settings = spec.partition("=")
        variants[name] = dict(item.split("=", 1) for item in settings.split(",") if item)

    workdir = Path(tempfile.mkdtemp(prefix="idle-split-"))
    protoset = write_protoset(workdir / "queue.protoset")
    db = procs.Database(workdir, durable=True)
    db.start()
    report: dict[str, Any] = {"commit": os.popen("git rev-parse --short HEAD").read().strip(), "seconds": args.seconds, "runs": []}
    try:
        for attempt in range(args.repeat):
            for name, env in variants.items():
                result = _variant(db, workdir, protoset, f"{name}_{attempt}", env, args.seconds)
                report["runs"].append({"variant": name, **result})
                print(
                    f"{name:14} empty: service {result['empty']['service_ms_per_s']:5.2f} postgres {result['empty']['postgres_ms_per_s']:5.2f}"
                    f"   in flight: service {result['in_flight']['service_ms_per_s']:5.2f} postgres {result['in_flight']['postgres_ms_per_s']:5.2f}"
                    f"   (ms/s; event loop {result['empty']['service_by_thread_ms_per_s'].get('event loop', 0):.2f} / "
                    f"{result['in_flight']['service_by_thread_ms_per_s'].get('event loop', 0):.2f})",
                    flush=True,
                )
    finally:
        db.stop()
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
