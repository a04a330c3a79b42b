"""Credits: grants (once per idempotency key), balances, and the ledger's audit trail."""

from __future__ import annotations

from queue_service import errors
from queue_service.model import LedgerEntry, LedgerQuery
from queue_service.store import Store


class Credits:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def grant(self, user_id: str, amount: int, idempotency_key: str, note: str = "") -> int:
        """Grants `amount` once per key and returns the balance; the same key with the same
        amount again grants nothing and returns the balance (a retry), with another amount it is
        refused. `note` (why, in the operator's words) is kept on the ledger entry."""
        async with self._store.statements() as db:
            outcome = await db.grant_credits(user_id=user_id, amount=amount, idempotency_key=idempotency_key, note=note)
        if not outcome.granted_now and outcome.earlier_amount != amount:
            raise errors.IdempotencyKeyReused(
                f"this idempotency key already granted {outcome.earlier_amount} credits; use a new key for another grant",
                metadata={"grantedAmount": str(outcome.earlier_amount)},
            )
        return outcome.balance

    async def balance(self, user_id: str) -> int:
        async with self._store.statements() as db:
            return await db.balance_of_user(user_id=user_id)

    async def ledger_entries(self, query: LedgerQuery, *, limit: int) -> list[LedgerEntry]:
        """Ledger entries newest first, with who moved each credit and why."""
        async with self._store.statements() as db:
            return await db.ledger_entries(query, limit=limit)
