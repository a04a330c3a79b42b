"""Concurrency claims, proved by racing real connections through several service processes."""

from __future__ import annotations

import asyncio
import itertools

from tests.harness import InvariantChecker, S, new_user


async def _sample_invariants(checker: InvariantChecker, stop: asyncio.Event, found: list[str]) -> None:
    while not stop.is_set():
        found.extend(await asyncio.to_thread(checker.i1_slot_limit))
        await asyncio.sleep(0.01)


async def test_fifty_concurrent_admits_for_one_user_across_three_processes(services, database_url: str) -> None:
    core = await services.core()
    replicas = [await services.start_process(core) for _ in range(3)]
    user = new_user()
    await replicas[0].stubs.grant(user, 50)
    checker = InvariantChecker(database_url)
    stop, violations = asyncio.Event(), []
    sampler = asyncio.create_task(_sample_invariants(checker, stop, violations))

    stubs = itertools.cycle([r.stubs for r in replicas])
    jobs = await asyncio.gather(*[next(stubs).admit(user, f"click-{i}", timeout=60) for i in range(50)])
    stop.set()
    await sampler

    active = [j for j in jobs if j.status in (S.JOB_STATUS_PENDING, S.JOB_STATUS_RUNNING)]
    queued = [j for j in jobs if j.status == S.JOB_STATUS_QUEUED]
    assert len(active) == 1 and len(queued) == 49
    assert sorted(j.queue_position for j in queued) == list(range(1, 50))
    listed = await replicas[1].stubs.jobs(user)
    assert sorted(j.queue_position for j in listed) == list(range(50))
    assert await replicas[2].stubs.balance(user) == 0
    assert violations == [] and checker.checks_run > 3
    assert checker.all_violations() == []


async def test_a_hundred_users_times_three_concurrent_admits_start_one_each(services, database_url: str) -> None:
    core = await services.core()
    replicas = [await services.start_process(core) for _ in range(2)]
    users = [new_user() for _ in range(100)]
    await asyncio.gather(*[replicas[0].stubs.grant(u, 3) for u in users])
    checker = InvariantChecker(database_url)
    stop, violations = asyncio.Event(), []
    sampler = asyncio.create_task(_sample_invariants(checker, stop, violations))

    calls = [replicas[(i + k) % 2].stubs.admit(u, timeout=60) for i, u in enumerate(users) for k in range(3)]
    jobs = await asyncio.gather(*calls)
    stop.set()
    await sampler

    by_user: dict[str, list] = {}
    for job in jobs:
        by_user.setdefault(job.user_id, []).append(job)
    for user, user_jobs in by_user.items():
        statuses = sorted(j.status for j in user_jobs)
        assert statuses.count(S.JOB_STATUS_QUEUED) == 2, user
        assert sorted(j.queue_position for j in user_jobs) == [0, 1, 2]
    assert violations == []
    assert checker.all_violations() == []


async def test_completions_and_admits_racing_keep_one_active_per_user(services, database_url: str) -> None:
    core = await services.core(manual=False, judging_seconds=0.02)
    replicas = [await services.start_process(core) for _ in range(2)]
    users = [new_user() for _ in range(10)]
    await asyncio.gather(*[replicas[0].stubs.grant(u, 6) for u in users])
    checker = InvariantChecker(database_url)
    stop, violations = asyncio.Event(), []
    sampler = asyncio.create_task(_sample_invariants(checker, stop, violations))

    jobs = await asyncio.gather(*[replicas[i % 2].stubs.admit(u, timeout=60) for u in users for i in range(6)])
    for job in jobs:
        await replicas[0].stubs.wait_for(job.job_id, S.JOB_STATUS_SUCCEEDED, timeout=60)
    stop.set()
    await sampler
    assert violations == []
    assert max(core.max_concurrent_judging[u] for u in users) == 1
    assert checker.all_violations() == []
