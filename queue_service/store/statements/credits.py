"""Credits (`sql/queries/credits.sql`): a grant once per key, a balance, the ledger's pages."""

from __future__ import annotations

import dataclasses

from queue_service import audit
from queue_service.model import Cause, GrantOutcome, LedgerEntry, LedgerKind, LedgerQuery
from queue_service.store import rows as from_row
from queue_service.store.statements.base import Row, StatementRunner


class CreditStatements(StatementRunner):
    """Grants, balances and the ledger."""

    async def grant_credits(self, *, user_id: str, amount: int, idempotency_key: str, note: str = "") -> GrantOutcome:
        """Grants once per key: a repeated key grants nothing and reports the earlier amount. The
        grant records the current actor (`audit`) and the operator's note."""
        key = {"user_id": user_id, "idempotency_key": idempotency_key}
        actor = audit.actor_for(Cause.GRANT)
        row = await self._one("grant_credits", {**key, "amount": amount, "actor": actor, "reason": str(Cause.GRANT), "note": note})
        if row is not None:
            audit.log_movement(kind=LedgerKind.GRANT, user_id=user_id, amount=amount, actor=actor, reason=Cause.GRANT)
            return GrantOutcome(balance=int(row["balance"]), granted_now=True)
        earlier = await self._one("grant_by_key", key)
        return GrantOutcome(
            balance=await self.balance_of_user(user_id=user_id),
            granted_now=False,
            earlier_amount=None if earlier is None else int(earlier["amount"]),
        )

    async def balance_of_user(self, *, user_id: str) -> int:
        row = await self._one("balance_of_user", {"user_id": user_id})
        assert row is not None
        return int(row["balance"])

    async def ledger_entries(self, query: LedgerQuery, *, limit: int) -> list[LedgerEntry]:
        """Newest first; picks the query shape whose index fits: one job, one actor, one user, or all."""
        params: Row = {**dataclasses.asdict(query), "limit": limit}
        name = (
            "ledger_entries_of_job"
            if query.job_id
            else "ledger_entries_of_actor"
            if query.actor
            else "ledger_entries_of_user"
            if query.user_id
            else "ledger_entries"
        )
        return [from_row.ledger_entry(row) for row in await self._all(name, params)]
