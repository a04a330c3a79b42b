"""Runs the machine: a seeded random sequence of steps (or a recorded one, to replay it) in a fresh
world, stopping at the first broken promise; then shortens a failing sequence to one that still
breaks the same promise (delta debugging: drop chunks of steps while the failure stays), and
writes it as a replay file that tests/machine/test_machine.py runs as a pytest case."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.machine import catalog
from tests.machine.machine import Machine, Step, Violation
from tests.machine.world import MachinePostgres, World

# A guard against a step that hangs (every call has its own deadline; a rolling deploy restarts
# every replica, each start and drain taking seconds, more on a starved machine).
STEP_TIMEOUT = 300.0
QUIESCE_EVERY = 30
# More than this many faults in play at once and the next step heals one.
MOST_FAULTS_AT_ONCE = 2


@dataclasses.dataclass
class RunResult:
    seed: int
    steps: list[Step]
    violations: list[Violation]
    seconds: float
    actions: collections.Counter[str]
    rpcs_driven: collections.Counter[str]
    faults_injected: collections.Counter[str]
    checks: collections.Counter[str]
    codes: collections.Counter[str]
    quiesces: int
    most_passed_over: int = 0
    users: int = 3
    open_finds: list[str] = dataclasses.field(default_factory=list)

    def first(self, invariant: str | None = None) -> Violation | None:
        """The first broken promise not already known to break (KNOWN), or the first of `invariant`."""
        new = [v for v in self.violations if (v.invariant == invariant if invariant else v.invariant not in KNOWN)]
        return new[0] if new else None

    def report(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "seconds": round(self.seconds, 1),
            "steps": len(self.steps),
            "actions": dict(sorted(self.actions.items())),
            "rpcs_driven": dict(sorted(self.rpcs_driven.items())),
            "faults_injected": dict(sorted(self.faults_injected.items())),
            "checks": dict(sorted(self.checks.items())),
            "checks_total": sum(self.checks.values()),
            "quiet_periods": self.quiesces,
            "i13_most_passed_over_by_one_user": self.most_passed_over,
            "answers": dict(sorted(self.codes.items())),
            "violations": [str(v) for v in self.violations],
            "open_finds_met": self.open_finds,
        }


def generate_step(m: Machine, rng: random.Random, since_quiesce: int) -> Step:
    if since_quiesce >= QUIESCE_EVERY:
        return Step("quiesce", {})
    if len(m.model.faults) > MOST_FAULTS_AT_ONCE:
        return Step("heal", {"fault": rng.choice(sorted(m.model.faults))})
    while True:
        candidates = list(catalog.ACTIONS.values())
        chosen = rng.choices(candidates, weights=[a.weight for a in candidates])[0]
        args = chosen.generate(m, rng)
        if args is not None:
            return Step(chosen.name, args)


async def run(
    postgres: MachinePostgres,
    *,
    seed: int,
    seconds: float = 60.0,
    steps: list[Step] | None = None,
    stop_at_first: bool = True,
    stop_on: str | None = None,
    users: int = 3,
    log: bool = False,
) -> RunResult:
    """One run in a fresh world: `steps` replays a recorded sequence; without them, steps are
    drawn from `seed` for `seconds`. Ends with every pause lifted and a last quiet period.
    It stops at the first broken promise not KNOWN (or, with `stop_on`, at the first of that
    promise only: what a shortening looks for)."""

    def should_stop() -> bool:
        if not stop_at_first or machine is None:
            return False
        if stop_on is not None:
            return any(v.invariant == stop_on for v in machine.violations)
        return _new_finds(machine)

    folder = Path(tempfile.mkdtemp(prefix="acurio-machine-"))
    world = World(postgres, folder)
    started = time.monotonic()
    executed: list[Step] = []
    actions: collections.Counter[str] = collections.Counter()
    machine: Machine | None = None
    try:
        await world.start()
        machine = Machine(world, seed, users=users)
        await machine.start()
        rng = random.Random(seed)
        since_quiesce = 0
        planned = list(steps) if steps is not None else None
        while True:
            if planned is not None:
                if not planned:
                    break
                step = planned.pop(0)
            else:
                if time.monotonic() - started > seconds:
                    break
                step = generate_step(machine, rng, since_quiesce)
            machine.step_index = len(executed)
            executed.append(step)
            actions[step.do] += 1
            since_quiesce = 0 if step.do == "quiesce" else since_quiesce + 1
            if log:
                print(f"{time.monotonic() - started:7.1f}s #{machine.step_index} {step.do} {step.args}", flush=True)
            try:
                await asyncio.wait_for(catalog.ACTIONS[step.do].run(machine, step.args), STEP_TIMEOUT)
            except TimeoutError:
                machine.violate("bounded waits", f"step {step.do} {step.args} did not finish within {STEP_TIMEOUT:.0f} s")
            await asyncio.to_thread(machine.check_rows)
            if should_stop():
                break
        if not should_stop():
            machine.step_index = len(executed)
            await _finish(machine)
        most = 0
        if not should_stop():
            most = await asyncio.to_thread(machine.check_fair_order)
        return RunResult(
            seed,
            executed,
            list(machine.violations),
            time.monotonic() - started,
            actions,
            machine.model.rpcs_driven,
            machine.model.faults_injected,
            machine.model.checks,
            machine.model.codes,
            machine.quiesces,
            most,
            users,
            list(machine.open_finds),
        )
    finally:
        if machine is not None:
            await machine.stop()
        await world.stop()
        shutil.rmtree(folder, ignore_errors=True)


# Promises already known to break (QUEUE_MACHINE_KNOWN=I11,I13): a run goes on past them, to
# look for others (exploring an old commit); they are still reported.
KNOWN = {name for name in os.environ.get("QUEUE_MACHINE_KNOWN", "").split(",") if name}


def _new_finds(machine: Machine) -> bool:
    return any(v.invariant not in KNOWN for v in machine.violations)


async def _finish(machine: Machine) -> None:
    """The end of a run: every pause lifted, then a last quiet period and its checks."""
    for user in machine.model.users:
        if user.paused:
            await catalog.ACTIONS["pause"].run(machine, {"fleet": False, "user": user.index, "paused": False, "replica": 0})
    if machine.model.fleet_paused:
        await catalog.ACTIONS["pause"].run(machine, {"fleet": True, "user": 0, "paused": False, "replica": 0})
    await machine.quiesce()
    await asyncio.to_thread(machine.check_rows)


async def reproduces(postgres: MachinePostgres, seed: int, steps: list[Step], invariant: str, tries: int = 1, users: int = 3) -> bool:
    for _ in range(tries):
        result = await run(postgres, seed=seed, steps=steps, stop_on=invariant, users=users)
        if any(v.invariant == invariant for v in result.violations):
            return True
    return False


async def shorten(
    postgres: MachinePostgres, result: RunResult, *, budget_seconds: float, invariant: str | None = None, log: bool = False
) -> list[Step]:
    """Delta debugging over the steps: drops chunks (halves, then quarters, ...) while the same
    promise still breaks, within `budget_seconds`. A replay that does not fail is taken as not
    failing (timing can hide a failure): the result is shorter, never wrong."""
    first = result.first(invariant)
    assert first is not None
    steps = list(result.steps)
    give_up = time.monotonic() + budget_seconds
    chunks = 2
    while len(steps) > 1 and time.monotonic() < give_up:
        size = max(1, len(steps) // chunks)
        removed_any = False
        start = 0
        while start < len(steps) and time.monotonic() < give_up:
            candidate = steps[:start] + steps[start + size :]
            if candidate and await reproduces(postgres, result.seed, candidate, first.invariant, users=result.users):
                steps = candidate
                removed_any = True
                if log:
                    print(f"shortened to {len(steps)} steps", flush=True)
            else:
                start += size
        if not removed_any:
            if size == 1:
                break
            chunks = min(len(steps), chunks * 2)
    return steps


def replay_document(result: RunResult, steps: list[Step], note: str = "", invariant: str | None = None) -> dict[str, Any]:
    first = result.first(invariant)
    return {
        "found": str(first) if first else "",
        "invariant": first.invariant if first else "",
        "seed": result.seed,
        "users": result.users,
        "note": note,
        "steps": [s.as_json() for s in steps],
    }


def write_replay(folder: Path, document: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{document['invariant'].replace(' ', '_').replace('/', '_').lower()}-{document['seed']:x}.json"
    path = folder / name
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return path


def load_steps(document: dict[str, Any]) -> list[Step]:
    return [Step(entry["do"], {k: v for k, v in entry.items() if k != "do"}) for entry in document["steps"]]


# The short mode (the README's test command, CI) replays one fixed draw, so that a red run names a
# change that broke a promise on that path, not a rare crossing found by chance; the long mode
# (run before every stop) draws anew each time, to look for the crossings nobody visited yet.
SHORT_MODE_SEED = 0x5EED0047
SHORT_MODE_UP_TO_SECONDS = 300.0


def seeds_from_environment(count: int, seconds: float = 0.0) -> list[int]:
    if os.environ.get("QUEUE_MACHINE_SEED"):
        return [int(s, 0) for s in os.environ["QUEUE_MACHINE_SEED"].split(",")]
    if seconds <= SHORT_MODE_UP_TO_SECONDS:
        return [SHORT_MODE_SEED + i for i in range(count)]
    return [random.randrange(1 << 32) for _ in range(count)]
