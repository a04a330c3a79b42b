"""Credits: a grant's outcome and the ledger's entries, their kinds and the query an operator reads
them with.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid


@dataclasses.dataclass(frozen=True)
class GrantOutcome:
    """A credit grant: the balance after it, and whether this call granted (False: the key had
    granted before)."""

    balance: int
    granted_now: bool
    earlier_amount: int | None = None


class LedgerKind(enum.StrEnum):
    """How a ledger entry moves credits; the values are the database's (`credit_ledger.kind`)."""

    GRANT = "grant"
    CHARGE = "charge"
    REFUND = "refund"


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One credit movement as the audit trail shows it: who (`actor`) moved what, when and why."""

    entry_id: int
    create_time: dt.datetime
    user_id: str
    kind: LedgerKind
    # Signed: a charge is negative, a grant or refund positive.
    amount: int
    job_id: uuid.UUID | None
    # Grants only: the grant's idempotency key.
    idempotency_key: str | None
    actor: str
    reason: str
    # Grants only: why, in the operator's words (migration 0017); empty when none was given.
    note: str = ""


@dataclasses.dataclass(frozen=True)
class LedgerQuery:
    """Which ledger entries an operator reads: by user, job and/or actor (empty: every one), below
    the keyset position `before_entry_id` (None: from the newest)."""

    user_id: str
    job_id: uuid.UUID | None
    before_entry_id: int | None
    actor: str = ""
