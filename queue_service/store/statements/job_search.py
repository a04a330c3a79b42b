"""The operator's job search (`sql/queries/job_search.sql`): the query shape whose index fits the
filter, and the jobs a bulk cancel matches.
"""

from __future__ import annotations

import dataclasses
import uuid

from queue_service.model import JobSearch, JobView, LiveJobFilter
from queue_service.store.statements.base import Row, StatementRunner, inputs_params, status_values


def job_search_statement(search: JobSearch, *, limit: int) -> tuple[str, Row]:
    """The named query a search runs and its parameters: the shape whose index fits the filter, a
    search in what jobs judge (a DOI, a uri prefix, title words: the most selective first), one
    user, one status, or all. (The query-plan test and the bench's EXPLAIN bind through it too.)"""
    params: Row = {
        **dataclasses.asdict(search),
        **inputs_params(search.inputs),
        "statuses": status_values(search.statuses),
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
            also = {f"also_{name}": value for name, value in inputs_params(inputs).items() if name != driving}
            return shape, {**params, f"also_{driving}": "", **also}
    if search.user_id:
        return "search_job_views_of_user", params
    if len(search.statuses) == 1:
        return "search_job_views_in_status", {**params, "status": str(search.statuses[0])}
    return "search_job_views", params


class JobSearchStatements(StatementRunner):
    """The operator's job search and a bulk cancel's match."""

    async def search_job_views(self, search: JobSearch, *, limit: int) -> list[JobView]:
        """The jobs a search finds, in the query shape whose index fits it (`job_search_statement`)."""
        return await self._views(*job_search_statement(search, limit=limit))

    async def live_jobs_matching(self, live_filter: LiveJobFilter, *, limit: int) -> list[tuple[uuid.UUID, str]]:
        """(job_id, user_id) of the queued, pending or running jobs a bulk cancel matches."""
        rows = await self._all(
            "active_jobs_matching",
            {
                "statuses": status_values(live_filter.statuses),
                "user_id": live_filter.user_id,
                "created_after": live_filter.created_after,
                "created_before": live_filter.created_before,
                "has_error": live_filter.has_error,
                **inputs_params(live_filter.inputs),
                "limit": limit,
            },
        )
        return [(r["job_id"], r["user_id"]) for r in rows]
