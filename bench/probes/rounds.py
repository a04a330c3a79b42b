"""What the one-off probes share: a scratch PostgreSQL for their rounds, the machine's load to
stand beside each figure, and the JSON report each writes to bench/results/history/."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.procs import Database

RESULTS = Path(__file__).resolve().parents[1] / "results" / "history"


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


@contextlib.contextmanager
def scratch_database(prefix: str, *, durable: bool = True) -> Iterator[tuple[Database, Path]]:
    """A PostgreSQL of its own in a temporary folder, stopped and removed after the rounds."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    db = Database(workdir, durable=durable)
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
