"""The test suite's own PostgreSQL does not outlive a run that is killed with SIGTERM."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import REPO_ROOT

_WAITING_TEST = """
import time

def test_waits(postgres):
    print("POSTGRES-UP", postgres.embedded.data_dir, flush=True)
    time.sleep(120)
"""


@pytest.mark.skipif(bool(os.environ.get("TEST_DATABASE_URL")), reason="runs only with the embedded PostgreSQL")
def test_a_run_killed_with_sigterm_stops_its_embedded_postgres(tmp_path: Path) -> None:
    """A pytest run using the embedded PostgreSQL gets SIGTERM mid-test: its server is stopped
    and its temp folder removed, and the run ends within seconds."""
    (tmp_path / "test_waiting.py").write_text(_WAITING_TEST)
    (tmp_path / "conftest.py").write_text("from tests.conftest import postgres  # noqa: F401\\n")
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "QUEUE_TEST_USE_DOCKER": "never"}
    env.pop("TEST_DATABASE_URL", None)
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_waiting.py"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert run.stdout is not None
        output = []
        for line in run.stdout:
            output.append(line)
            if "POSTGRES-UP" in line:
                break
        else:
            raise AssertionError("the run never got its PostgreSQL: " + "".join(output))
        data_dir = Path(line.split("POSTGRES-UP", 1)[1].strip())
        assert data_dir.parent.name.startswith("acurio-queue-test-pg-"), data_dir
        postmaster = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    try:
        assert not data_dir.parent.exists(), f"the run left {data_dir.parent} behind"
        for _ in range(100):
            try:
                os.kill(postmaster, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the run's PostgreSQL (pid {postmaster}) outlived it")
    finally:  # what a failing run leaked is not left behind by this test
        if data_dir.parent.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGINT)
            time.sleep(1)
            shutil.rmtree(data_dir.parent, ignore_errors=True)
