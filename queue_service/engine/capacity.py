"""What one replica knows of the fleet's capacity at the core, and how it asks for a grant.

The capacity itself lives in PostgreSQL (`queue_capacity`, migration 0014) and every decision on
it is made there, under the fleet-wide capacity lock (`store.grant_capacity`). A replica only
keeps a hint, `limited`: whether it should ask for grants when capacity may have freed (a job
ended, a run settled) and on its dispatcher's passes, and whether a batch of completions grants
in its own statement (`CompletionBatcher`). The hint is learned from every grant's
answer, from the views of jobs that became PENDING waiting for capacity, and from the operator's
own change; a stale hint costs at most one dispatcher pass (at most 5 s) of latency, never
correctness: a job that waits is released only by a grant, whatever a replica believes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from queue_service import telemetry
from queue_service.model import CapacityGrant

log = logging.getLogger(__name__)


class FleetCapacity:
    def __init__(self, *, wake_grant: Callable[[], None], probe_interval_seconds: float) -> None:
        self.limited = False
        self.probe_interval_seconds = probe_interval_seconds
        self._wake_grant = wake_grant

    def note_waiting(self) -> None:
        """A job this replica made PENDING waits for capacity: the capacity is limited, grant now."""
        self.limited = True
        self._wake_grant()

    def freed(self) -> None:
        """Capacity may have freed (an ending, a settlement, a change of the setting)."""
        if self.limited:
            self._wake_grant()

    def learned(self, limited: bool) -> None:
        self.limited = limited

    def granted(self, grant: CapacityGrant) -> None:
        """Learns from a committed grant's answer (a grant statement's, or the one a batch of
        completions made in its own statement) and records it."""
        self.learned(grant.limited)
        telemetry.metrics.capacity["in_use"] = grant.in_use
        if grant.limit is None:
            telemetry.metrics.capacity.pop("limit", None)
        else:
            telemetry.metrics.capacity["limit"] = grant.limit
        for claim, waited in grant.claims:
            # A wait may read a hair below zero: the grant reads its clock first, and a job whose
            # wait began (by its own transaction's clock) after that and committed before the
            # grant's next statement is seen waiting. A histogram refuses a negative amount (the
            # SDK logs a warning each time and drops it): it waited no time.
            telemetry.metrics.capacity_wait.record(max(0.0, waited))
            log.info(
                "capacity granted",
                extra={"job_id": claim.job_id, "user_id": claim.user_id, "run_id": claim.run_id, "attempt": claim.attempt},
            )
