"""The store: the only code in the service that talks to PostgreSQL (see `store.store`)."""

from queue_service.store.feed import JobChange
from queue_service.store.store import JOB_CHANGES_CHANNEL, Statements, Store

__all__ = ["JOB_CHANGES_CHANNEL", "JobChange", "Statements", "Store"]
