"""The store: the only code in the service that talks to PostgreSQL (see `store.store`)."""

from queue_service.store.store import JOB_CHANGES_CHANNEL, LockedStatements, Statements, Store, ViewAtCommit

__all__ = ["JOB_CHANGES_CHANNEL", "LockedStatements", "Statements", "Store", "ViewAtCommit"]
