"""`tests.faults.frozen`, the SIGSTOP the fault tests and the machine freeze PostgreSQL backends
with: a backend that exited between being listed and being frozen is left out, and every one it
froze is let go again (the machine once listed a backend that its pool closed a moment later, and
the second SIGSTOP's error left the first backend stopped)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.faults import frozen


def _state(pid: int) -> str:
    # /proc/<pid>/stat: "pid (comm) state ..."; T is stopped.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _settles_in(pid: int, states: set[str]) -> str:
    """The process's state once it is one of `states` (a signal is delivered asynchronously), or
    the last state seen after 10 s."""
    deadline = time.monotonic() + 10
    state = _state(pid)
    while state not in states and time.monotonic() < deadline:
        time.sleep(0.01)
        state = _state(pid)
    return state


def test_a_process_gone_before_the_freeze_is_left_out_and_the_others_are_let_go() -> None:
    gone = subprocess.Popen(["sleep", "30"])
    gone.kill()
    gone.wait()
    alive = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    try:
        with frozen([alive[0].pid, gone.pid, alive[1].pid]) as stopped:
            assert stopped == [alive[0].pid, alive[1].pid]
            assert [_settles_in(p.pid, {"T"}) for p in alive] == ["T", "T"]
        assert "T" not in [_settles_in(p.pid, {"S", "R"}) for p in alive]
    finally:
        for process in alive:
            process.kill()
            process.wait()
