"""What the machine knows of its run: the users it plays, the jobs each step admitted (by the
label of that step, so a shortened sequence still names the same jobs, or none), the pauses and
capacities it set and when, the faults in play, and what it heard. The checks read it; the
actions write it."""

from __future__ import annotations

import collections
import dataclasses
import time

# A job is named by the step that admitted it: "j12" is the job step 12 admitted.
Label = str


@dataclasses.dataclass
class JobRecord:
    label: Label
    user: int
    key: str
    payload: dict[str, object]
    job_id: str = ""
    run_id: str = ""
    delta: bool = False
    price: int = 0


@dataclasses.dataclass
class UserModel:
    index: int
    user_id: str
    jobs: list[Label] = dataclasses.field(default_factory=list)
    # Keys whose Admit was refused with a reason (I5: no job may have them).
    refused: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    # When she chose free work (a delta at price 0, her own cancel): the only things her
    # free-work limit may count (docs/security.md).
    own_free_work: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (when, job id)
    paused: bool = False
    max_active: int = 1
    granted: int = 0


@dataclasses.dataclass
class Interval:
    start: float
    end: float | None = None

    def covers(self, start: float, end: float) -> bool:
        return self.start < end and (self.end is None or self.end > start)


@dataclasses.dataclass
class Model:
    users: list[UserModel]
    jobs: dict[Label, JobRecord] = dataclasses.field(default_factory=dict)
    # The capacity in force (None: unlimited), and the runs granted before it was last lowered
    # (they may run on above it until they end).
    capacity: int | None = None
    grandfathered_runs: set[str] = dataclasses.field(default_factory=set)
    # A SetCoreCapacity whose outcome is unknown (an error answer, none at all): until the rows
    # show which capacity is in force, the core is held to the looser of the two (`capacity`),
    # and the stricter one it may turn out to be waits here.
    capacity_unsettled: int | None = None
    fleet_paused: bool = False
    # Wall-clock intervals in which a user's releases (or the fleet's) were paused.
    pauses: dict[int, list[Interval]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    fleet_pauses: list[Interval] = dataclasses.field(default_factory=list)
    # Faults in play (name -> since), and when the last one ended (a quiet period follows).
    faults: dict[str, float] = dataclasses.field(default_factory=dict)
    last_fault_end: float = 0.0
    fault_log: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)
    # Limits raised by SetUserQueueLimit, and when (I9 judged against the larger one meanwhile).
    codes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    calls: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    # Every RPC the machine called and every fault it injected, by full name.
    rpcs_driven: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    faults_injected: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    checks: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    # Jobs whose times "an hour passes" moved in the rows behind the service's back (no stream
    # hears of that): their times are not compared (I11).
    time_shifted: set[str] = dataclasses.field(default_factory=set)

    def user_jobs(self, user: int) -> list[JobRecord]:
        return [self.jobs[label] for label in self.users[user].jobs if self.jobs[label].job_id]

    def job_by_id(self, job_id: str) -> JobRecord | None:
        for record in self.jobs.values():
            if record.job_id == job_id:
                return record
        return None

    def quiet_for(self) -> float:
        """How long no fault has been in play (0 while one is)."""
        if self.faults:
            return 0.0
        return time.time() - self.last_fault_end

    def fault_started(self, name: str) -> None:
        self.faults.setdefault(name, time.time())
        self.faults_injected[name] += 1

    def fault_ended(self, name: str) -> None:
        started = self.faults.pop(name, None)
        if started is not None:
            self.last_fault_end = time.time()
            self.fault_log.append((name, started, self.last_fault_end))

    def fault_during(self, prefix: str, start: float, end: float) -> bool:
        """A fault whose name starts with `prefix` was in play at some time in [start, end]."""
        ended = any(n.startswith(prefix) and s < end and e > start for n, s, e in self.fault_log)
        return ended or any(n.startswith(prefix) and s < end for n, s in self.faults.items())

    def paused_during(self, user: int, start: float, end: float) -> bool:
        return any(i.covers(start, end) for i in self.pauses[user]) or any(i.covers(start, end) for i in self.fleet_pauses)
