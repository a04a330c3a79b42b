"""Admit through the public API: the five-clicks story, every row of the error table,
idempotency and credits."""

from __future__ import annotations

import asyncio
import random
import string
import time
import uuid
from collections.abc import Callable

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.core.v1 import run_service_pb2 as core_pb2
from queue_service._gen.acurio.queue.v1 import credits_service_pb2 as credits_pb2
from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.engine import job_reads
from queue_service.store.statements import Statements
from tests.harness import CheckoutsWithinCalls, InvariantChecker, S, error_info, new_user, until


def _rows_for(database_url: str, user_id: str) -> tuple[int, int]:
    """(job rows, ledger entries other than grants) of a user, read directly."""
    with psycopg.connect(database_url) as conn:
        jobs = conn.execute("SELECT count(*) FROM analysis_jobs WHERE user_id = %s", (user_id,)).fetchone()[0]
        entries = conn.execute("SELECT count(*) FROM credit_ledger WHERE user_id = %s AND kind <> 'grant'", (user_id,)).fetchone()[0]
    return jobs, entries


def _live_orphan_held_runs(service, database_url: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        owned = {str(r) for (r,) in conn.execute("SELECT run_id FROM analysis_jobs")}
    return [run.run_id for run in service.core.runs.values() if run.state == core_pb2.RUN_STATE_HELD and run.run_id not in owned]


async def test_five_clicks_one_runs_four_queue_and_each_completion_starts_the_next(service, database_url: str) -> None:
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 7)
    jobs = [await stubs.admit(user, f"click-{i}") for i in range(5)]

    assert jobs[0].status == S.JOB_STATUS_PENDING and jobs[0].queue_position == 0
    assert [j.status for j in jobs[1:]] == [S.JOB_STATUS_QUEUED] * 4
    assert [j.queue_position for j in jobs[1:]] == [1, 2, 3, 4]
    assert jobs[1].waiting_for_job_id == jobs[0].job_id
    assert jobs[4].waiting_for_job_id == jobs[3].job_id
    assert await stubs.balance(user) == 2

    # The sweeper is off in this service: only the tail call can start the next job.
    assert service.app.config.sweep_interval_seconds == 0
    checker = InvariantChecker(database_url)
    for index, job in enumerate(jobs):
        running = await stubs.wait_for(job.job_id, S.JOB_STATUS_RUNNING)
        assert running.start_time.seconds > 0
        for later in jobs[index + 1 :]:
            current = await stubs.job(later.job_id)
            assert current.status == S.JOB_STATUS_QUEUED
            assert current.queue_position == jobs.index(later) - index
        assert checker.i1_slot_limit() == []
        completed = await service.core.finish(job.run_id)  # the core reports through CompleteRun
        assert completed is not None and completed.job.status == S.JOB_STATUS_SUCCEEDED
    assert [j.status for j in await stubs.jobs(user)] == [S.JOB_STATUS_SUCCEEDED] * 5
    assert await stubs.balance(user) == 2
    assert checker.all_violations() == []
    assert service.core.max_concurrent_judging[user] == 1


async def test_queued_jobs_estimate_their_start_from_recent_judging_times(service) -> None:
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 5)
    first = await stubs.admit(user)
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    await stubs.complete(first.run_id)  # one judging duration of history
    second = await stubs.admit(user)
    third = await stubs.admit(user)
    assert third.status == S.JOB_STATUS_QUEUED
    service.app.reads._mean_read_at = float("-inf")  # skip the estimate cache
    third = await stubs.job(third.job_id)
    assert third.HasField("estimated_start_time")
    assert third.estimated_start_time.ToDatetime() >= second.create_time.ToDatetime()


async def test_a_queued_admit_answers_its_estimate_from_fresh_figures_without_another_connection(service, monkeypatch) -> None:
    """An admit takes two connections within its deadline (the pre-check, then the locked admit);
    its answer's estimate, from the figures another answer read a moment ago, takes none."""
    monkeypatch.setattr(job_reads, "_CAPACITY_CACHE_SECONDS", 60.0)  # fresh throughout, however slow the machine
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 5)
    first = await stubs.admit(user)
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    await stubs.complete(first.run_id)  # one judging duration of history
    await stubs.admit(user)
    await stubs.admit(user)  # queued: its answer read the figures
    checkouts = CheckoutsWithinCalls(service, monkeypatch)
    third = await stubs.admit(user)
    assert third.status == S.JOB_STATUS_QUEUED and third.HasField("estimated_start_time")
    assert checkouts.count == 2


@pytest.mark.parametrize(
    ("figure", "read_at"),
    [("capacity_state", "_capacity_read_at"), ("recent_judging_seconds", "_mean_read_at")],
)
async def test_the_admits_answered_while_a_stale_figure_is_read_answer_from_the_figures_in_hand(
    service, monkeypatch, figure: str, read_at: str
) -> None:
    """A queued admit's answer reads a stale figure of its estimate again (the capacity's state,
    the mean judging time). The admits answered while that read is under way answer from the
    figures in hand, not each with a read of its own: 64 admits at once read the capacity's
    state, cached for a second, five times a second."""
    for constant in ("_CAPACITY_CACHE_SECONDS", "_ESTIMATE_CACHE_SECONDS", "_UNKNOWN_MEAN_RETRY_SECONDS"):
        monkeypatch.setattr(job_reads, constant, 3600.0)  # nothing goes stale but what the test makes stale
    stubs = service.stubs
    users = [new_user() for _ in range(8)]
    for user in users:
        await stubs.grant(user, 5)
        first = await stubs.admit(user)
        await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    await stubs.admit(users[0])  # queued: its answer read both figures
    read = getattr(Statements, figure)
    calls = 0

    async def slow_read(self: Statements) -> object:
        nonlocal calls
        calls += 1
        await asyncio.sleep(1.0)  # a database under load
        return await read(self)

    monkeypatch.setattr(Statements, figure, slow_read)
    setattr(service.app.reads, read_at, time.monotonic() - 7200.0)  # read once, long ago
    answers = await asyncio.gather(*(stubs.admit(user) for user in users))
    assert [answer.status for answer in answers] == [S.JOB_STATUS_QUEUED] * len(users)
    assert calls == 1


@pytest.mark.parametrize(
    ("case", "code", "reason"),
    [
        ("invalid", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
        ("bad_doi", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
        ("core_rejects_document", grpc.StatusCode.INVALID_ARGUMENT, "CORE_REJECTED"),
        ("core_rejects_doi", grpc.StatusCode.INVALID_ARGUMENT, "CORE_REJECTED"),
        ("no_credit", grpc.StatusCode.FAILED_PRECONDITION, "INSUFFICIENT_CREDITS"),
        ("key_reused", grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED"),
        ("delta_unknown", grpc.StatusCode.NOT_FOUND, "DELTA_BASE_NOT_FOUND"),
        ("delta_other_user", grpc.StatusCode.NOT_FOUND, "DELTA_BASE_NOT_FOUND"),
        ("delta_unfinished", grpc.StatusCode.FAILED_PRECONDITION, "DELTA_BASE_NOT_FINISHED"),
        ("budget", grpc.StatusCode.RESOURCE_EXHAUSTED, "PROVIDER_BUDGET_EXHAUSTED"),
        ("queue_full", grpc.StatusCode.RESOURCE_EXHAUSTED, "USER_QUEUE_FULL"),
        ("core_down", grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE"),
        ("core_hangs", grpc.StatusCode.UNAVAILABLE, "CORE_UNAVAILABLE"),
    ],
)
async def test_every_admit_error_has_its_code_and_reason_and_leaves_nothing_behind(
    services, database_url: str, case: str, code: grpc.StatusCode, reason: str
) -> None:
    core = await services.core(daily_budget=0 if case == "budget" else 1_000_000)
    service = await services.start(core, max_queued_per_user=2, core_deadline_seconds=1.0)
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 0 + (0 if case == "no_credit" else 10)) if case != "no_credit" else None
    kwargs: dict = {}
    before = (0, 0)
    if case == "invalid":
        request = queue_pb2.AdmitRequest(user_id="", idempotency_key="", sources=[])
    elif case == "bad_doi":
        kwargs = {"dois": ("not-a-doi",)}
    elif case == "core_rejects_document":
        kwargs = {"uri": "s3://theses/unparseable.pdf"}
    elif case == "core_rejects_doi":
        kwargs = {"dois": ("10.1234/ok", "10.9999/unregistered")}
    elif case == "key_reused":
        await stubs.admit(user, "click-1")
        kwargs = {"key": "click-1", "uri": "s3://theses/another.pdf"}
    elif case == "delta_unknown":
        kwargs = {"delta_of": str(uuid.uuid4())}
    elif case == "delta_other_user":
        other = new_user()
        await stubs.grant(other, 1)
        base = await stubs.admit(other)
        await stubs.wait_for(base.job_id, S.JOB_STATUS_RUNNING)
        await stubs.complete(base.run_id)
        kwargs = {"delta_of": base.job_id}
    elif case == "delta_unfinished":
        base = await stubs.admit(user)
        kwargs = {"delta_of": base.job_id}
    elif case == "queue_full":
        for _ in range(3):  # one active, two queued: the cap
            await stubs.admit(user)
    elif case == "core_down":
        core.unavailable = True
    elif case == "core_hangs":
        core.slow_seconds = 30
    before = _rows_for(database_url, user)
    balance_before = await stubs.balance(user) if user else 0

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        if case == "invalid":
            await stubs.queue.Admit(request, timeout=10)
        else:
            await stubs.admit(user, **kwargs)
    got_code, got_reason, metadata, violations = error_info(raised.value)
    assert (got_code, got_reason) == (code, reason), raised.value.details()

    if case == "invalid":
        assert {field for field, _ in violations} >= {"user_id", "idempotency_key", "sources", "document.uri"}
    if case == "bad_doi":
        assert [field for field, _ in violations] == ["sources[0].doi"]
    if case == "no_credit":
        assert metadata == {"balance": "0", "required": "1"}
        assert "balance 0, required 1" in raised.value.details()
    if case == "queue_full":
        assert metadata["maxQueued"] == "2"
    if case == "core_hangs":
        core.slow_seconds = 0
    assert _rows_for(database_url, user) == before
    assert await stubs.balance(user) == balance_before
    await asyncio.sleep(0.05)
    assert _live_orphan_held_runs(service, database_url) == []


async def test_insufficient_credit_found_under_the_lock_cancels_the_held_run(service, database_url: str) -> None:
    """Two concurrent admits with credit for one: both pass the pre-check, one loses under the lock."""
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 1)
    service.core.slow_seconds = 0.3  # both admits are past the pre-check before either commits
    results = await asyncio.gather(stubs.admit(user), stubs.admit(user), return_exceptions=True)
    service.core.slow_seconds = 0
    failures = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(failures) == 1
    assert error_info(failures[0])[:3] == (grpc.StatusCode.FAILED_PRECONDITION, "INSUFFICIENT_CREDITS", {"balance": "0", "required": "1"})
    assert await stubs.balance(user) == 0
    assert _rows_for(database_url, user) == (1, 1)
    assert _live_orphan_held_runs(service, database_url) == []


async def test_same_key_same_payload_returns_the_same_job_and_charges_once(service, database_url: str) -> None:
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 5)
    service.core.slow_seconds = 0.2  # widen the race window
    jobs = await asyncio.gather(*[stubs.admit(user, "the-click") for _ in range(10)])
    service.core.slow_seconds = 0
    assert len({j.job_id for j in jobs}) == 1
    assert await stubs.balance(user) == 4
    assert _rows_for(database_url, user) == (1, 1)
    again = await stubs.admit(user, "the-click")
    assert again.job_id == jobs[0].job_id
    assert await stubs.balance(user) == 4
    await asyncio.sleep(0.05)
    assert _live_orphan_held_runs(service, database_url) == []


async def test_concurrent_repeats_of_one_admit_make_one_run_at_the_core(service, database_url: str) -> None:
    """Only the admit whose reservation holds the key calls CreateRun (with its ~0.9 MB of sources);
    the repeats wait for its outcome and answer its job, three rounds of eight."""
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 5)
    # 900 sources of ~1 KB: what each repeat used to send to the core in full.
    sources = [job_pb2.Source(doi=f"10.1234/{i:04d}", citation=f"Cited {i}: " + "x" * 1000) for i in range(900)]

    def admit(key: str) -> queue_pb2.AdmitRequest:
        return queue_pb2.AdmitRequest(
            user_id=user, idempotency_key=key, document=job_pb2.Document(uri="s3://theses/t.pdf"), sources=sources
        )

    service.core.slow_seconds = 0.2  # the first admit's CreateRun takes a while: the repeats arrive meanwhile
    try:
        for round_ in range(3):
            answers = await asyncio.gather(*[stubs.queue.Admit(admit(f"the-click-{round_}"), timeout=30) for _ in range(8)])
            assert len({a.job.job_id for a in answers}) == 1
    finally:
        service.core.slow_seconds = 0
    creates = [run for run in service.core.runs.values() if run.user_id == user]
    assert len(creates) == 3, f"{len(creates)} runs created at the core for 3 admits (the repeats made {len(creates) - 3})"
    assert await stubs.balance(user) == 2
    assert _rows_for(database_url, user) == (3, 3)


async def test_a_repeat_whose_first_admit_vanished_answers_before_its_deadline_and_admits_once_the_key_is_free(
    service, database_url: str
) -> None:
    """A live reservation of the key whose admit is gone (its replica died mid-CreateRun) keeps a
    repeat waiting no longer than half its deadline: it hears ABORTED CONFLICT (retry with the same
    key). Once the sweeper claims that reservation for its cancel, the key is free and the repeat
    is admitted with a run of its own."""
    stubs = service.stubs
    user = new_user()
    await stubs.grant(user, 1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO run_reservations (run_id, user_id, cancel_after, idempotency_key) "
            "VALUES (%s, %s, clock_timestamp() + interval '1 hour', 'the-click')",
            (uuid.uuid4(), user),
        )
    started = asyncio.get_running_loop().time()
    with pytest.raises(grpc.aio.AioRpcError) as waited:
        await stubs.admit(user, "the-click", timeout=4)
    took = asyncio.get_running_loop().time() - started
    assert (error_info(waited.value)[:2]) == (grpc.StatusCode.ABORTED, "CONFLICT"), waited.value
    assert 1.0 < took < 3.5, f"answered after {took:.2f} s of a 4 s deadline"
    assert [run for run in service.core.runs.values() if run.user_id == user] == []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE run_reservations SET canceling = true WHERE user_id = %s", (user,))
    job = await stubs.admit(user, "the-click")
    assert job.status in (S.JOB_STATUS_PENDING, S.JOB_STATUS_RUNNING)
    assert await stubs.balance(user) == 0


async def test_grants_are_idempotent_by_key_and_refuse_a_reused_key(service) -> None:
    stubs = service.stubs
    user = new_user()
    assert await stubs.grant(user, 3, key="grant-a") == 3
    assert await stubs.grant(user, 3, key="grant-a") == 3
    results = await asyncio.gather(*[stubs.grant(user, 2, key="grant-b") for _ in range(5)])
    assert set(results) <= {5} and await stubs.balance(user) == 5
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.grant(user, 9, key="grant-a")
    assert error_info(raised.value)[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stubs.grant(user, 0, key="grant-c")
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason, [f for f, _ in violations]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", ["amount"])
    assert await stubs.balance(new_user()) == 0


async def test_plan_tier_override_gives_a_user_more_slots_in_fifo_order(service, database_url: str) -> None:
    stubs = service.stubs
    user = new_user()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO user_queue_limits (user_id, max_active) VALUES (%s, 2)", (user,))
    await stubs.grant(user, 5)
    jobs = [await stubs.admit(user, f"k{i}") for i in range(5)]
    assert [j.status for j in jobs] == [S.JOB_STATUS_PENDING] * 2 + [S.JOB_STATUS_QUEUED] * 3
    assert [j.queue_position for j in jobs] == [0, 0, 1, 2, 3]
    await stubs.wait_for(jobs[1].job_id, S.JOB_STATUS_RUNNING)
    await service.core.finish(jobs[1].run_id)  # the second slot frees first: the oldest queued takes it
    assert (await stubs.wait_for(jobs[2].job_id, S.JOB_STATUS_RUNNING)).status == S.JOB_STATUS_RUNNING
    assert (await stubs.job(jobs[3].job_id)).queue_position == 1
    checker = InvariantChecker(database_url)
    assert checker.all_violations() == []
    assert service.core.max_concurrent_judging[user] == 2


async def test_validation_reports_every_violation_and_limits(service) -> None:
    request = queue_pb2.AdmitRequest(
        user_id="u" * 129,
        idempotency_key="key\x00",
        document=job_pb2.Document(uri="s3://x", title="t" * 600),
        sources=[job_pb2.Source(), job_pb2.Source(doi="10.1234/ok", citation="c" * 5000)],
        delta_of_job_id="not-a-uuid",
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.queue.Admit(request, timeout=5)
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert [f for f, _ in violations] == [
        "user_id",
        "idempotency_key",
        "delta_of_job_id",
        "document.title",
        "sources[0]",
        "sources[1].citation",
    ]
    too_many = queue_pb2.AdmitRequest(
        user_id="u",
        idempotency_key="k",
        document=job_pb2.Document(uri="s3://x"),
        sources=[job_pb2.Source(doi="10.1234/x")] * 1001,
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.queue.Admit(too_many, timeout=5)
    assert [f for f, _ in error_info(raised.value)[3]] == ["sources"]


async def _admit_names_each_fields_character(service, user: str, characters: str, described: Callable[[str, int, int], str]) -> None:
    """An Admit with one of `characters` in each field a user stores (key, uri, title, a DOI, a
    citation; then the user id) is refused INVALID_REQUEST, each field naming its character and
    where it stands (`described`)."""
    key, uri, title, doi, citation, user_id = characters
    request = queue_pb2.AdmitRequest(
        user_id=user,
        idempotency_key=f"click{key}-1",
        document=job_pb2.Document(uri=f"s3://theses/{uri}thesis.pdf", title=f"On queues{title}"),
        sources=[
            job_pb2.Source(doi=f"10.1234/abc{doi}gpj.exe"),
            job_pb2.Source(doi="10.1234/ok", citation=f"Smith{citation} 2020"),
            job_pb2.Source(doi="10.1234/fine", citation="Jones 2021"),
        ],
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.queue.Admit(request, timeout=5)
    code, reason, _, violations = error_info(raised.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
    assert violations == [
        ("idempotency_key", described("idempotency_key", ord(key), 5)),
        ("document.uri", described("document.uri", ord(uri), 12)),
        ("document.title", described("document.title", ord(title), 9)),
        ("sources[0].doi", described("sources[0].doi", ord(doi), 11)),
        ("sources[1].citation", described("sources[1].citation", ord(citation), 5)),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.queue.Admit(queue_pb2.AdmitRequest(user_id=f"{user}{user_id}", idempotency_key="k"), timeout=5)
    assert ("user_id", described("user_id", ord(user_id), len(user))) in error_info(raised.value)[3]


async def test_bidirectional_control_characters_are_refused_in_every_field_a_user_stores(service, database_url: str) -> None:
    user = new_user()
    await service.stubs.grant(user, 5)
    # A DOI ending "\u202egpj.exe" displays as "...exe.jpg": each field names its first such character.
    await _admit_names_each_fields_character(service, user, "\u2066\u202a\u2069\u202e\u202d\u2067", _bidi)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await service.stubs.credits.GrantCredits(
            credits_pb2.GrantCreditsRequest(user_id=user, amount=1, idempotency_key="g", note="ticket \u202e1174"), timeout=5
        )
    assert error_info(raised.value)[3] == [("note", _bidi("note", 0x202E, 7))]
    assert _rows_for(database_url, user) == (0, 0)
    assert await service.stubs.balance(user) == 5  # the refused grant added nothing


async def test_invisible_characters_are_refused_in_every_text_field_naming_the_field_and_its_code_point(service, database_url: str) -> None:
    """Format characters (Cf: zero-width spaces and joiners, marks, the word joiner, the byte order
    mark, tags), C1 controls, the line and paragraph separators and the Hangul fillers are stored
    but not seen: a DOI with a zero-width space reads as one it is not, and a search for it as it
    reads finds nothing. Each field names its first such character; nothing is stored."""
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    user = new_user()
    await service.stubs.grant(user, 5)
    await _admit_names_each_fields_character(service, user, "\ufeff\u200b\u200d\u200b\u2060\u3164", _invisible)
    for character in ("\u200e", "\u200f", "\u061c", "\u2060", "\ufeff", "\u0085", "\u2028", "\U000e0041", "\u3164", "\u00ad"):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            grant = credits_pb2.GrantCreditsRequest(user_id=user, amount=1, idempotency_key="g", note=f"ticket {character}1174")
            await service.stubs.credits.GrantCredits(grant, timeout=5)
        assert error_info(raised.value)[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(raised.value)[3] == [("note", _invisible("note", ord(character), 7))], hex(ord(character))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            pause = op_pb2.SetReleasesPausedRequest(paused=True, user_id=user, note=f"ticket {character}1174")
            await operator.SetReleasesPaused(pause, timeout=5)
        assert error_info(raised.value)[3] == [("note", _invisible("note", ord(character), 7))], hex(ord(character))
    assert _rows_for(database_url, user) == (0, 0)
    assert await service.stubs.balance(user) == 5  # no refused grant added anything
    assert not (await operator.GetUserSettings(op_pb2.GetUserSettingsRequest(user_id=user), timeout=5)).releases_paused


def _invisible(field: str, code_point: int, at: int) -> str:
    return (
        f"{field} must not contain invisible characters (format characters such as zero-width spaces and joiners, "
        f"C1 controls, line or paragraph separators, Hangul fillers): U+{code_point:04X} at character {at} "
        "would be stored but not seen, so the text would not be what it reads as"
    )


async def test_a_uri_the_search_index_cannot_hold_is_refused_by_its_bytes_never_answered_retry(service, database_url: str) -> None:
    """A uri of 700 characters of 4 bytes each (2 805 bytes) is within the 2 048 characters but not
    within the btree entry of the uri's index (about 2.7 KB): refused at validation by its UTF-8
    bytes, naming the field, before the core hears of it; never UNAVAILABLE `OUTCOME_UNKNOWN`
    ("retry the same request"), which every retry would have met again."""
    user = new_user()
    await service.stubs.grant(user, 2)
    created_before = len(service.core.runs)
    rng = random.Random(6)
    request = queue_pb2.AdmitRequest(
        user_id=user,
        idempotency_key="wide-uri",
        # Random, as a hostile caller sends it: the same character repeated would compress into the entry.
        document=job_pb2.Document(uri="s3://" + "".join(chr(rng.randint(0x20000, 0x2A6DF)) for _ in range(700))),
        sources=[job_pb2.Source(doi="10.1234/wide")],
    )
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await service.stubs.queue.Admit(request, timeout=10)
        code, reason, _, violations = error_info(raised.value)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"), raised.value.details()
        assert violations == [
            ("document.uri", "document.uri must be at most 2048 bytes in UTF-8 (got 2805: characters outside ASCII take 2 to 4 bytes each)")
        ]
    assert len(service.core.runs) == created_before  # refused before any run was created
    assert _rows_for(database_url, user) == (0, 0)
    assert await service.stubs.balance(user) == 2


async def test_a_statement_the_database_refuses_for_good_is_not_retry_and_cancels_the_held_run(service, database_url: str) -> None:
    """A valid admit whose insert the database refuses whatever the retry (here an index the
    validation knows nothing of, whose entry cannot hold the sources: SQLSTATE 54000, program
    limit exceeded) answers INVALID_ARGUMENT with the SQLSTATE, never UNAVAILABLE `OUTCOME_UNKNOWN`
    ("retry the same request"); the run created at the core for it is canceled (I5), at every
    attempt, and nothing is stored or charged."""
    user = new_user()
    await service.stubs.grant(user, 2)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE INDEX test_whole_sources ON analysis_jobs ((sources::text)) WHERE user_id = '{user}'")
    try:
        rng = random.Random(54)
        letters = string.ascii_letters + string.digits
        request = queue_pb2.AdmitRequest(
            user_id=user,
            idempotency_key="too-wide-for-an-index",
            document=job_pb2.Document(uri="s3://theses/t.pdf"),
            # Random citations: no compression fits them in an index entry.
            sources=[job_pb2.Source(doi=f"10.1234/s{i}", citation="".join(rng.choices(letters, k=2000))) for i in range(5)],
        )
        for _ in range(2):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await service.stubs.queue.Admit(request, timeout=10)
            code, reason, metadata, _ = error_info(raised.value)
            assert (code, reason, metadata) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", {"sqlstate": "54000"}), (
                raised.value.details()
            )
            assert "do not retry" in raised.value.details()
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DROP INDEX test_whole_sources")
    runs = [run for run in service.core.runs.values() if run.user_id == user]
    assert len(runs) == 2

    async def every_run_canceled() -> bool:
        return all(run.state == core_pb2.RUN_STATE_CANCELED for run in runs)

    await until(every_run_canceled, within=10, what="the refused admits' runs canceled at the core")
    assert _rows_for(database_url, user) == (0, 0)
    assert await service.stubs.balance(user) == 2


def _bidi(field: str, code_point: int, at: int) -> str:
    return (
        f"{field} must not contain bidirectional control characters (U+202A-U+202E, U+2066-U+2069): "
        f"U+{code_point:04X} at character {at} makes the text display in another order than it is stored"
    )


async def test_lowering_a_users_limit_never_lets_more_jobs_run_than_the_new_limit(service, database_url: str) -> None:
    stubs = service.stubs
    user = new_user()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO user_queue_limits (user_id, max_active) VALUES (%s, 2)", (user,))
    await stubs.grant(user, 4)
    first, second, third, fourth = [await stubs.admit(user) for _ in range(4)]
    assert [first.status, second.status] == [S.JOB_STATUS_PENDING] * 2
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE user_queue_limits SET max_active = 1 WHERE user_id = %s", (user,))
    await stubs.wait_for(first.job_id, S.JOB_STATUS_RUNNING)
    await service.core.finish(first.run_id)  # slot 1 frees while slot 2 is held: nothing may start
    assert (await stubs.job(third.job_id)).status == S.JOB_STATUS_QUEUED
    await stubs.wait_for(second.job_id, S.JOB_STATUS_RUNNING)
    await service.core.finish(second.run_id)
    await stubs.wait_for(third.job_id, S.JOB_STATUS_RUNNING)
    assert (await stubs.job(fourth.job_id)).status == S.JOB_STATUS_QUEUED
    assert InvariantChecker(database_url).i1_slot_limit() == []
