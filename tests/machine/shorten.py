"""Shortens a recorded failing sequence (a replay file) to one that still breaks the same promise,
and writes it beside the original (or to --out):

    .venv/bin/python -m tests.machine.shorten tests/machine/replays/new/i12-1a2b.json --seconds 900
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path

from tests.machine import machine, runner
from tests.machine.world import MachinePostgres


async def shorten_file(postgres: MachinePostgres, path: Path, seconds: float, out: Path | None) -> Path:
    document = json.loads(path.read_text())
    steps = runner.load_steps(document)
    invariant = document["invariant"]
    result = await runner.run(postgres, seed=document["seed"], steps=steps, stop_on=invariant, users=document.get("users", 3))
    first = result.first(invariant)
    if first is None:
        raise SystemExit(f"{path.name}: the recorded steps did not break {invariant} this time ({result.violations[:3]}); run again")
    print(f"{path.name}: {first}; shortening {len(result.steps)} steps for up to {seconds:.0f} s", flush=True)
    shorter = await runner.shorten(postgres, result, budget_seconds=seconds, invariant=invariant, log=True)
    shortened = runner.replay_document(result, shorter, note=document.get("note", ""), invariant=invariant)
    target = out or path.with_name(path.stem + "-short.json")
    target.write_text(json.dumps(shortened, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(shorter)} steps written to {target}", flush=True)
    return target


def main() -> None:
    machine.TOLERATE_OPEN_FINDS = False  # an open find is what is being shortened
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replay", type=Path)
    parser.add_argument("--seconds", type=float, default=600.0, help="how long to keep shortening (default 600)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the shorter replay (default: beside it, -short)")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="acurio-machine-pg-"))
    postgres = MachinePostgres(folder)
    postgres.start()
    try:
        asyncio.run(shorten_file(postgres, options.replay, options.seconds, options.out))
    finally:
        postgres.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
