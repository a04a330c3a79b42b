"""The bound on a call's statements (`pool.statements_within_deadline`): what the block raises when
the deadline comes, when the block does not end once cancelled, and when another cancel comes."""

from __future__ import annotations

import asyncio

import pytest

from queue_service import deadline
from queue_service.store import pool


async def test_a_block_cancelled_at_its_deadline_raises_timeout_and_leaves_no_cancel_behind() -> None:
    with deadline.call_budget(5.0), deadline.share_of_remaining(0.01):
        with pytest.raises(TimeoutError):
            async with pool.statements_within_deadline():
                await asyncio.sleep(10)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # no cancel is pending for the task


async def test_a_block_that_ignores_its_cancel_is_interrupted_again_and_raises_timeout() -> None:
    with deadline.call_budget(5.0), deadline.share_of_remaining(0.01):
        with pytest.raises(TimeoutError, match="outlived its call's deadline"):
            async with pool.statements_within_deadline():
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    await asyncio.sleep(10)  # as psycopg waiting for a frozen server to end the statement
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_cancel_from_elsewhere_before_the_deadline_stays_a_cancel() -> None:
    async def bounded() -> None:
        with deadline.call_budget(5.0):
            async with pool.statements_within_deadline():
                await asyncio.sleep(10)

    task = asyncio.create_task(bounded())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_block_that_ends_in_time_is_left_alone() -> None:
    with deadline.call_budget(5.0):
        async with pool.statements_within_deadline():
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # its timer was cancelled: nothing cancels the task later


async def test_without_a_deadline_nothing_bounds_the_block() -> None:
    async with pool.statements_within_deadline():
        await asyncio.sleep(0.01)
