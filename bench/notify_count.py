"""Counts the notifications PostgreSQL delivers on the queue's channels while a scenario runs:
`analysis_job_changes`, which the job table's trigger notified from every job-changing commit
before the job-change feed, and `analysis_job_feed`, the feed's wake-up hints (each one NOTIFY in
a transaction of its own, outside the job-changing commits). A thread LISTENs on its own
connection, as a replica's listener would, so the count is what every replica receives.

A notification is one per changed job (a statement that changes several jobs, such as a batch
of completions, sends several from one commit), so for the trigger's channel it counts
notifying changes, an upper bound of notifying commits; a hint is exactly one commit.
"""

from __future__ import annotations

import threading
from collections import Counter
from types import TracebackType

import psycopg

CHANNELS = ("analysis_job_changes", "analysis_job_feed")


class NotifyCounter:
    def __init__(self, dsn: str) -> None:
        self._conn = psycopg.connect(dsn, autocommit=True)
        for channel in CHANNELS:
            self._conn.execute(f"LISTEN {channel}")
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify-counter", daemon=True)

    def _run(self) -> None:
        while not self._stopping.is_set():
            for notice in self._conn.notifies(timeout=0.2):
                with self._lock:
                    self._counts[notice.channel] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {channel: self._counts.get(channel, 0) for channel in CHANNELS}

    def __enter__(self) -> NotifyCounter:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._conn.close()


def per_job(before: dict[str, int], after: dict[str, int], jobs: int) -> dict[str, float]:
    """Notifications per job on each channel between two counts."""
    return {
        "job_change_notices_per_job": round((after["analysis_job_changes"] - before["analysis_job_changes"]) / max(1, jobs), 3),
        "feed_hints_per_job": round((after["analysis_job_feed"] - before["analysis_job_feed"]) / max(1, jobs), 3),
    }
