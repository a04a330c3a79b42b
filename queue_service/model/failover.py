"""What keeps the queue whole across a failover or a core restart: the core's runs as the second
copy (a run as the core records it, an adoption, a run lost, an active job the core did not
list), which database history the service writes, and what its commits wait for.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

from queue_service.model.admit import retried_job_id
from queue_service.model.jobs import JobStatus, JobView, RunFate


@dataclasses.dataclass(frozen=True)
class CoreRun:
    """A run as the core's record has it (ListRuns, GetRun): its state and what it was created
    with, the queue's own fields included (empty from a core or a queue that did not store them)."""

    run_id: uuid.UUID
    fate: RunFate
    user_id: str
    document_uri: str
    delta_of_run_id: uuid.UUID | None
    job_id: uuid.UUID | None
    idempotency_key: str
    request_digest: bytes
    price: int

    @property
    def first_pass(self) -> bool:
        return self.delta_of_run_id is None

    @property
    def retry_of_job_id(self) -> uuid.UUID | None:
        """The ended job this run's job retries, read from the key the record kept (an operator's
        retry's, `retry_idempotency_key`); None for any other run."""
        return retried_job_id(self.idempotency_key)

    @property
    def adoptable(self) -> bool:
        """Whether the record holds what a job needs: its id, user, key and digest."""
        return self.job_id is not None and bool(self.user_id) and bool(self.idempotency_key) and bool(self.request_digest)


@dataclasses.dataclass(frozen=True)
class Adoption:
    """What adopting a core's run came to: `kind` is 'adopted', 'known', 'key_taken' (with a
    job's view), or 'reserved', 'delta_base_lost', 'balance_short' (without). `taken_back`: the
    user's PENDING jobs an adopted judging run sent back to her queue (migration 0024)."""

    kind: str
    view: JobView | None
    taken_back: tuple[JobView, ...] = ()


@dataclasses.dataclass(frozen=True)
class LostRun:
    """A run reconciliation could not adopt, recorded for the operator."""

    run_id: uuid.UUID
    user_id: str
    job_id: uuid.UUID | None
    idempotency_key: str
    price: int
    core_state: str
    reason: str
    recorded_at: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class DatabaseIdentity:
    """Which database history the service writes to: a change of either part means a failover
    (or a restore) may have lost commits."""

    system_identifier: str | None
    timeline_id: int | None
    # The queue has reconciled this history with the core's runs (so it forgot none the core
    # judges): a fact about the history at the look, not part of which history it is.
    reconciled: bool = dataclasses.field(default=False, compare=False)


@dataclasses.dataclass(frozen=True)
class UnlistedRun:
    """An active job whose run the core's listing of its live runs did not show (a run the core
    may have lost: `GetRun` decides), with what fences ending it."""

    job_id: uuid.UUID
    user_id: str
    run_id: uuid.UUID
    status: JobStatus
    release_attempts: int


@dataclasses.dataclass(frozen=True)
class ReplicationStance:
    """What a commit of this replica waits for, as the database reports it.

    `mode` is one of: `synchronous` (a synchronous standby is connected and commits wait for it:
    an acknowledged commit survives the primary's loss), `synchronous_without_standby` (standbys
    are named but none is connected as synchronous: every commit waits, writes stall, health
    reads NOT_SERVING), `asynchronous` (standbys stream but commits do not wait: a failover can
    lose what was acknowledged in its last moments), `single_node` (no standby: a commit lasts as
    long as this node's disk), `standby` (the node is read-only: a failover is under way or the
    DSN reaches the wrong node), `unknown` (this role may not read the standbys' sync state).
    """

    mode: str
    synchronous_commit: str
    synchronous_standby_names: str
    standbys: int
    synchronous_standbys: int

    @property
    def synchronous(self) -> bool:
        return self.mode == "synchronous"

    def describe(self) -> str:
        return (
            f"replication {self.mode} (synchronous_commit={self.synchronous_commit}, "
            f"synchronous_standby_names={self.synchronous_standby_names!r}, standbys streaming={self.standbys}, "
            f"synchronous={self.synchronous_standbys})"
        )
