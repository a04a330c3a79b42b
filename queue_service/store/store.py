"""The store: the only code that runs SQL. One typed method per named query of `sql/queries.sql`.

`Store.statements()` yields `Statements` on a pooled connection in autocommit mode (each
statement its own transaction). The locked sections (`Store.admit_job`, `end_job`, `end_run`,
`end_runs`, `promote`, `settle_job_run`, `refund_failed_job`) each run as one statement holding
the user's queue lock (`locks`), `grant_capacity` the fleet-wide capacity lock. Methods take and
return model types (`queue_service.model`), built from rows in `rows.py`; no cursor, row or
connection leaves this package. Driver errors become domain errors in `pool.translated_errors`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import cache
from importlib import resources
from typing import Any, overload

import psycopg
from psycopg import AsyncConnection, AsyncCursor, sql
from psycopg.types.json import Jsonb

from queue_service import audit, deadline, errors
from queue_service.model import (
    PAUSED_USERS_NAMED_AT_MOST,
    AdmitLimits,
    AdmitState,
    AdmittedJob,
    Adoption,
    AuditEvent,
    AuditQuery,
    CapacityGrant,
    CapacityState,
    Cause,
    ClaimedReconciliation,
    ClaimedRelease,
    ClaimedReservation,
    ClaimedSettlement,
    CoreHealthReport,
    CoreRun,
    DatabaseIdentity,
    ExpiredRelease,
    GrantOutcome,
    JobEnding,
    JobInputs,
    JobInputsSearch,
    JobRef,
    JobSearch,
    JobStatus,
    JobView,
    LedgerEntry,
    LedgerKind,
    LedgerQuery,
    LiveJobFilter,
    LostRun,
    NewJob,
    Overview,
    PauseInForce,
    Promoted,
    PromotionLimits,
    QueueMinute,
    ReplicaReport,
    ReplicationStance,
    RunCompletion,
    RunFate,
    RunReportToApply,
    RunSettlement,
    ScheduledRetry,
    SettingChange,
    Transition,
    UnlistedRun,
    UserSettings,
    UserWork,
)
from queue_service.store import migrations, notices
from queue_service.store import rows as from_row
from queue_service.store.feed import HINT_CHANNEL, CommitHints, FeedCursor, FeedRead
from queue_service.store.locks import (
    capacity_section,
    holding_capacity_lock,
    holding_user_queue_lock,
    locked_section,
    locked_section_of_run,
    locked_sections_of_runs,
    locked_sections_of_runs_then_grant,
    take_user_queue_lock,
)
from queue_service.store.pool import QueuePool, connection, connection_parameters, translated_errors
from queue_service.store.rows import sources_of_json, sources_to_json

log = logging.getLogger(__name__)

_NEW_JOB_FIELDS = tuple(field.name for field in dataclasses.fields(NewJob))
# A delta names its base by this foreign key: the pruner may delete the base as the delta commits.
_DELTA_BASE_REFERENCE = "analysis_jobs_delta_of_job_id_fkey"

_BLOCK = re.compile(r"^-- name: (?P<name>\w+)\n(?P<body>.*?)(?=^-- name: |\Z)", re.MULTILINE | re.DOTALL)
_INCLUDE = re.compile(r"^-- include: (?P<name>\w+)$", re.MULTILINE)

Row = dict[str, Any]

# Announced by the trigger of migrations 0001-0013 (since 0013, on every change a job's view
# shows); since migration 0015 the trigger writes the job-change feed instead (store/feed.py),
# and nothing notifies here.
JOB_CHANGES_CHANNEL = "analysis_job_changes"


@cache
def queries() -> dict[str, str]:
    """The named queries, loaded once, without their leading description comments (so a span
    or a log of the statement starts with its verb)."""
    text = resources.files("queue_service.store").joinpath("sql/queries.sql").read_text()
    bodies = {m["name"]: _without_leading_comments(m["body"]) for m in _BLOCK.finditer(text)}
    return {name: _INCLUDE.sub(lambda m: bodies[m["name"]].removesuffix(";"), body) for name, body in bodies.items()}


@cache
def _statement(name: str) -> sql.SQL:
    # The file ships with the package: its text is as trusted as a literal in this module.
    return sql.SQL(queries()[name])


def _without_leading_comments(body: str) -> str:
    lines = body.strip().splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    return "\n".join(lines).strip()


def _statuses(statuses: Iterable[JobStatus]) -> list[str]:
    return sorted(str(status) for status in statuses)


def _inputs_params(inputs: JobInputsSearch) -> Row:
    return {"document_uri_prefix": inputs.document_uri_prefix, "title_words": inputs.title_words, "source_doi": inputs.source_doi}


def job_search_statement(search: JobSearch, *, limit: int) -> tuple[str, Row]:
    """The named query a search runs and its parameters: the shape whose index fits the filter, a
    search in what jobs judge (a DOI, a uri prefix, title words: the most selective first), one
    user, one status, or all. (The query-plan test and the bench's EXPLAIN bind through it too.)"""
    params: Row = {
        **dataclasses.asdict(search),
        **_inputs_params(search.inputs),
        "statuses": _statuses(search.statuses),
        "limit": limit,
    }
    inputs = search.inputs
    for driving, shape in (
        ("source_doi", "search_job_views_by_source_doi"),
        ("document_uri_prefix", "search_job_views_by_document_uri"),
        ("title_words", "search_job_views_by_title_words"),
    ):
        if getattr(inputs, driving):
            # The other search fields narrow the shape's matches; its own is its index's condition.
            also = {f"also_{name}": value for name, value in _inputs_params(inputs).items() if name != driving}
            return shape, {**params, f"also_{driving}": "", **also}
    if search.user_id:
        return "search_job_views_of_user", params
    if len(search.statuses) == 1:
        return "search_job_views_in_status", {**params, "status": str(search.statuses[0])}
    return "search_job_views", params


def _limit_params(limits: PromotionLimits) -> Row:
    return {
        "default_max_active": limits.default_max_active,
        "release_window_seconds": float(limits.release_window_seconds),
        "release_lease_seconds": float(limits.release_lease_seconds),
    }


def _ending_params(transition: Transition, actor: str, limits: PromotionLimits) -> Row:
    """The parameters every ending section takes from its transition."""
    return {
        "status": str(transition.to),
        "last_error": transition.last_error,
        "refund": transition.refund,
        "actor": actor,
        "reason": str(transition.cause),
        **_limit_params(limits),
    }


def _ending(rows: list[Row], transition: Transition, actor: str) -> JobEnding:
    """The JobEnding of a section's rows: its 'ended' row first, then 'promoted' rows."""
    row = rows[0]
    assert row["row_kind"] == "ended", row["row_kind"]
    view = from_row.job_view(row)
    ref = from_row.view_ref(view, row)
    refunded = int(row["refunded_amount"])
    if refunded:
        audit.log_movement(
            kind=LedgerKind.REFUND, user_id=ref.user_id, amount=refunded, job_id=ref.job_id, actor=actor, reason=transition.refund_cause
        )
    return JobEnding(ref, view, refunded, from_row.promoted(rows))


def _end_runs_params(reports: Sequence[RunReportToApply], limits: PromotionLimits) -> Row:
    return {
        "run_ids": [report.run_id for report in reports],
        "statuses": [str(report.transition.to) for report in reports],
        "last_errors": [report.transition.last_error for report in reports],
        "refunds": [report.transition.refund for report in reports],
        "actors": [report.actor for report in reports],
        "reasons": [str(report.transition.cause) for report in reports],
        **_limit_params(limits),
    }


def _run_completions(rows: list[Row], reports: Sequence[RunReportToApply]) -> list[RunCompletion]:
    """The completions of `end_runs`' rows, in the reports' order."""
    rows_of: dict[int, list[Row]] = {index: [] for index in range(1, len(reports) + 1)}
    for row in rows:
        rows_of[row["batch_index"]].append(row)
    return [_run_completion(rows_of[index], report.transition, report.actor) for index, report in enumerate(reports, start=1)]


def _run_completion(rows: list[Row], transition: Transition, actor: str) -> RunCompletion:
    """A run's completion from its section's rows (`queue_end_run_viewed`)."""
    kind = rows[0]["row_kind"]
    if kind in ("reserved", "unknown"):
        return RunCompletion(None, reserved=kind == "reserved")
    if kind == "ended":
        ending = _ending(rows, transition, actor)
        return RunCompletion(ending.ref, view=ending.view, ending=ending)
    view = from_row.job_view(rows[0])
    return RunCompletion(from_row.view_ref(view, rows[0]), view=view)


class Statements:
    """The named queries, run on one connection that the store opened."""

    def __init__(self, conn: AsyncConnection[Row], committed: Callable[[], None] = lambda: None) -> None:
        self._conn = conn
        # Told after a statement that changed jobs has committed (the job-change feed's hints).
        self._committed = committed

    async def _send(self, name: str, params: Row) -> AsyncCursor[Row]:
        return await self._conn.execute(_statement(name), params)

    async def _all(self, name: str, params: Row) -> list[Row]:
        cursor = await self._send(name, params)
        return await cursor.fetchall()

    async def _one(self, name: str, params: Row) -> Row | None:
        rows = await self._all(name, params)
        return rows[0] if rows else None

    async def _views(self, name: str, params: Row) -> list[JobView]:
        return [from_row.job_view(row) for row in await self._all(name, params)]

    # -- admit ---------------------------------------------------------------------------------

    async def reserve_run_and_read_admit_state(
        self,
        *,
        run_id: uuid.UUID,
        user_id: str,
        idempotency_key: str,
        delta_of_job_id: uuid.UUID | None,
        grace_seconds: float,
        max_free_admits: int,
    ) -> tuple[bool, AdmitState]:
        """Reserves the run for this admit and reads what the admit checks, in one statement.
        Returns whether the run was reserved (False: the key already has a job) and the state."""
        row = await self._one(
            "reserve_run_and_read_admit_state",
            {
                "run_id": run_id,
                "user_id": user_id,
                "idempotency_key": idempotency_key,
                "delta_of_job_id": delta_of_job_id,
                "grace_seconds": float(grace_seconds),
                "max_free_admits": max_free_admits,
            },
        )
        assert row is not None
        return bool(row["reserved"]), from_row.admit_state(row)

    async def admit_state(
        self, *, user_id: str, idempotency_key: str, delta_of_job_id: uuid.UUID | None, max_free_admits: int
    ) -> AdmitState:
        row = await self._one(
            "admit_state",
            {
                "user_id": user_id,
                "idempotency_key": idempotency_key,
                "delta_of_job_id": delta_of_job_id,
                "max_free_admits": max_free_admits,
            },
        )
        assert row is not None
        return from_row.admit_state(row)

    # -- promotion and ending ------------------------------------------------------------------

    # -- settling runs and reservations --------------------------------------------------------

    async def claim_due_run_settlements(self, *, lease_seconds: float, batch_size: int) -> list[ClaimedSettlement]:
        rows = await self._all("claim_due_run_settlements", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
        return [from_row.claimed_settlement(r) for r in rows]

    async def claim_run_reservation(self, *, run_id: uuid.UUID, lease_seconds: float) -> ClaimedReservation | None:
        row = await self._one("claim_run_reservation", {"run_id": run_id, "lease_seconds": float(lease_seconds)})
        return None if row is None else from_row.claimed_reservation(row)

    async def claim_due_run_reservations(self, *, lease_seconds: float, batch_size: int) -> list[ClaimedReservation]:
        rows = await self._all("claim_due_run_reservations", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
        return [from_row.claimed_reservation(r) for r in rows]

    async def drop_run_reservation(self, *, run_id: uuid.UUID) -> None:
        await self._send("drop_run_reservation", {"run_id": run_id})

    async def settle_run_reservation(self, *, run_id: uuid.UUID) -> None:
        """Remembers a failed admit's run, confirmed settled at the core, as abandoned."""
        await self._send("settle_run_reservation", {"run_id": run_id})

    async def reservation_of_an_earlier_timeline(self, *, run_id: uuid.UUID) -> bool:
        row = await self._one("reservation_of_an_earlier_timeline", {"run_id": run_id})
        return bool(row and row["earlier"])

    async def run_abandoned(self, *, run_id: uuid.UUID) -> bool:
        """Whether the run was a failed admit's, confirmed settled: never to be adopted."""
        row = await self._one("run_abandoned", {"run_id": run_id})
        return bool(row and row["abandoned"])

    async def prune_ended_job_inputs(self, *, retention_seconds: float, batch_size: int) -> int:
        """Empties the full sources of up to `batch_size` jobs ended before the retention; how many."""
        cursor = await self._send("prune_ended_job_inputs", {"retention_seconds": float(retention_seconds), "batch_size": batch_size})
        return max(0, cursor.rowcount)

    async def prune_ended_jobs(self, *, retention_seconds: float, batch_size: int) -> int:
        """Deletes up to `batch_size` jobs ended before the retention; how many."""
        row = await self._one("prune_ended_jobs", {"retention_seconds": float(retention_seconds), "batch_size": batch_size})
        return int(row["pruned"]) if row else 0

    async def forget_abandoned_runs(self, *, retention_seconds: float, batch_size: int) -> int:
        cursor = await self._send("forget_abandoned_runs", {"retention_seconds": retention_seconds, "batch_size": batch_size})
        return max(0, cursor.rowcount)

    # -- the core's runs as the second copy (engine/core_reconciliation.py) ---------------------

    async def runs_unknown_to_queue(self, *, run_ids: Sequence[uuid.UUID], judging_first_pass: Sequence[uuid.UUID] = ()) -> set[uuid.UUID]:
        """Of these runs, those no job owns and no admit has reserved; of `judging_first_pass`
        (first-pass runs the core judges), those no job owns, reserved or not."""
        params = {"run_ids": list(run_ids), "judging_first_pass": list(judging_first_pass)}
        return {row["run_id"] for row in await self._all("runs_unknown_to_queue", params)}

    async def database_clock(self) -> dt.datetime:
        """The database's clock now (what a listing of the core's runs is fenced with)."""
        row = await self._one("database_clock", {})
        assert row is not None
        now: dt.datetime = row["now"]
        return now

    async def jobs_with_runs_not_listed(
        self, *, run_ids: Sequence[uuid.UUID], listed_after: dt.datetime, batch_size: int
    ) -> list[UnlistedRun]:
        """Active jobs admitted before `listed_after` whose run is not among `run_ids` (the core's
        live runs as listed from then on), oldest first."""
        params = {"run_ids": list(run_ids), "listed_after": listed_after, "batch_size": batch_size}
        return [
            UnlistedRun(row["job_id"], row["user_id"], row["run_id"], JobStatus(row["status"]), int(row["release_attempts"]))
            for row in await self._all("jobs_with_runs_not_listed", params)
        ]

    async def run_to_probe_at_the_core(self) -> uuid.UUID | None:
        """One active job's run the core must know (None without active jobs)."""
        row = await self._one("run_to_probe_at_the_core", {})
        return None if row is None else row["run_id"]

    async def runs_taking_a_slot(self, *, run_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Of these judging runs, those that take their user's slot as far as the queue can tell
        (their job holds it, or no job owns them, whatever their reservation)."""
        return {row["run_id"] for row in await self._all("runs_taking_a_slot", {"run_ids": list(run_ids)})}

    async def user_slot_limit(self, *, user_id: str, default_max_active: int) -> int:
        """The user's first-pass limit (her own, or the default)."""
        row = await self._one("user_slot_limit", {"user_id": user_id, "default_max_active": default_max_active})
        assert row is not None
        return int(row["max_active"])

    async def record_lost_run(self, lost: LostRun) -> bool:
        """Records a run reconciliation could not adopt; False when it was recorded before."""
        return await self._one("record_lost_run", dataclasses.asdict(lost)) is not None

    async def reconcile_running_jobs_now(self) -> int:
        """Makes every RUNNING job due for reconciliation with the core now; how many."""
        row = await self._one("reconcile_running_jobs_now", {})
        return 0 if row is None else int(row["jobs"])

    async def database_identity(self) -> DatabaseIdentity:
        """The database's system identifier and timeline (None where the role may not read them)."""
        try:
            row = await self._one("database_identity", {})
        except psycopg.errors.InsufficientPrivilege:
            return DatabaseIdentity(None, None)
        assert row is not None
        return from_row.database_identity(row)

    async def commit_probe_reading_identity(self) -> DatabaseIdentity | None:
        """Health's durable write, with the database's identity read on the way; None (and the
        write made alone) where the role may not read the identity."""
        try:
            row = await self._one("commit_probe_reading_identity", {})
        except psycopg.errors.InsufficientPrivilege:
            await self._send("commit_probe", {})
            return None
        assert row is not None
        return from_row.database_identity(row)

    async def history_reconciled(self) -> bool:
        """Whether the history the primary writes now has been reconciled with the core's runs
        (False where the role may not read the database's identity: the function checks)."""
        row = await self._one("history_reconciled", {})
        return row is not None and bool(row["reconciled"])

    async def record_reconciled_history(self, identity: DatabaseIdentity) -> bool:
        """Records that a reconciliation went through whole on `identity`, if the database still
        writes that history; whether it is recorded now."""
        params = {"system_identifier": identity.system_identifier, "timeline_id": identity.timeline_id}
        row = await self._one("record_reconciled_history", params)
        return row is not None and bool(row["recorded"])

    # -- jobs and runs -------------------------------------------------------------------------

    async def job_by_id(self, *, job_id: uuid.UUID) -> JobRef | None:
        row = await self._one("job_by_id", {"job_id": job_id})
        return None if row is None else from_row.job_ref(row)

    async def waiting_jobs_to_cancel(self, *, batch_size: int) -> list[tuple[uuid.UUID, str]]:
        """Jobs waiting for capacity whose user's cancel is recorded: (job, user) each."""
        rows = await self._all("waiting_jobs_to_cancel", {"batch_size": batch_size})
        return [(row["job_id"], str(row["user_id"])) for row in rows]

    async def record_cancel_request(self, *, job_id: uuid.UUID, cancel_recheck_seconds: float) -> bool:
        """Records that the caller (`audit`: the current actor, kept as `canceled_by`) asked to
        cancel the job (a RUNNING one is reconciled, so asked to cancel again, after
        `cancel_recheck_seconds`); False when it is no longer PENDING or RUNNING (fenced)."""
        params = {"job_id": job_id, "cancel_recheck_seconds": float(cancel_recheck_seconds), "actor": audit.actor_for(Cause.CANCEL)}
        return await self._one("record_cancel_request", params) is not None

    # -- releases ------------------------------------------------------------------------------

    async def claim_due_releases(self, *, lease_seconds: float, batch_size: int) -> list[ClaimedRelease]:
        rows = await self._all("claim_due_releases", {"lease_seconds": float(lease_seconds), "batch_size": batch_size})
        if rows:
            self._committed()
        return [from_row.claimed_release(row) for row in rows]

    async def claim_release_of_job(self, *, job_id: uuid.UUID, lease_seconds: float) -> ClaimedRelease | None:
        row = await self._one("claim_release_of_job", {"job_id": job_id, "lease_seconds": float(lease_seconds)})
        if row is None:
            return None
        self._committed()
        return from_row.claimed_release(row)

    async def mark_released(self, releases: Iterable[ClaimedRelease], *, reconcile_after_seconds: float) -> set[uuid.UUID]:
        """Marks RUNNING every job whose release the core accepted, in one statement; returns
        those it marked (a job released again by a later attempt meanwhile is left to it)."""
        in_lock_order = sorted(releases, key=lambda release: release.job_id)
        rows = await self._all(
            "mark_released",
            {
                "job_ids": [release.job_id for release in in_lock_order],
                "attempts": [release.attempt for release in in_lock_order],
                "reconcile_after_seconds": float(reconcile_after_seconds),
            },
        )
        if rows:
            self._committed()
        return {row["job_id"] for row in rows}

    @overload
    async def schedule_retry(
        self, claim: ClaimedRelease, *, backoff_seconds: float, last_error: str, sent: bool = True
    ) -> ScheduledRetry | None: ...

    @overload
    async def schedule_retry(self, claim: ClaimedSettlement | ClaimedReservation, *, backoff_seconds: float) -> None: ...

    async def schedule_retry(
        self,
        claim: ClaimedRelease | ClaimedSettlement | ClaimedReservation,
        *,
        backoff_seconds: float,
        last_error: str = "",
        sent: bool = True,
    ) -> ScheduledRetry | None:
        """The claim's next attempt, due after `backoff_seconds`: one shape for every durable retry
        (each kind has its named statement; every one is fenced by the claim's attempt). A
        release's answers when its next attempt is due and whether its window is over (None when
        the job is no longer this attempt's); a reconciliation is never scheduled, its claim
        pushed its next look ahead. `sent`: whether the release attempt reached for the core (one
        held back before it was sent keeps the job's turn unsent, `release_turn_attempt`)."""
        params = {"attempt": claim.attempt, "backoff_seconds": float(backoff_seconds)}
        if isinstance(claim, ClaimedRelease):
            row = await self._one("schedule_release_retry", {**params, "job_id": claim.key, "last_error": last_error, "sent": sent})
            if row is not None:
                self._committed()
            return None if row is None else from_row.scheduled_retry(row)
        if isinstance(claim, ClaimedSettlement):
            await self._send("schedule_run_settle_retry", {**params, "job_id": claim.key})
        else:
            await self._send("schedule_run_reservation_retry", {**params, "run_id": claim.key})
        return None

    async def next_release_due_in(self) -> float | None:
        """Seconds until the earliest pending release is due, in the database's clock (None: none)."""
        row = await self._one("next_release_due_in", {})
        return None if row is None or row["seconds"] is None else max(0.0, float(row["seconds"]))

    # -- the core's capacity --------------------------------------------------------------------

    async def capacity_refused(self, *, job_id: uuid.UUID, attempt: int, probe_interval_seconds: float) -> int | None | bool:
        """The core refused the release ("not now"): the job waits again with its place. The
        limit the core taught us (None: none), or False when the attempt was fenced."""
        row = await self._one(
            "capacity_refused", {"job_id": job_id, "attempt": attempt, "probe_interval_seconds": float(probe_interval_seconds)}
        )
        return False if row is None else row["core_limit"]

    async def hold_release_if_paused(self, *, job_id: uuid.UUID, attempt: int) -> bool | None:
        """Holds a claimed release when its releases are paused: True when the job waits for a
        grant again (the claim opened its turn: nothing was sent since it last waited), False
        when it keeps its capacity (an earlier attempt may have been applied) and only its retry
        is held; None when not paused (or the attempt was overtaken)."""
        row = await self._one("hold_release_if_paused", {"job_id": job_id, "attempt": attempt})
        return None if row is None else bool(row["waits_again"])

    async def capacity_probe_taken(self) -> None:
        await self._send("capacity_probe_taken", {})

    async def seed_capacity(self, *, capacity: int) -> tuple[int, str]:
        """Seeds a fresh database's capacity; returns the capacity in force and who set it
        (`system:seed`, or an operator's actor)."""
        row = await self._one("seed_capacity", {"capacity": capacity})
        assert row is not None
        return int(row["capacity"]), str(row["updated_by"] or "")

    async def set_core_capacity(self, *, capacity: int) -> SettingChange:
        """Sets the fleet's capacity, recorded with the current actor (`audit`)."""
        actor = audit.actor_for("core_capacity")
        row = await self._one("set_core_capacity", {"capacity": capacity, "actor": actor})
        assert row is not None
        return from_row.setting_change(row)

    async def set_user_queue_limit(self, *, user_id: str, max_active: int) -> SettingChange:
        """Sets a user's slots (0: the default), recorded with the current actor (`audit`)."""
        actor = audit.actor_for("user_max_active")
        row = await self._one("set_user_queue_limit", {"user_id": user_id, "max_active": max_active, "actor": actor})
        assert row is not None
        return from_row.setting_change(row)

    async def user_settings(self, *, user_id: str, default_max_active: int) -> UserSettings:
        row = await self._one("user_settings", {"user_id": user_id, "default_max_active": default_max_active})
        assert row is not None
        return from_row.user_settings(user_id, row)

    async def setting_changes(self, *, before_change_id: int | None, limit: int) -> list[SettingChange]:
        rows = await self._all("setting_changes", {"before_change_id": before_change_id, "limit": limit})
        return [from_row.setting_change(row) for row in rows]

    async def release_pauses(self, *, limit: int) -> tuple[list[PauseInForce], int]:
        """The pauses in force (the fleet's first, then users', the longest paused first) and how
        many users are paused."""
        rows = await self._all("release_pauses", {"limit": limit})
        return [from_row.pause_in_force(row) for row in rows], int(rows[0]["paused_users"]) if rows else 0

    async def audit_events(self, query: AuditQuery, *, limit: int) -> list[AuditEvent]:
        params: Row = {**dataclasses.asdict(query), "limit": limit}
        return [from_row.audit_event(row) for row in await self._all("audit_events", params)]

    async def record_operator_action(self, *, action: str, user_id: str, job_id: uuid.UUID | None, outcome: str) -> None:
        """An operator's Promote, Release or CheckJobWithCore, with the current actor (`audit`)."""
        params: Row = {"action": action, "actor": audit.actor_for(action), "user_id": user_id, "job_id": job_id, "outcome": outcome}
        await self._send("record_operator_action", params)

    async def capacity_state(self) -> CapacityState:
        row = await self._one("capacity_state", {"paused_users_named": PAUSED_USERS_NAMED_AT_MOST})
        assert row is not None
        return from_row.capacity_state(row)

    async def capacity_positions(self, *, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
        rows = await self._all("capacity_positions", {"job_ids": job_ids})
        return {row["job_id"]: int(row["capacity_position"]) for row in rows}

    # -- the sweeper's finds -------------------------------------------------------------------

    async def users_needing_promotion(self, *, default_max_active: int, batch_size: int) -> list[str]:
        rows = await self._all("users_needing_promotion", {"default_max_active": default_max_active, "batch_size": batch_size})
        return [r["user_id"] for r in rows]

    async def expired_pending_releases(self, *, batch_size: int) -> list[ExpiredRelease]:
        rows = await self._all("expired_pending_releases", {"batch_size": batch_size})
        return [from_row.expired_release(r) for r in rows]

    async def claim_due_reconciliations(
        self, *, recheck_seconds: float, cancel_recheck_seconds: float, batch_size: int
    ) -> list[ClaimedReconciliation]:
        params = {
            "recheck_seconds": float(recheck_seconds),
            "cancel_recheck_seconds": float(cancel_recheck_seconds),
            "batch_size": batch_size,
        }
        rows = await self._all("claim_due_reconciliations", params)
        return [from_row.claimed_reconciliation(r) for r in rows]

    async def queue_depth(self) -> dict[str, int]:
        row = await self._one("queue_depth", {})
        assert row is not None
        return {name: int(value) for name, value in row.items()}

    # -- job views -----------------------------------------------------------------------------

    async def job_views_by_ids(self, *, job_ids: list[uuid.UUID]) -> list[JobView]:
        return await self._views("job_views_by_ids", {"job_ids": job_ids})

    async def list_job_views(
        self, *, user_id: str, after_job_id: uuid.UUID | None, before_seq: int | None, statuses: Iterable[JobStatus], limit: int
    ) -> list[JobView]:
        return await self._views(
            "list_job_views",
            {"user_id": user_id, "after_job_id": after_job_id, "before_seq": before_seq, "statuses": _statuses(statuses), "limit": limit},
        )

    async def watch_resync_views(
        self, *, user_id: str, seqs: list[int], newest_known_seq: int, after_seq: int, limit: int
    ) -> list[JobView]:
        return await self._views(
            "watch_resync_views",
            {"user_id": user_id, "seqs": seqs, "newest_known_seq": newest_known_seq, "after_seq": after_seq, "limit": limit},
        )

    async def newest_seq_of_user(self, *, user_id: str) -> int:
        row = await self._one("newest_seq_of_user", {"user_id": user_id})
        assert row is not None
        return int(row["seq"])

    async def active_job_views_of_user(self, *, user_id: str, after_seq: int, limit: int) -> list[JobView]:
        return await self._views("active_job_views_of_user", {"user_id": user_id, "after_seq": after_seq, "limit": limit})

    async def queued_job_views_of_user(self, *, user_id: str) -> list[JobView]:
        return await self._views("queued_job_views_of_user", {"user_id": user_id})

    async def recent_judging_seconds(self) -> float | None:
        row = await self._one("recent_judging_seconds", {})
        return None if row is None or row["seconds"] is None else float(row["seconds"])

    # -- the job-change feed (store/feed.py) ---------------------------------------------------

    async def job_feed_start(self) -> FeedCursor:
        """A cursor at the present: the changes committed after it are read next."""
        row = await self._one("job_feed_start", {})
        assert row is not None
        return FeedCursor(row["snapshot"], time.monotonic())

    async def job_feed_since(self, after: FeedCursor, *, user_ids: list[str] | None, limit: int, watch_line: bool = False) -> FeedRead:
        """The changes committed since `after`, in change_id order (of `user_ids` and of PENDING
        jobs nobody claimed; of every user when None), and the cursor to read from next; not
        `complete` (and no changes) when there were more than `limit`. With `watch_line`, also
        whether a change of any user may have moved the fleet's line for capacity."""
        read_at = time.monotonic()
        rows = await self._all(
            "job_feed_since",
            {
                "after": after.snapshot,
                "all_users": user_ids is None,
                "user_ids": user_ids or [],
                "limit": limit + 1,
                "watch_line": watch_line,
            },
        )
        changes = [from_row.job_change(row) for row in rows if row["change_id"] is not None]
        complete = len(changes) <= limit
        return FeedRead(FeedCursor(rows[0]["snapshot"], read_at), changes if complete else [], complete, bool(rows[0]["line_moved"]))

    async def job_feed_horizon(self) -> int:
        """The oldest transaction still in flight: every older one has ended."""
        row = await self._one("job_feed_horizon", {})
        assert row is not None
        return int(row["xmin"])

    async def trim_job_feed(self, *, before_xid: int, batch_size: int) -> int:
        """Deletes up to `batch_size` feed rows of transactions older than `before_xid`; how many."""
        cursor = await self._send("trim_job_feed", {"before_xid": str(before_xid), "batch_size": batch_size})
        return max(0, cursor.rowcount)

    async def job_feed_hint(self, *, sender: str) -> None:
        await self._send("job_feed_hint", {"sender": sender})

    # -- credits -------------------------------------------------------------------------------

    async def grant_credits(self, *, user_id: str, amount: int, idempotency_key: str, note: str = "") -> GrantOutcome:
        """Grants once per key: a repeated key grants nothing and reports the earlier amount. The
        grant records the current actor (`audit`) and the operator's note."""
        key = {"user_id": user_id, "idempotency_key": idempotency_key}
        actor = audit.actor_for(Cause.GRANT)
        row = await self._one("grant_credits", {**key, "amount": amount, "actor": actor, "reason": str(Cause.GRANT), "note": note})
        if row is not None:
            audit.log_movement(kind=LedgerKind.GRANT, user_id=user_id, amount=amount, actor=actor, reason=Cause.GRANT)
            return GrantOutcome(balance=int(row["balance"]), granted_now=True)
        earlier = await self._one("grant_by_key", key)
        return GrantOutcome(
            balance=await self.balance_of_user(user_id=user_id),
            granted_now=False,
            earlier_amount=None if earlier is None else int(earlier["amount"]),
        )

    async def balance_of_user(self, *, user_id: str) -> int:
        row = await self._one("balance_of_user", {"user_id": user_id})
        assert row is not None
        return int(row["balance"])

    async def job_inputs(self, *, job_id: uuid.UUID) -> JobInputs | None:
        """What the job was admitted with, in full; None for an unknown job."""
        row = await self._one("job_inputs", {"job_id": job_id})
        if row is None:
            return None
        return JobInputs(
            job_id=row["job_id"],
            user_id=row["user_id"],
            status=JobStatus(row["status"]),
            delta_of_job_id=row["delta_of_job_id"],
            document_uri=row["document_uri"] or "",
            document_title=row["document_title"] or "",
            sources=None if row["sources"] is None else sources_of_json(row["sources"]),
            sources_pruned=row["sources"] is None and row["source_count"] is not None,
            newest_retry_job_id=row.get("newest_retry_job_id"),
        )

    async def ledger_entries(self, query: LedgerQuery, *, limit: int) -> list[LedgerEntry]:
        """Newest first; picks the query shape whose index fits: one job, one actor, one user, or all."""
        params: Row = {**dataclasses.asdict(query), "limit": limit}
        name = (
            "ledger_entries_of_job"
            if query.job_id
            else "ledger_entries_of_actor"
            if query.actor
            else "ledger_entries_of_user"
            if query.user_id
            else "ledger_entries"
        )
        return [from_row.ledger_entry(row) for row in await self._all(name, params)]

    # -- the operator's reads ------------------------------------------------------------------

    async def operator_overview(self, *, window_minutes: int, reconcile_after_seconds: float) -> Overview:
        params = {"window_minutes": window_minutes, "reconcile_after_seconds": float(reconcile_after_seconds)}
        row = await self._one("operator_overview", params)
        admits = await self._all("admits_per_minute", {"window_minutes": window_minutes})
        assert row is not None
        return from_row.overview(row, admits, window_minutes=window_minutes)

    async def write_replica_heartbeat(self, report: ReplicaReport) -> None:
        params = {field.name: getattr(report, field.name) for field in dataclasses.fields(report)}
        del params["heartbeat_time"]
        health = report.core_health
        params["core_health"] = Jsonb(from_row.core_health_to_json(health)) if health is not None else None
        await self._send("replica_heartbeat", params)

    async def fresh_core_health_reports(self, *, fresh_seconds: float) -> tuple[list[CoreHealthReport], dt.datetime]:
        """The core's health as each replica heard from within `fresh_seconds` reads it, and when
        they were read."""
        rows = await self._all("fresh_core_health_reports", {"fresh_seconds": fresh_seconds})
        reports = [from_row.core_health_of_json(row["core_health"]) for row in rows]
        return [report for report in reports if report is not None], rows[0]["read_time"]

    async def forget_replica(self, *, replica_id: str) -> None:
        await self._send("forget_replica", {"replica_id": replica_id})

    async def replicas(self) -> tuple[list[ReplicaReport], dt.datetime | None]:
        """The replicas heard from within the last hour, and when they were read."""
        rows = await self._all("replicas", {})
        reports = [
            ReplicaReport(
                replica_id=row["replica_id"],
                host=row["host"],
                start_time=row["start_time"],
                draining=bool(row["draining"]),
                calls_in_flight=int(row["calls_in_flight"]),
                watch_streams=int(row["watch_streams"]),
                overview_streams=int(row["overview_streams"]),
                core_answered=int(row["core_answered"]),
                core_refused=int(row["core_refused"]),
                core_unknown=int(row["core_unknown"]),
                core_last_unknown_at=row["core_last_unknown_at"],
                core_health=from_row.core_health_of_json(row["core_health"]),
                heartbeat_time=row["heartbeat_time"],
            )
            for row in rows
        ]
        return reports, rows[0]["read_time"] if rows else None

    async def users_with_work(self, *, limit: int) -> tuple[list[UserWork], int]:
        """The users with jobs in flight, the one waiting longest first, and how many there are."""
        rows = await self._all("users_with_work", {"limit": limit})
        users = [
            UserWork(
                user_id=row["user_id"],
                queued=int(row["queued"]),
                pending=int(row["pending"]),
                running=int(row["running"]),
                oldest_queued_create_time=row["oldest_queued_create_time"],
                oldest_create_time=row["oldest_create_time"],
            )
            for row in rows
        ]
        return users, int(rows[0]["users_total"]) if rows else 0

    async def queue_history(self, *, window_minutes: int) -> list[QueueMinute]:
        """A point per minute over the window, oldest first."""
        rows = await self._all("queue_history", {"window_minutes": window_minutes})
        return [
            QueueMinute(
                minute=row["minute"],
                queued=int(row["queued"]),
                active=int(row["active"]),
                admitted=int(row["admitted"]),
                ended=int(row["ended"]),
            )
            for row in rows
        ]

    async def search_job_views(self, search: JobSearch, *, limit: int) -> list[JobView]:
        """The jobs a search finds, in the query shape whose index fits it (`job_search_statement`)."""
        return await self._views(*job_search_statement(search, limit=limit))

    async def live_jobs_matching(self, live_filter: LiveJobFilter, *, limit: int) -> list[tuple[uuid.UUID, str]]:
        """(job_id, user_id) of the queued, pending or running jobs a bulk cancel matches."""
        rows = await self._all(
            "active_jobs_matching",
            {
                "statuses": _statuses(live_filter.statuses),
                "user_id": live_filter.user_id,
                "created_after": live_filter.created_after,
                "created_before": live_filter.created_before,
                "has_error": live_filter.has_error,
                **_inputs_params(live_filter.inputs),
                "limit": limit,
            },
        )
        return [(r["job_id"], r["user_id"]) for r in rows]


class Store:
    """The database, as the rest of the service sees it."""

    def __init__(
        self,
        pool: QueuePool,
        *,
        database_url: str,
        listen_database_url: str = "",
        dead_peer_seconds: int = 10,
        liveness_seconds: float | None = 2.0,
    ) -> None:
        self.pool = pool
        self._database_url = database_url
        self._listen_database_url = listen_database_url or database_url
        self._dead_peer_seconds = dead_peer_seconds
        self._liveness_seconds = liveness_seconds
        # The database's identity as health's last committed probe read it, and when the probe
        # began (`commit_probe`); False once the role proved unable to read it.
        self._probed_identity: tuple[float, DatabaseIdentity] | None = None
        self._probe_reads_identity = True
        # This replica's commits of job changes: its feed reader wakes at once, the other
        # replicas' through a debounced hint (store/feed.py).
        self.hints = CommitHints(self._send_hint)

    async def _send_hint(self, sender: str) -> None:
        async with self.statements() as db:
            await db.job_feed_hint(sender=sender)

    @asynccontextmanager
    async def statements(self) -> AsyncIterator[Statements]:
        """Statements on a pooled connection, each its own transaction; inside a call, the
        checkout and each statement are bounded by what is left of the caller's deadline."""
        async with connection(self.pool) as conn:
            yield Statements(conn, self.hints.committed)

    @asynccontextmanager
    async def holding_user_queue_lock(self, user_id: str) -> AsyncIterator[None]:
        """Holds the user's queue lock until the block ends, so every section of that user
        waits (tests and tools)."""
        async with holding_user_queue_lock(self.pool, user_id):
            yield

    @asynccontextmanager
    async def holding_capacity_lock(self) -> AsyncIterator[None]:
        """Holds the fleet-wide capacity lock until the block ends (tests and tools)."""
        async with holding_capacity_lock(self.pool):
            yield

    async def first_releases_owed(
        self, *, user_id: str | None = None, run_id: uuid.UUID | None = None
    ) -> tuple[list[ClaimedRelease], list[ClaimedRelease]]:
        """The first releases claimed for the user (or the user whose job owns `run_id`) and not
        tried since (`first_releases_owed`), read holding the user's queue lock: a locked change
        of that user still committing (a late acknowledgement, a statement given up) has ended
        by then, and what it promoted is seen. Those to hand over, and those of a paused user,
        sent back to waiting for a grant by the same statement."""
        async with connection(self.pool) as conn, conn.transaction():
            if user_id is None:
                owner = await (await conn.execute(_statement("run_owner"), {"run_id": run_id})).fetchone()
                if owner is None:
                    return [], []
                user_id = str(owner["user_id"])
            await take_user_queue_lock(conn, user_id)
            rows = await (await conn.execute(_statement("first_releases_owed"), {"user_id": user_id})).fetchall()
        if any(row["held"] for row in rows):
            self.hints.committed()
        owed = [from_row.claimed_release(row) for row in rows if not row["held"]]
        return owed, [from_row.claimed_release(row) for row in rows if row["held"]]

    # -- locked sections: each one statement under the user's queue lock (`locks.locked_section`)

    async def _locked(self, user_id: str, name: str, params: Row) -> list[Row]:
        rows = await locked_section(self.pool, user_id, _statement(name), params)
        if rows:
            self.hints.committed()
        return rows

    async def admit_job(self, job: NewJob, limits: AdmitLimits) -> AdmittedJob | None:
        """Admits the job under its user's lock; its view and whether the statement's database
        history is reconciled (`AdmittedJob`), or None when the key is taken, the balance is
        short, the queue or delta limit is full, the run's reservation is gone, or the delta's
        base was deleted since the pre-check. The charge records the current actor (`audit`)."""
        actor = audit.actor_for(Cause.ADMIT)
        params = {
            # Field by field, not dataclasses.asdict: that deep-copies the sources, replaced below.
            **{name: getattr(job, name) for name in _NEW_JOB_FIELDS},
            # NULL for an admit that carries none (tools, tests): "not stored", not "no sources".
            "sources": Jsonb(sources_to_json(job.sources)) if job.sources else None,
            "actor": actor,
            "reason": str(Cause.ADMIT),
            "default_max_active": limits.default_max_active,
            "max_queued": limits.max_queued,
            "max_running_deltas": limits.max_running_deltas,
            "release_window_seconds": float(limits.release_window_seconds),
            "release_lease_seconds": float(limits.release_lease_seconds),
            "reconcile_after_seconds": float(limits.reconcile_after_seconds),
        }
        try:
            rows = await self._locked(job.user_id, "admit_job", params)
        except errors.Conflict as conflict:
            if job.delta_of_job_id is None or conflict.metadata.get("constraint") != _DELTA_BASE_REFERENCE:
                raise
            # The pruner deleted the base after the admit's pre-check (past its retention): nothing
            # was written, and the admit's state read again says DELTA_BASE_NOT_FOUND.
            return None
        if not rows:
            return None
        if job.price > 0:
            audit.log_movement(
                kind=LedgerKind.CHARGE, user_id=job.user_id, amount=-job.price, job_id=job.job_id, actor=actor, reason=Cause.ADMIT
            )
        return AdmittedJob(from_row.job_view(rows[0]), history_reconciled=rows[0].get("history_reconciled"))

    async def end_job(self, job_id: uuid.UUID, user_id: str, transition: Transition, limits: PromotionLimits) -> JobEnding | None:
        """Applies a named transition under the user's lock if the job is still in one of its
        statuses (and, when it names one, still at its release attempt), refunds when it says so,
        and promotes the user's next jobs when the run is settled. None when the job was not in a
        status the transition starts from (fenced)."""
        actor = audit.actor_for(transition.cause)
        params = {
            **_ending_params(transition, actor, limits),
            "job_id": job_id,
            "from_statuses": _statuses(transition.from_statuses),
            "expected_attempts": transition.expected_attempts,
            "run_unsettled": transition.run_unsettled,
        }
        rows = await self._locked(user_id, "end_job", params)
        return _ending(rows, transition, actor) if rows else None

    async def end_run(self, report: RunReportToApply, limits: PromotionLimits) -> RunCompletion:
        """Applies the core's report of a run under the lock of the user whose job owns it, in one
        statement that also finds the job: ends the job (refund when asked, promotions) if it was
        PENDING or RUNNING. Else reports the job as it is, or that no job owns the run yet."""
        params = _ending_params(report.transition, report.actor, limits)
        rows = await locked_section_of_run(self.pool, report.run_id, _statement("end_run"), params)
        self.hints.committed()
        return _run_completion(rows, report.transition, report.actor)

    async def end_runs(self, reports: Sequence[RunReportToApply], limits: PromotionLimits) -> list[RunCompletion]:
        """`end_run` for several runs in one statement holding all their users' locks, each
        report with the actor of the call it came from; the completions in the reports' order.
        Raises LOCK_TIMEOUT when a user's lock is not granted soon (`locks._BATCH_LOCK_TIMEOUT`)."""
        params = _end_runs_params(reports, limits)
        rows = await locked_sections_of_runs(self.pool, params["run_ids"], _statement("end_runs"), params)
        self.hints.committed()
        return _run_completions(rows, reports)

    async def end_runs_then_grant(
        self,
        reports: Sequence[RunReportToApply],
        limits: PromotionLimits,
        *,
        probe_interval_seconds: float,
        max_grants: int,
    ) -> tuple[list[RunCompletion], CapacityGrant | None]:
        """`end_runs`, then in the same statement and commit `grant_capacity` if the fleet-wide
        capacity lock is free at once (`locks.locked_sections_of_runs_then_grant`): the capacity
        the completions freed goes to the next in line without a statement of its own. The grant
        is None when the lock was busy: nothing was granted, the caller asks for a grant as usual."""
        params = {
            **_end_runs_params(reports, limits),
            "lease_seconds": float(limits.release_lease_seconds),
            "probe_interval_seconds": float(probe_interval_seconds),
            "max_grants": max_grants,
        }
        rows, grant_rows = await locked_sections_of_runs_then_grant(
            self.pool, params["run_ids"], _statement("end_runs"), _statement("grant_capacity"), params
        )
        self.hints.committed()
        grant = None if grant_rows is None else from_row.capacity_grant(from_row.capacity_grant_json(grant_rows))
        return _run_completions(rows, reports), grant

    async def adopt_run(self, run: CoreRun, limits: PromotionLimits, *, reconcile_after_seconds: float) -> Adoption:
        """Adopts a run the core holds or judges into a job, under its user's lock, with its
        charge (the current actor, `audit`); idempotent by run id and idempotency key."""
        assert run.job_id is not None
        actor = audit.actor_for(Cause.ADOPT)
        params = {
            "job_id": run.job_id,
            "user_id": run.user_id,
            "run_id": run.run_id,
            "idempotency_key": run.idempotency_key,
            "request_digest": run.request_digest,
            "delta_of_run_id": run.delta_of_run_id,
            "price": run.price,
            "judging": run.fate is RunFate.JUDGING,
            "actor": actor,
            "reason": str(Cause.ADOPT),
            "reconcile_after_seconds": float(reconcile_after_seconds),
            **_limit_params(limits),
        }
        rows = await self._locked(run.user_id, "adopt_run", params)
        row = rows[0]
        kind = row["row_kind"]
        view = from_row.job_view(row) if row["job_id"] is not None else None
        if kind == "adopted" and run.price > 0:
            audit.log_movement(
                kind=LedgerKind.CHARGE, user_id=run.user_id, amount=-run.price, job_id=run.job_id, actor=actor, reason=Cause.ADOPT
            )
        taken_back = tuple(from_row.job_view(taken) for taken in rows[1:] if taken["row_kind"] == "taken_back")
        return Adoption(kind, view, taken_back)

    async def promote(self, user_id: str, limits: PromotionLimits) -> tuple[Promoted, ...]:
        """Fills every free slot of the user from the queue, oldest first, each promoted job's
        first release claimed for this replica."""
        return from_row.promoted(await self._locked(user_id, "promote", {"promote_user_id": user_id, **_limit_params(limits)}))

    async def settle_job_run(self, job_id: uuid.UUID, user_id: str, limits: PromotionLimits) -> RunSettlement:
        """Marks an ended job's run settled, freeing its slot, and fills the user's free slots."""
        rows = await self._locked(user_id, "settle_job_run", {"job_id": job_id, "settle_user_id": user_id, **_limit_params(limits)})
        return RunSettlement(settled=any(row["row_kind"] == "settled" for row in rows), promoted=from_row.promoted(rows))

    async def refund_failed_job(self, job_id: uuid.UUID, user_id: str, *, reason: Cause) -> int:
        """Refunds the job if it ended FAILED; the refunded amount (0: it did not fail, had no
        charge, or was already refunded). The refund records the current actor (`audit`)."""
        actor = audit.actor_for(reason)
        rows = await self._locked(user_id, "refund_failed_job", {"job_id": job_id, "actor": actor, "reason": str(reason)})
        refunded = int(rows[0]["refunded_amount"]) if rows else 0
        if refunded:
            audit.log_movement(kind=LedgerKind.REFUND, user_id=user_id, amount=refunded, job_id=job_id, actor=actor, reason=reason)
        return refunded

    async def set_releases_paused(self, *, user_id: str, paused: bool, note: str, release_window_seconds: float) -> SettingChange | None:
        """Pauses or resumes the releases of the fleet ('') or of one user under the fleet-wide
        capacity lock, recorded with the current actor (`audit`); None when nothing changed. A
        resume makes the retries the pause held due at once, with a fresh release window."""
        actor = audit.actor_for("releases_paused")
        params = {
            "user_id": user_id,
            "paused": paused,
            "actor": actor,
            "note": note,
            "release_window_seconds": float(release_window_seconds),
        }
        rows = await capacity_section(self.pool, _statement("set_releases_paused"), params)
        return from_row.setting_change(rows[0]) if rows else None

    async def grant_capacity(
        self, *, lease_seconds: float, release_window_seconds: float, probe_interval_seconds: float, max_grants: int
    ) -> CapacityGrant:
        """Hands the free capacity of the core to waiting jobs in fair order, under the fleet-wide
        capacity lock (`locks.capacity_section`), each release claimed for this replica."""
        params = {
            "lease_seconds": float(lease_seconds),
            "release_window_seconds": float(release_window_seconds),
            "probe_interval_seconds": float(probe_interval_seconds),
            "max_grants": max_grants,
        }
        return from_row.capacity_grant(await capacity_section(self.pool, _statement("grant_capacity"), params))

    async def open(self, *, timeout: float) -> None:
        await self.pool.open(wait=True, timeout=timeout)

    async def close(self) -> None:
        await self.hints.close()
        await self.pool.close()

    async def migrate(self) -> list[int]:
        """Applies every pending migration and changed function file; returns the versions this
        call applied."""
        with translated_errors():
            return await migrations.migrate(self._database_url)

    async def pending_migrations(self) -> list[str]:
        """Migrations and function files not yet applied (`migrations.pending_migrations`)."""
        with translated_errors():
            async with self.pool.connection() as conn:
                return await migrations.pending_migrations(conn)

    async def reachable(self, *, timeout: float) -> bool:
        """Whether the database answers a trivial statement within `timeout`."""
        try:
            async with self.pool.connection(timeout=timeout) as conn:
                await conn.execute("SELECT 1")
        except Exception:
            return False
        return True

    async def commit_probe(self, *, timeout: float) -> None:
        """Commits a tiny write (a transactional WAL message) within `timeout` (checkout
        included): the database can take this replica's writes. Raises DatabaseUnavailable otherwise; a commit
        still waiting then (for a synchronous standby, say) is cancelled, its connection given
        up if the server does not end it at once (`pool.statements_within_deadline`).

        The same statement reads the database's identity (`probed_identity`), unless the role
        may not read it: then the write is made alone from then on."""
        started = time.monotonic()
        with deadline.call_budget(timeout):
            async with self.statements() as db:
                if self._probe_reads_identity:
                    identity = await db.commit_probe_reading_identity()
                else:
                    identity = None
                    await db._send("commit_probe", {})
        if identity is None:
            self._probe_reads_identity = False
        else:
            self._probed_identity = (started, identity)

    def probed_identity(self, *, started_after: float) -> tuple[float, DatabaseIdentity] | None:
        """The database's identity as the last health probe read it, with when that probe began
        (monotonic), if it began after `started_after` and its commit went through."""
        probed = self._probed_identity
        return probed if probed is not None and probed[0] > started_after else None

    async def replication_stance(self, *, timeout: float) -> ReplicationStance:
        """What this replica's commits wait for (`ReplicationStance`)."""
        with deadline.call_budget(timeout):
            async with self.statements() as db:
                row = await db._one("replication_stance", {})
        assert row is not None
        return from_row.replication_stance(row)

    async def wait_until_reachable(self, *, wait_seconds: float, retry_max_seconds: float) -> None:
        """Returns once a connection to the database opens; retries for `wait_seconds`,
        logging each failure, then raises the last one. A refusal that waiting cannot cure (a
        wrong password, an unknown database: SQLSTATE class 28, 3D000) raises at once."""
        give_up_at = time.monotonic() + wait_seconds
        delay = 0.1
        attempt = 0
        while True:
            attempt += 1
            try:
                conn = await psycopg.AsyncConnection.connect(self._database_url, connect_timeout=max(2, int(retry_max_seconds * 4)))
            except psycopg.OperationalError as exc:
                left = give_up_at - time.monotonic()
                sqlstate = exc.sqlstate or ""
                if left <= 0 or sqlstate.startswith("28") or sqlstate == "3D000":
                    raise
                log.warning(
                    "database not reachable yet (attempt %d: %s); retrying for %.0fs more (QUEUE_DB_START_WAIT_SECONDS)",
                    attempt,
                    " ".join(str(exc).split()) or exc.__class__.__name__,
                    left,
                )
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, max(retry_max_seconds, 1.0))
                continue
            await conn.close()
            if attempt > 1:
                log.info("database reachable after %d attempts", attempt)
            return

    @asynccontextmanager
    async def feed_hints(self) -> AsyncIterator[AsyncIterator[str]]:
        """A dedicated connection LISTENing for the job-change feed's wake-up hints (store/feed.py);
        yields their payloads, each the sending replica's `hints.sender`. The caller reconnects
        when it drops, or when it goes silent (`notices`: a liveness query after
        `liveness_seconds` without traffic, TCP keepalives)."""
        parameters = connection_parameters(self._listen_database_url, dead_peer_seconds=self._dead_peer_seconds)
        async with notices.listening(
            self._listen_database_url, HINT_CHANNEL, liveness_seconds=self._liveness_seconds, **parameters
        ) as payloads:
            yield payloads
