"""The store: the only code in the service that talks to PostgreSQL (see `store.store`)."""

from queue_service.store.feed import JobChange
from queue_service.store.statements import Statements
from queue_service.store.store import JOB_CHANGES_CHANNEL, Store

__all__ = ["JOB_CHANGES_CHANNEL", "JobChange", "Statements", "Store"]
