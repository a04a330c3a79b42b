"""The operator's reads and records (`sql/queries/operator.sql`): the overview and the queue's
history, users with work, a job's inputs, the replicas' heartbeats and the core's health they
report, actions and the audit timeline.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

from psycopg.types.json import Jsonb

from queue_service import audit
from queue_service.model import (
    AuditEvent,
    AuditQuery,
    CoreHealthReport,
    JobInputs,
    JobStatus,
    Overview,
    QueueMinute,
    ReplicaReport,
    UserWork,
)
from queue_service.store import rows as from_row
from queue_service.store.json_values import core_health_of_json, core_health_to_json, sources_of_json
from queue_service.store.statements.base import Row, StatementRunner


class OperatorStatements(StatementRunner):
    """The operator's figures, replicas, actions and audit timeline."""

    async def operator_overview(self, *, window_minutes: int, reconcile_after_seconds: float) -> Overview:
        params = {"window_minutes": window_minutes, "reconcile_after_seconds": float(reconcile_after_seconds)}
        row = await self._one("operator_overview", params)
        admits = await self._all("admits_per_minute", {"window_minutes": window_minutes})
        assert row is not None
        return from_row.overview(row, admits, window_minutes=window_minutes)

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

    async def write_replica_heartbeat(self, report: ReplicaReport) -> None:
        params = {field.name: getattr(report, field.name) for field in dataclasses.fields(report)}
        del params["heartbeat_time"]
        health = report.core_health
        params["core_health"] = Jsonb(core_health_to_json(health)) if health is not None else None
        await self._send("replica_heartbeat", params)

    async def fresh_core_health_reports(self, *, fresh_seconds: float) -> tuple[list[CoreHealthReport], dt.datetime]:
        """The core's health as each replica heard from within `fresh_seconds` reads it, and when
        they were read."""
        rows = await self._all("fresh_core_health_reports", {"fresh_seconds": fresh_seconds})
        reports = [core_health_of_json(row["core_health"]) for row in rows]
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
                core_health=core_health_of_json(row["core_health"]),
                heartbeat_time=row["heartbeat_time"],
            )
            for row in rows
        ]
        return reports, rows[0]["read_time"] if rows else None

    async def record_operator_action(self, *, action: str, user_id: str, job_id: uuid.UUID | None, outcome: str) -> None:
        """An operator's Promote, Release or CheckJobWithCore, with the current actor (`audit`)."""
        params: Row = {"action": action, "actor": audit.actor_for(action), "user_id": user_id, "job_id": job_id, "outcome": outcome}
        await self._send("record_operator_action", params)

    async def audit_events(self, query: AuditQuery, *, limit: int) -> list[AuditEvent]:
        params: Row = {**dataclasses.asdict(query), "limit": limit}
        return [from_row.audit_event(row) for row in await self._all("audit_events", params)]
