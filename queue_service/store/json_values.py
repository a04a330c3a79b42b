"""The JSON values the store writes into columns and reads back: a job's sources
(`analysis_jobs.sources`, the views' `sources_preview`) and a replica's reading of the core
(`queue_replicas.core_health`). `rows.py` reads them with the rows they come in."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from queue_service.model import CoreHealthReport, CoreMethodCalls, CoreMethodFailure, CoreMinute, CoreState


def sources_of_json(value: Any) -> tuple[tuple[str, str], ...]:
    """(doi, citation) pairs from a stored JSON array of {"doi", "citation"} (empty for NULL)."""
    return tuple((str(item.get("doi") or ""), str(item.get("citation") or "")) for item in value or ())


def sources_to_json(sources: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    """The JSON array a job's sources are stored as."""
    return [{"doi": doi, "citation": citation} for doi, citation in sources]


def _time_of_json(value: Any) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


def core_health_to_json(report: CoreHealthReport) -> dict[str, Any]:
    """The JSON object a replica's reading of the core is stored as (`queue_replicas.core_health`)."""
    return {
        "state": str(report.state),
        "last_success_at": report.last_success_at.isoformat() if report.last_success_at else None,
        "last_failure_at": report.last_failure_at.isoformat() if report.last_failure_at else None,
        "last_failure_reason": report.last_failure_reason,
        "minutes": [
            {
                **dataclasses.asdict(minute),
                "minute": minute.minute.isoformat(),
                "latency_counts": list(minute.latency_counts),
                "methods": {
                    calls.method: {"answered": calls.answered, "refused": calls.refused, "unknown": calls.unknown}
                    for calls in minute.methods
                },
            }
            for minute in report.minutes
        ],
        "method_failures": {failure.method: {"at": failure.at.isoformat(), "reason": failure.reason} for failure in report.method_failures},
    }


def core_health_of_json(value: Any) -> CoreHealthReport | None:
    """A replica's reading of the core from its stored JSON (None for NULL; an unknown state, from
    a newer version, reads as UNKNOWN)."""
    if not value:
        return None
    state = value.get("state")
    return CoreHealthReport(
        state=CoreState(state) if state in CoreState.__members__.values() else CoreState.UNKNOWN,
        last_success_at=_time_of_json(value.get("last_success_at")),
        last_failure_at=_time_of_json(value.get("last_failure_at")),
        last_failure_reason=str(value.get("last_failure_reason") or ""),
        minutes=tuple(
            CoreMinute(
                minute=dt.datetime.fromisoformat(m["minute"]),
                answered=int(m.get("answered", 0)),
                refused=int(m.get("refused", 0)),
                unknown=int(m.get("unknown", 0)),
                admits_unavailable=int(m.get("admits_unavailable", 0)),
                latency_counts=tuple(int(c) for c in m.get("latency_counts", ())),
                latency_max_ms=float(m.get("latency_max_ms", 0.0)),
                methods=tuple(
                    CoreMethodCalls(
                        method=str(method),
                        answered=int(c.get("answered", 0)),
                        refused=int(c.get("refused", 0)),
                        unknown=int(c.get("unknown", 0)),
                    )
                    for method, c in (m.get("methods") or {}).items()
                ),
            )
            for m in value.get("minutes", ())
        ),
        # Absent from the reports of replicas of an older version: no method named.
        method_failures=tuple(
            CoreMethodFailure(method=str(method), at=dt.datetime.fromisoformat(f["at"]), reason=str(f.get("reason") or ""))
            for method, f in (value.get("method_failures") or {}).items()
            if f.get("at")
        ),
    )
