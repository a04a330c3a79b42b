"""CreditsService: grants and balances."""

from __future__ import annotations

import grpc

from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2
from queue_service._gen.acurio.queue.v1 import credits_service_pb2_grpc as credits_grpc
from queue_service.api.servicers import validation
from queue_service.engine import Credits


class CreditsServicer(credits_grpc.CreditsServiceServicer):
    def __init__(self, credits: Credits) -> None:
        self._credits = credits

    async def GrantCredits(
        self,
        request: credits_pb2.GrantCreditsRequest,
        context: grpc.aio.ServicerContext[credits_pb2.GrantCreditsRequest, credits_pb2.GrantCreditsResponse],
    ) -> credits_pb2.GrantCreditsResponse:
        v = validation.Violations()
        v.check_id("user_id", request.user_id)
        v.check_id("idempotency_key", request.idempotency_key)
        if not 1 <= request.amount <= validation.MAX_GRANT:
            v.add("amount", f"amount must be between 1 and {validation.MAX_GRANT}")
        v.check_text("note", request.note, max_chars=validation.MAX_NOTE_CHARS)
        v.raise_if_any()
        balance = await self._credits.grant(request.user_id, request.amount, request.idempotency_key, note=request.note)
        return credits_pb2.GrantCreditsResponse(balance=balance)

    async def GetBalance(
        self,
        request: credits_pb2.GetBalanceRequest,
        context: grpc.aio.ServicerContext[credits_pb2.GetBalanceRequest, credits_pb2.GetBalanceResponse],
    ) -> credits_pb2.GetBalanceResponse:
        validation.validate_user_id(request.user_id)
        return credits_pb2.GetBalanceResponse(balance=await self._credits.balance(request.user_id))
