"""The idle replica: what a replica costs when nobody calls it. A replica and a manual dev core on a fresh database,
metered for `idle_seconds` twice: with no job at all, then with work in flight but nothing due
(users with one job released and held RUNNING and one QUEUED behind it). Nothing calls the
service, so every CPU second here is the replica's own polling: its release dispatcher, its
sweeper (every 30 s, as deployed), its LISTEN connection. The dispatcher once read "nothing
PENDING" as "due now" and spun a claim and a due-time query back to back on every replica.

Each phase is metered once PostgreSQL's own housekeeping after the earlier scenarios has settled:
every database vacuumed and analyzed by the bench itself, then no autovacuum worker running for a
second. An autovacuum of another scenario's tables is not the idle replica's cost, and once took
20-30 ms/s of a phase (50 ms/s in a full run of 2026-12-03: the history table's). PostgreSQL's CPU is also reported by
process kind (`postgres_by_process`), so what a phase cost the database is visible.
"""

from __future__ import annotations

import time
from typing import Any

from bench import dbsetup, statements
from bench.context import Context
from bench.ghz import ADMIT, admit_data
from bench.measure import CpuMeter

_USERS_IN_FLIGHT = 50


def run(ctx: Context) -> dict[str, Any]:
    dsn = ctx.database("s8_idle")
    prefix = "s8-u"
    dbsetup.grant_credits(dsn, prefix, _USERS_IN_FLIGHT, 2)
    with ctx.stack(dsn, "s8_idle") as stack:
        time.sleep(1.0)  # past start-up: pools opened, first passes made
        empty = _metered(ctx, dsn, stack.cpu_roots(), ctx.sizes.idle_seconds)
        admitted = ctx.ghz(stack.address, ADMIT, admit_data(prefix, _USERS_IN_FLIGHT, "idle"), concurrency=4, total=2 * _USERS_IN_FLIGHT)
        if admitted.ok != 2 * _USERS_IN_FLIGHT:
            raise RuntimeError(f"s8_idle: only {admitted.ok}/{2 * _USERS_IN_FLIGHT} admits succeeded: {admitted.errors}")
        counts = dbsetup.wait_for(dsn, prefix, lambda c: c.get("running", 0) == _USERS_IN_FLIGHT, timeout=30)
        if counts.get("running", 0) != _USERS_IN_FLIGHT:
            raise RuntimeError(f"s8_idle: first jobs not all running: {counts}")
        in_flight = _metered(ctx, dsn, stack.cpu_roots(), ctx.sizes.idle_seconds)
    return {"idle_seconds": ctx.sizes.idle_seconds, "empty": empty, "in_flight": {**in_flight, "jobs": counts}}


def _metered(ctx: Context, dsn: str, roots: dict[str, int], seconds: float) -> dict[str, Any]:
    vacuumed = _vacuum_every_database(ctx)
    waited = _wait_for_settled_postgres(ctx.db.dsn)
    by_process = statements.PostgresCpuByProcess(ctx.db.dsn, dsn.rsplit("/", 1)[-1], ctx.db.pid).start()
    meter = CpuMeter(roots).start()
    time.sleep(seconds)
    cpu = meter.stop()
    postgres = by_process.stop()
    cpu.pop("system", None)
    return {
        "cpu_ms_per_second": {name: round(value * 1000 / seconds, 2) for name, value in cpu.items()},
        "postgres_by_process_ms_per_second": {kind: round(value * 1000 / seconds, 2) for kind, value in postgres.items()},
        "vacuumed_seconds": vacuumed,
        "waited_for_autovacuum_seconds": waited,
    }


def _vacuum_every_database(ctx: Context) -> float:
    """VACUUM ANALYZE of every database on the server (the earlier scenarios', and this one's
    after its admits), so the autovacuum launcher finds nothing to do while a phase is metered;
    the seconds it took. Waiting for a quiet second alone does not do it: in a full run the
    history table (1M rows, every index) was vacuumed after the sweeper scenario's writes, 0.4-0.6 s
    of CPU, inside an idle window (bench/results/history/2026-12-03-idle-and-completion-notebook.md)."""
    started = time.monotonic()
    with dbsetup.connect(ctx.db.dsn) as conn:
        names = [row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate")]
    for name in names:
        with dbsetup.connect(ctx.db.embedded.dsn(name)) as conn:
            conn.execute("VACUUM ANALYZE")
    return round(time.monotonic() - started, 1)


def _wait_for_settled_postgres(admin_dsn: str, timeout: float = 90.0) -> float:
    """Waits until no autovacuum worker has run for a second (at most `timeout`); the seconds waited."""
    started = time.monotonic()
    quiet_since: float | None = None
    with dbsetup.connect(admin_dsn) as conn:
        while time.monotonic() - started < timeout:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'").fetchone()
            now = time.monotonic()
            if row is not None and row[0] == 0:
                quiet_since = quiet_since if quiet_since is not None else now
                if now - quiet_since >= 1.0:
                    break
            else:
                quiet_since = None
            time.sleep(0.1)
    return round(time.monotonic() - started, 1)
