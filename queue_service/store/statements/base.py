"""What every module of `Statements` runs its named queries through: one connection the store
opened, autocommit (each statement its own transaction), rows as dicts, and the hint a statement
that changed jobs gives once it has committed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from psycopg import AsyncConnection, AsyncCursor

from queue_service.model import JobInputsSearch, JobStatus, JobView
from queue_service.store import rows as from_row
from queue_service.store.queries import statement

Row = dict[str, Any]


def status_values(statuses: Iterable[JobStatus]) -> list[str]:
    return sorted(str(status) for status in statuses)


def inputs_params(inputs: JobInputsSearch) -> Row:
    return {"document_uri_prefix": inputs.document_uri_prefix, "title_words": inputs.title_words, "source_doi": inputs.source_doi}


class StatementRunner:
    """Runs the named queries (`store/queries.py`) on one connection that the store opened."""

    def __init__(self, conn: AsyncConnection[Row], committed: Callable[[], None] = lambda: None) -> None:
        self._conn = conn
        # Told after a statement that changed jobs has committed (the job-change feed's hints).
        self._committed = committed

    async def _send(self, name: str, params: Row) -> AsyncCursor[Row]:
        return await self._conn.execute(statement(name), params)

    async def _all(self, name: str, params: Row) -> list[Row]:
        cursor = await self._send(name, params)
        return await cursor.fetchall()

    async def _one(self, name: str, params: Row) -> Row | None:
        rows = await self._all(name, params)
        return rows[0] if rows else None

    async def _views(self, name: str, params: Row) -> list[JobView]:
        return [from_row.job_view(row) for row in await self._all(name, params)]
