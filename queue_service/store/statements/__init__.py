"""`Statements`: one typed method per named query of `sql/queries/`, run on one connection the
store opened (`Store.statements()`). One module per concern, named as its file of queries; the
class assembles them, so callers see one object."""

from __future__ import annotations

from queue_service.store.statements.admit import AdmitStatements
from queue_service.store.statements.base import StatementRunner
from queue_service.store.statements.capacity import CapacityStatements
from queue_service.store.statements.claims import ClaimStatements
from queue_service.store.statements.credits import CreditStatements
from queue_service.store.statements.failover import FailoverStatements
from queue_service.store.statements.feed import FeedStatements
from queue_service.store.statements.job_reads import JobReadStatements
from queue_service.store.statements.job_search import JobSearchStatements, job_search_statement
from queue_service.store.statements.lifecycle import LifecycleStatements
from queue_service.store.statements.operator import OperatorStatements
from queue_service.store.statements.retention import RetentionStatements
from queue_service.store.statements.settings import SettingStatements

__all__ = ["Statements", "job_search_statement"]


class Statements(
    AdmitStatements,
    LifecycleStatements,
    ClaimStatements,
    CapacityStatements,
    SettingStatements,
    RetentionStatements,
    FailoverStatements,
    FeedStatements,
    JobReadStatements,
    CreditStatements,
    JobSearchStatements,
    OperatorStatements,
    StatementRunner,
):
    """The named queries, run on one connection that the store opened."""
