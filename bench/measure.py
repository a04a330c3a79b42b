"""What the bench measures about processes and latencies: CPU seconds of a process tree, peak RSS,
latency percentiles and ratios against a floor.

CPU is read from /proc, not from psutil, so the bench needs nothing beyond the service's venv.
A process tree's CPU is utime+stime of the root and every live descendant, plus cutime+cstime of
each (the CPU of children that already exited and were reaped): PostgreSQL's backends come and
go, and a reaped backend's CPU lands in the postmaster's cutime.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may hold spaces and parentheses; the fields start after the last ')'.
    return text[text.rfind(")") + 2 :].split()


def own_cpu_ticks(pid: int) -> int:
    """utime + stime of one process (fields 14-15 of stat(5)), in clock ticks; 0 once it is gone."""
    fields = _stat_fields(pid)
    return 0 if fields is None else int(fields[11]) + int(fields[12])


def reaped_children_cpu_ticks(pid: int) -> int:
    """cutime + cstime (fields 16-17): the CPU of the children it has reaped, in clock ticks."""
    fields = _stat_fields(pid)
    return 0 if fields is None else int(fields[13]) + int(fields[14])


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def process_tree(root_pid: int) -> list[int]:
    """The root and all its live descendants."""
    children = _children_by_parent()
    tree, frontier = [], [root_pid]
    while frontier:
        pid = frontier.pop()
        tree.append(pid)
        frontier.extend(children.get(pid, []))
    return tree


def tree_cpu_seconds(root_pid: int) -> float:
    total_ticks = 0
    for pid in process_tree(root_pid):
        fields = _stat_fields(pid)
        if fields is not None:
            # utime, stime, cutime, cstime are fields 14..17 of stat(5); index 11..14 here.
            total_ticks += sum(int(value) for value in fields[11:15])
    return total_ticks / CLOCK_TICKS


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM: the process's peak resident set size since it started."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        return None
    return None


def system_busy_seconds() -> float:
    """CPU time the whole machine spent busy (all cores), from the first line of /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


class CpuMeter:
    """CPU seconds spent by named process trees between `start` and `stop`, plus "system": the
    whole machine's busy CPU over the same time (see `unattributed_cpu`)."""

    def __init__(self, roots: Mapping[str, int]) -> None:
        self._roots = dict(roots)
        self._before: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    def start(self) -> CpuMeter:
        self._before = {name: tree_cpu_seconds(pid) for name, pid in self._roots.items()}
        self._before["system"] = system_busy_seconds()
        return self

    def stop(self) -> dict[str, float]:
        self.seconds = {name: tree_cpu_seconds(pid) - self._before[name] for name, pid in self._roots.items()}
        self.seconds["system"] = system_busy_seconds() - self._before["system"]
        return self.seconds


def unattributed_cpu(cpu_seconds: Mapping[str, float]) -> float:
    """Machine CPU not spent by any measured process: other programs on the box (a neighbour's
    test run skews every figure), kernel threads and interrupts. Near zero on a quiet machine."""
    return cpu_seconds.get("system", 0.0) - sum(v for k, v in cpu_seconds.items() if k != "system")


@dataclasses.dataclass(frozen=True)
class Latency:
    """Latency percentiles in milliseconds (nearest-rank)."""

    count: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    @classmethod
    def from_seconds(cls, samples: Iterable[float]) -> Latency:
        ordered = sorted(samples)
        if not ordered:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan)

        def rank(q: float) -> float:
            return ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000

        return cls(len(ordered), rank(0.50), rank(0.90), rank(0.99), ordered[-1] * 1000, sum(ordered) / len(ordered) * 1000)

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def ratio(value: float | None, floor: float | None) -> float | None:
    if value is None or floor is None or floor == 0 or math.isnan(value) or math.isnan(floor):
        return None
    return round(value / floor, 2)
