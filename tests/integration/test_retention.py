"""What one user can store is bounded (docs/security.md, "What one user can store"): free work
(delta re-checks at price 0, refunded cancels) is limited per hour, ended jobs' sources and then
the jobs themselves are pruned past their retention, and the ledger outlives them (I3)."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Literal

import grpc
import psycopg
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from queue_service._gen.acurio.core.v1 import run_service_pb2 as run_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2, queue_service_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service.api.servicers import validation
from queue_service.dev.core import AnswerFault
from tests.harness import InvariantChecker, error_info, new_user, until

# What one admitted job adds to the whole database at most while it keeps its sources, at the
# largest inputs validation accepts, every character 4 bytes (the admit's text, jsonb's per-source
# overhead, the preview, the document, the search keys with every DOI and their GIN entries, the
# row's versions and index entries, TOAST's chunk headers, the ledger entries, the run's
# reservation; measured: 1.72 MB a job over the free-work test's rounds, 1.98 MB compacted, the
# GIN entries merged), and once the pruner emptied its sources (the preview, the document, the
# search keys of the preview's DOIs and of the title, the rows; measured: 25 KB a job, compacted).
# docs/security.md states the same figures.
STORED_BYTES_PER_JOB = 2_100_000
STORED_BYTES_PER_PRUNED_JOB = 36_000


def _wide_text(rng: random.Random, characters: int) -> str:
    """Random 4-byte UTF-8 characters validation accepts, drawn from every plane above the first
    (the tag characters excepted): neither TOAST nor an index can compress them away, as a hostile
    user would not let them (one block's characters share their leading bytes, which pglz finds)."""
    picked: list[str] = []
    while len(picked) < characters:
        character = chr(rng.randint(0x10000, 0x10FFFF))
        if validation.invisible_character("text", character) is None:
            picked.append(character)
    return "".join(picked)


def _largest_admit(user: str, rng: random.Random, *, delta_of_job_id: str = "") -> queue_service_pb2.AdmitRequest:
    """The largest admit validation accepts, in random 4-byte characters, its DOIs new to the
    database (a DOI other jobs cite adds only a pointer to its GIN entry): 1000 sources, each DOI
    at its byte limit, the first 10 citations (the preview's) at the 512 characters the preview
    keeps, the rest sharing what is left of the 1 MiB; the longest title and uri (a delta's none)."""
    doi_characters = (validation.MAX_DOI_BYTES - len("10.1234/")) // 4
    sources = [job_pb2.Source(doi="10.1234/" + _wide_text(rng, doi_characters)) for _ in range(validation.MAX_SOURCES)]
    document = None
    if not delta_of_job_id:
        uri = "s3://" + _wide_text(rng, (validation.MAX_URI_BYTES - len("s3://")) // 4)
        document = job_pb2.Document(uri=uri, title=_wide_text(rng, validation.MAX_TITLE_CHARS))
    request = queue_service_pb2.AdmitRequest(
        user_id=user, idempotency_key=uuid.uuid4().hex, document=document, sources=sources, delta_of_job_id=delta_of_job_id
    )
    for source in request.sources[:10]:
        source.citation = _wide_text(rng, 512)
    left = validation.MAX_ADMIT_BYTES - request.ByteSize()
    rest = request.sources[10:]
    each = left // len(rest) // 4 - 2  # a citation's tag and length (3 bytes) and the source's longer length
    for source in rest:
        source.citation = _wide_text(rng, each)
    assert validation.MAX_ADMIT_BYTES - 8_000 < request.ByteSize() <= validation.MAX_ADMIT_BYTES
    validation.validate_admit(request)
    return request


async def _retrying(call, request):  # type: ignore[no-untyped-def]
    """`call(request)`, sent again (the same request, its idempotency key with it) while it answers
    a retryable UNAVAILABLE (a megabyte admit's statements can hold the user's lock past another's
    lock timeout on a loaded machine), as a client does."""
    give_up_at = asyncio.get_running_loop().time() + 60
    while True:
        try:
            return await call(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or asyncio.get_running_loop().time() > give_up_at:
                raise
        await asyncio.sleep(0.2)


def _database_bytes(database_url: str, *, vacuum: Literal["", "VACUUM", "VACUUM FULL"] = "") -> int:
    """The whole database's size on disk: every table, index, TOAST table and catalog, so a new
    derived table counts without anyone listing it. After `vacuum` when given: "VACUUM FULL" for
    what the live rows take, compacted (space freed by pruning is reused by later rows, not given
    back to the disk); a plain "VACUUM" as autovacuum leaves it in service (freed space is reused
    only where the relation's kind reuses it: a GIN index never drops a key)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        if vacuum:
            conn.execute(vacuum)
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    return int(row[0])


def _retry_and_quota(exc: grpc.aio.AioRpcError) -> tuple[float | None, list[str]]:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    delay, subjects = None, []
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            delay = retry.retry_delay.ToMilliseconds() / 1000
        elif detail.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
            quota = error_details_pb2.QuotaFailure()
            detail.Unpack(quota)
            subjects = [v.subject for v in quota.violations]
    return delay, subjects


async def test_one_user_at_the_largest_admits_grows_the_database_no_more_than_the_stated_hourly_bound(services, database_url: str) -> None:
    """One user with one credit admits at the largest size validation accepts (4-byte characters,
    DOIs new to the database) as fast as the limits let her: a first-pass job canceled at once
    (charged, refunded) and a free delta re-check completed, over and over. What the whole
    database grows by stays within the hourly bound docs/security.md states for her (the free
    limit, plus the delta re-checks that may race past the pre-check, plus what her balance pays
    for, each at the most a job stores), and past the limit each admit answers
    RESOURCE_EXHAUSTED `USER_FREE_WORK_LIMIT` with a QuotaFailure and RetryInfo. Before the limit,
    every round stored two megabyte-sized jobs."""
    free_limit = 5
    service = await services.start(max_free_admits_per_user_per_hour=free_limit)
    user = new_user()
    await service.stubs.grant(user, 2)
    base = await service.stubs.admit(user)
    await service.stubs.complete(base.run_id)
    balance = await service.stubs.balance(user)
    assert balance == 1
    rng = random.Random(38)
    rounds = [(_largest_admit(user, rng), _largest_admit(user, rng, delta_of_job_id=base.job_id)) for _ in range(12)]

    before = await asyncio.to_thread(_database_bytes, database_url)
    admitted, refusals = 0, []
    for first_pass, delta in rounds:
        for request in (first_pass, delta):
            try:
                job = (await _retrying(service.stubs.queue.Admit, request)).job
            except grpc.aio.AioRpcError as exc:
                refusals.append(exc)
                continue
            admitted += 1
            if request.delta_of_job_id:
                await service.stubs.complete(job.run_id)
            else:
                await _retrying(service.stubs.queue.CancelJob, queue_service_pb2.CancelJobRequest(job_id=job.job_id, user_id=user))
    grown = await asyncio.to_thread(_database_bytes, database_url) - before
    print(
        f"free-work bound: {admitted} jobs admitted, {len(refusals)} refused, the database grew by {grown} bytes, {grown // admitted} a job"
    )

    config = service.app.config
    hourly_jobs = free_limit + config.max_active_deltas_per_user + balance // config.admit_price
    hourly_bound = hourly_jobs * STORED_BYTES_PER_JOB
    assert grown <= hourly_bound, f"{admitted} jobs admitted grew the database by {grown} bytes, over the hourly bound of {hourly_bound}"
    assert grown <= admitted * STORED_BYTES_PER_JOB, f"{grown // admitted} bytes a job, over the stated {STORED_BYTES_PER_JOB}"
    assert refusals, "the limit never refused an admit"
    for exc in refusals:
        code, reason, metadata, _ = error_info(exc)
        assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "USER_FREE_WORK_LIMIT"), (code, reason, exc.details())
        assert metadata["maxFreeAdmitsPerHour"] == str(free_limit)
        delay, subjects = _retry_and_quota(exc)
        assert delay is not None and 0 < delay <= 3600
        assert subjects == ["user"]
    assert await service.stubs.balance(user) == 1
    assert InvariantChecker(database_url).i3_ledger() == []


def _job_row(database_url: str, job_id: str) -> tuple[bool, int | None, int | None] | None:
    """(sources kept, source_count, preview length) of the job's row; None when it is gone."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sources IS NOT NULL, source_count, jsonb_array_length(sources_preview) FROM analysis_jobs WHERE job_id = %s",
            (job_id,),
        ).fetchone()
    return None if row is None else (bool(row[0]), row[1], row[2])


def _ledger_of(database_url: str, user: str) -> list[tuple[str, int, str | None]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT kind, amount, job_id::text FROM credit_ledger WHERE user_id = %s ORDER BY entry_id", (user,)).fetchall()
    return [(k, int(a), j) for k, a, j in rows]


def _admitted_earlier(database_url: str, *job_ids: str, ended_too: bool = False) -> None:
    """Moves the jobs' admit (and, with `ended_too`, their end) an hour and a minute back: the
    pruner keeps a job admitted within the hour (the free-work limit counts them)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """UPDATE analysis_jobs
                  SET create_time = create_time - interval '61 minutes',
                      end_time = CASE WHEN %s THEN end_time - interval '61 minutes' ELSE end_time END
                WHERE job_id = ANY(%s::uuid[])""",
            (ended_too, list(job_ids)),
        )


def _runs_unsettled(database_url: str, user: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM analysis_jobs WHERE user_id = %s AND run_settle_due_at IS NOT NULL", (user,)).fetchone()
    assert row is not None
    return int(row[0])


def _has_search_keys(database_url: str, job_id: str) -> bool:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM analysis_job_search_keys WHERE job_id = %s", (job_id,)).fetchone() is not None


async def test_the_pruner_empties_ended_jobs_sources_then_deletes_the_jobs_keeping_the_ledger(services, database_url: str) -> None:
    """With retentions of seconds: a sweep first keeps everything; past the inputs' retention the
    ended jobs lose their full sources (the count and preview stay, GetJob still answers, and
    RetryJob answers FAILED_PRECONDITION `JOB_INPUTS_PRUNED`); past the jobs' retention they are
    deleted (a delta's base once the delta is gone), while an active job stays and every ledger
    entry stays, the balance still equal to its ledger (I3). A delta of a deleted base answers
    `DELTA_BASE_NOT_FOUND`."""
    service = await services.start(job_inputs_retention_seconds=1.0, job_retention_seconds=3.0)
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    user = new_user()
    await service.stubs.grant(user, 3)
    canceled = await service.stubs.admit(user, dois=("10.1234/a", "10.1234/b"))
    await _retrying(service.stubs.queue.CancelJob, queue_service_pb2.CancelJobRequest(job_id=canceled.job_id, user_id=user))
    succeeded = await service.stubs.admit(user)
    await service.stubs.complete(succeeded.run_id)
    delta = await service.stubs.admit(user, delta_of=succeeded.job_id)
    await service.stubs.complete(delta.run_id)
    active = await service.stubs.admit(user)
    ended = (canceled.job_id, succeeded.job_id, delta.job_id)
    await asyncio.to_thread(_admitted_earlier, database_url, *ended)  # out of the free-work limit's hour
    assert await asyncio.to_thread(_has_search_keys, database_url, canceled.job_id)
    ledger = await asyncio.to_thread(_ledger_of, database_url, user)

    await service.app.sweeper.sweep_once()
    for job_id in ended:
        assert (await asyncio.to_thread(_job_row, database_url, job_id))[0], "sources pruned before their retention"

    await asyncio.sleep(1.2)  # past the inputs' retention, within the jobs'
    await service.app.sweeper.sweep_once()
    assert await asyncio.to_thread(_job_row, database_url, canceled.job_id) == (False, 2, 2)
    for job_id in ended:
        assert not (await asyncio.to_thread(_job_row, database_url, job_id))[0]
    assert (await asyncio.to_thread(_job_row, database_url, active.job_id))[0], "an active job's sources were pruned"
    shown = await service.stubs.job(canceled.job_id)
    assert shown.source_count == 2 and [s.doi for s in shown.sources] == ["10.1234/a", "10.1234/b"]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await operator.RetryJob(op_pb2.RetryJobRequest(job_id=canceled.job_id, retry_key="again"), timeout=10)
    code, reason, metadata, _ = error_info(raised.value)
    assert (code, reason, metadata["jobId"]) == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_INPUTS_PRUNED", canceled.job_id)

    await asyncio.sleep(2.0)  # past the jobs' retention
    await service.app.sweeper.sweep_once()  # the delta goes, its base stays while the delta is named
    await service.app.sweeper.sweep_once()  # then the base
    for job_id in ended:
        assert await asyncio.to_thread(_job_row, database_url, job_id) is None, f"job {job_id} kept past its retention"
        assert not await asyncio.to_thread(_has_search_keys, database_url, job_id), f"job {job_id}'s search keys kept"
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await service.stubs.job(job_id)
        assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND")
    assert (await service.stubs.job(active.job_id)).status in (job_pb2.JOB_STATUS_PENDING, job_pb2.JOB_STATUS_RUNNING)
    assert await asyncio.to_thread(_ledger_of, database_url, user) == ledger
    assert await service.stubs.balance(user) == 1
    assert InvariantChecker(database_url).i3_ledger() == []
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.admit(user, delta_of=succeeded.job_id)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "DELTA_BASE_NOT_FOUND")


async def test_free_work_stays_counted_with_a_job_retention_under_an_hour(services, database_url: str) -> None:
    """With the jobs kept 1 s after they end, a user cancels three jobs (her free work, at the
    limit of 3): a sweep past their retention keeps them, since the limit counts the hour's jobs,
    and her next admit answers `USER_FREE_WORK_LIMIT` (the pruner deleting them let her go on)."""
    service = await services.start(max_free_admits_per_user_per_hour=3, job_retention_seconds=1.0)
    user = new_user()
    await service.stubs.grant(user, 5)
    canceled = []
    for _ in range(3):
        job = await service.stubs.admit(user)
        await service.stubs.queue.CancelJob(queue_service_pb2.CancelJobRequest(job_id=job.job_id, user_id=user), timeout=10)
        canceled.append(job.job_id)

    async def settled() -> bool:
        return await asyncio.to_thread(_runs_unsettled, database_url, user) == 0

    await until(settled, within=15, what="the canceled jobs' runs settled")
    await asyncio.sleep(1.2)  # past the jobs' retention
    await service.app.sweeper.sweep_once()
    for job_id in canceled:
        assert (await service.stubs.job(job_id)).status == job_pb2.JOB_STATUS_CANCELED
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.admit(user)
    assert error_info(raised.value)[:2] == (grpc.StatusCode.RESOURCE_EXHAUSTED, "USER_FREE_WORK_LIMIT")
    assert await service.stubs.balance(user) == 5


async def test_a_delta_admitted_while_the_pruner_deletes_its_base_answers_delta_base_not_found(services, database_url: str) -> None:
    """The base passes the delta's pre-check, then the pruner deletes it while the core creates
    the delta's run (its CreateRun arrives late): the admit answers NOT_FOUND
    `DELTA_BASE_NOT_FOUND` as a later admit would, nothing is charged, and the run is canceled
    (I5)."""
    core = await services.core()
    service = await services.start(core, job_retention_seconds=1.0, delta_price=1)
    user = new_user()
    await service.stubs.grant(user, 2)
    base = await service.stubs.admit(user)
    await service.stubs.complete(base.run_id)
    await asyncio.to_thread(_admitted_earlier, database_url, base.job_id, ended_too=True)  # past every retention
    core.answer_faults["CreateRun"] = AnswerFault("late_arrival", seconds=1.0)
    admitting = asyncio.create_task(service.stubs.admit(user, delta_of=base.job_id))

    async def create_run_sent() -> bool:
        return core.faults_injected["CreateRun:late_arrival"] == 1

    await until(create_run_sent, within=10, what="the delta's CreateRun on its way")
    await service.app.sweeper.sweep_once()
    assert await asyncio.to_thread(_job_row, database_url, base.job_id) is None, "the base was not pruned"
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await admitting
    code, reason, metadata, _ = error_info(raised.value)
    assert (code, reason, metadata.get("deltaOfJobId")) == (grpc.StatusCode.NOT_FOUND, "DELTA_BASE_NOT_FOUND", base.job_id)
    assert await service.stubs.balance(user) == 1
    core.answer_faults.clear()

    async def delta_run_canceled() -> bool:
        # The base's run judges on at this manual core: its completion was sent by hand.
        return [run.state for run in core.runs.values() if run.run_id != base.run_id] == [run_pb2.RUN_STATE_CANCELED]

    await until(delta_run_canceled, within=15, what="the delta's run canceled at the core")


async def test_a_pruned_job_at_the_largest_inputs_keeps_no_more_than_the_stated_bytes_in_the_whole_database(
    services, database_url: str
) -> None:
    """Jobs at the largest inputs validation accepts (4-byte characters, every DOI new), ended and
    past the inputs' retention: once the pruner emptied their sources, what they keep for the
    rest of the jobs' retention (30 days by default) in the whole database, compacted (the space
    freed is reused by later rows), is within the stated bytes a pruned job keeps: their search
    keys went with the sources but for the preview's DOIs (`analysis_jobs_trim_search_keys`), which
    still find them."""
    service = await services.start(job_inputs_retention_seconds=1.0, job_retention_seconds=3600.0)
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    user = new_user()
    jobs = 4
    await service.stubs.grant(user, jobs)
    rng = random.Random(49)
    requests = [_largest_admit(user, rng) for _ in range(jobs)]
    # As many such jobs of another user first, pruned before the baseline: each table and index
    # then holds pages of pruned jobs, so what is measured is what a pruned job adds, not the
    # first pages of empty relations (which, with nothing before it in the module, doubled it).
    earlier = new_user()
    await service.stubs.grant(earlier, jobs)
    for request in [_largest_admit(earlier, rng) for _ in range(jobs)]:
        job = (await _retrying(service.stubs.queue.Admit, request)).job
        await _retrying(service.stubs.queue.CancelJob, queue_service_pb2.CancelJobRequest(job_id=job.job_id, user_id=earlier))
    await asyncio.sleep(1.2)  # past the inputs' retention: the earlier jobs (and the module's others) pruned before the baseline
    await service.app.sweeper.sweep_once()
    before = await asyncio.to_thread(_database_bytes, database_url, vacuum="VACUUM FULL")
    for request in requests:
        job = (await _retrying(service.stubs.queue.Admit, request)).job
        await _retrying(service.stubs.queue.CancelJob, queue_service_pb2.CancelJobRequest(job_id=job.job_id, user_id=user))
    kept = await asyncio.to_thread(_database_bytes, database_url, vacuum="VACUUM FULL") - before
    print(f"kept sources: {jobs} jobs keep {kept} bytes, {kept // jobs} a job (compacted)")
    assert kept <= jobs * STORED_BYTES_PER_JOB, f"{kept // jobs} bytes a job keeping its sources, over the stated {STORED_BYTES_PER_JOB}"

    await asyncio.sleep(1.2)  # past the inputs' retention
    await service.app.sweeper.sweep_once()
    found = await operator.SearchJobs(op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(user_id=user)), timeout=10)
    assert [job.source_count for job in found.jobs] == [validation.MAX_SOURCES] * jobs
    for job in found.jobs:
        assert not (await asyncio.to_thread(_job_row, database_url, job.job_id))[0], "sources kept past their retention"
    pruned = await asyncio.to_thread(_database_bytes, database_url, vacuum="VACUUM FULL") - before
    print(f"pruned: {jobs} jobs keep {pruned} bytes, {pruned // jobs} a job (compacted)")
    assert pruned <= jobs * STORED_BYTES_PER_PRUNED_JOB, (
        f"{pruned // jobs} bytes a pruned job, over the stated {STORED_BYTES_PER_PRUNED_JOB}"
    )

    # A pruned job is still found by the DOIs its preview shows (its first 10 sources), not by the others.
    for request, job in zip(reversed(requests), found.jobs, strict=True):
        for source, matched in ((request.sources[9], [job.job_id]), (request.sources[10], [])):
            search = op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(source_doi=source.doi))
            assert [j.job_id for j in (await operator.SearchJobs(search, timeout=10)).jobs] == matched


# What the audit trail keeps of a job for good (its charge and refund in the ledger, with their
# indexes): the one part of the database meant to grow with every job (docs/security.md).
AUDIT_BYTES_PER_JOB = 1_000
# What the relations may still take while their free space settles (a page here and there, the
# DOI search's buckets filling: at most 16 384 entries, functions/queue_doi_search_buckets.sql).
SETTLING_BYTES = 768 * 1024


def _many_new_dois_admit(user: str, rng: random.Random) -> queue_service_pb2.AdmitRequest:
    """An admit citing as many DOIs as validation accepts, each new to the database and long, so
    whatever keeps a pruned DOI somewhere shows in megabytes."""
    stem = "10.1234/" + "x" * (validation.MAX_DOI_BYTES - len("10.1234/") - 16)
    sources = [job_pb2.Source(doi=f"{stem}{rng.getrandbits(64):016x}") for _ in range(validation.MAX_SOURCES)]
    return queue_service_pb2.AdmitRequest(
        user_id=user,
        idempotency_key=uuid.uuid4().hex,
        document=job_pb2.Document(uri=f"s3://turnover/{uuid.uuid4()}.pdf", title="Turnover"),
        sources=sources,
    )


async def test_the_database_stops_growing_once_pruned_jobs_turn_over_at_a_constant_count(services, database_url: str) -> None:
    """Rounds of jobs citing 1 000 new DOIs each, admitted, ended and pruned: once the pruning
    reached its steady state, the whole database (not compacted: plain VACUUM, as in service)
    grows by no more than the audit trail's bytes per job. Over the DOIs themselves, the search's
    GIN index kept an entry for every DOI ever admitted (a GIN index never removes a key), and
    the database grew by megabytes a round with as many jobs kept."""
    service = await services.start(job_inputs_retention_seconds=0.5, job_retention_seconds=1.0)
    user = new_user()
    jobs, rounds, steady_from = 8, 6, 2
    await service.stubs.grant(user, jobs * rounds)
    rng = random.Random(52)
    sizes = []
    for _ in range(rounds):
        ended = []
        for _ in range(jobs):
            job = (await _retrying(service.stubs.queue.Admit, _many_new_dois_admit(user, rng))).job
            await _retrying(service.stubs.queue.CancelJob, queue_service_pb2.CancelJobRequest(job_id=job.job_id, user_id=user))
            ended.append(job.job_id)
        await asyncio.to_thread(_admitted_earlier, database_url, *ended, ended_too=True)

        async def pruned(job_ids: list[str] = ended) -> bool:
            await service.app.sweeper.sweep_once()
            return all([await asyncio.to_thread(_job_row, database_url, job_id) is None for job_id in job_ids])

        await until(pruned, within=60, what="the round's jobs pruned", every=0.2)
        sizes.append(await asyncio.to_thread(_database_bytes, database_url, vacuum="VACUUM"))
    print("database bytes after each round:", sizes)
    growth = sizes[-1] - sizes[steady_from - 1]
    allowed = jobs * (rounds - steady_from) * AUDIT_BYTES_PER_JOB + SETTLING_BYTES
    assert growth <= allowed, f"the database grew {growth} bytes over {rounds - steady_from} rounds of pruned jobs: {sizes}"
