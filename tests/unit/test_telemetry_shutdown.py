"""An unreachable OTLP collector must not hold up a stop: the last flush of spans and metrics at
exit gets `telemetry.SHUTDOWN_BUDGET_SECONDS`, then the exporters are shut down (it took 21-30 s,
which in Kubernetes runs past the grace period into SIGKILL)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from queue_service import telemetry
from queue_service.dev.embedded_postgres import free_port

_PROCESS = """
from queue_service import telemetry
telemetry.configure(service_name="shutdown-test", console_traces=False, metrics_addr="")
with telemetry.tracer.start_as_current_span("one span to flush"):
    telemetry.metrics.admits.add(1, {"outcome": "ok"})
print("configured", flush=True)
"""


def test_exit_with_an_unreachable_collector_takes_the_budget_not_the_exporters_timeouts() -> None:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}", "OTEL_SDK_DISABLED": "false"}
    process = subprocess.Popen([sys.executable, "-c", _PROCESS], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "configured"
        exiting = time.monotonic()  # from here on only the exit runs: the flush at exit
        _, stderr = process.communicate(timeout=60)
        took = time.monotonic() - exiting
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    # The exporters' own shutdown spends up to 10 s per signal on retries.
    assert took < telemetry.SHUTDOWN_BUDGET_SECONDS + 2, f"exit took {took:.1f}s:\n{stderr[-2000:]}"
    assert "dropping it" in stderr
