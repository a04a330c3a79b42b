"""The invariant machine (docs/design.md, "The invariant machine"): every RPC of every role
through every fault, every promise checked as it goes.

- `test_machine`: a seeded random run, QUEUE_MACHINE_SECONDS long (default 90 s: the short mode
  of the README's test command). A failing run prints its seed, shortens its steps to a sequence
  that still fails (QUEUE_MACHINE_SHRINK_SECONDS, default 0 in the short mode) and writes it to
  QUEUE_MACHINE_REPLAY_DIR (default tests/machine/replays/new), replayable as a test.
  The long mode: `QUEUE_MACHINE_SECONDS=1800 QUEUE_MACHINE_SHRINK_SECONDS=900 .venv/bin/pytest tests/machine -k test_machine -s`.
- `test_replay[...]`: every replay file in tests/machine/replays/ (the real finds) runs as its own
  case and must break no promise.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.machine import runner
from tests.machine.world import MachinePostgres

pytestmark = pytest.mark.machine

SECONDS = float(os.environ.get("QUEUE_MACHINE_SECONDS", "90"))
SHRINK_SECONDS = float(os.environ.get("QUEUE_MACHINE_SHRINK_SECONDS", "0"))
REPLAYS = Path(__file__).parent / "replays"
NEW_REPLAYS = Path(os.environ.get("QUEUE_MACHINE_REPLAY_DIR", REPLAYS / "new"))
LOG = bool(os.environ.get("QUEUE_MACHINE_TRACE"))


@pytest.fixture(scope="module")
def machine_postgres() -> Iterator[MachinePostgres]:
    folder = Path(tempfile.mkdtemp(prefix="acurio-machine-pg-"))
    postgres = MachinePostgres(folder)
    postgres.start()
    try:
        yield postgres
    finally:
        postgres.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(SECONDS + SHRINK_SECONDS + 600)
async def test_machine(machine_postgres: MachinePostgres) -> None:
    (seed,) = runner.seeds_from_environment(1, SECONDS)
    print(f"\nmachine seed {seed:#x} (QUEUE_MACHINE_SEED={seed:#x} replays the draw)", flush=True)
    result = await runner.run(machine_postgres, seed=seed, seconds=SECONDS, log=LOG)
    report = result.report()
    print("machine summary:", json.dumps(report, indent=1), flush=True)
    if os.environ.get("QUEUE_MACHINE_REPORT"):
        Path(os.environ["QUEUE_MACHINE_REPORT"]).write_text(json.dumps(report, indent=1))
    if result.violations:
        steps = result.steps
        if SHRINK_SECONDS > 0:
            steps = await runner.shorten(machine_postgres, result, budget_seconds=SHRINK_SECONDS, log=LOG)
        document = runner.replay_document(result, steps)
        path = runner.write_replay(NEW_REPLAYS, document)
        print(f"replay ({len(steps)} of {len(result.steps)} steps) written to {path}:")
        print(json.dumps(document["steps"], ensure_ascii=False)[:20000])
    assert not result.violations, "\n".join(str(v) for v in result.violations[:20])
    # The run did what it is for: it drove calls and faults and checked promises.
    assert sum(result.rpcs_driven.values()) > 20 and sum(result.faults_injected.values()) > 0
    assert result.checks["rows"] > 0 and result.checks["I10"] > 0 and result.checks["I11"] > 0


def _replays() -> list[Path]:
    return sorted(REPLAYS.glob("*.json"))


@pytest.mark.parametrize("path", _replays(), ids=lambda p: p.stem)
@pytest.mark.timeout(900)
async def test_replay(machine_postgres: MachinePostgres, path: Path) -> None:
    document = json.loads(path.read_text())
    steps = runner.load_steps(document)
    result = await runner.run(machine_postgres, seed=document["seed"], steps=steps, users=document.get("users", 3), log=LOG)
    assert not result.violations, f"{path.name} ({document['found']}):\n" + "\n".join(str(v) for v in result.violations[:20])
