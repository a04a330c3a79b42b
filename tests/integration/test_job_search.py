"""OperatorService.SearchJobs in what jobs judge (JobFilter's document uri prefix, title words and
source DOI), through the public gRPC API against real PostgreSQL: matches, keyset pages, the
search kept after the sources are pruned, bulk cancel by the same filter, and precise refusals."""

from __future__ import annotations

import hashlib
import uuid

import grpc
import psycopg
import pytest

from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2 as op_pb2
from queue_service._gen.acurio.queue.v1 import operator_service_pb2_grpc as op_grpc
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from tests.harness import error_info, new_user


async def _admit(service, user: str, *, uri: str, title: str, dois: list[str]) -> job_pb2.Job:  # type: ignore[no-untyped-def]
    request = queue_pb2.AdmitRequest(
        user_id=user,
        idempotency_key=uuid.uuid4().hex,
        document=job_pb2.Document(uri=uri, title=title),
        sources=[job_pb2.Source(doi=doi, citation=f"Cited {doi}") for doi in dois],
    )
    return (await service.stubs.queue.Admit(request, timeout=20)).job


async def _search_all(operator: op_grpc.OperatorServiceStub, job_filter: op_pb2.JobFilter, page_size: int = 1) -> list[str]:
    """Every matching job id, newest admitted first, page by page."""
    found: list[str] = []
    token = ""
    while True:
        request = op_pb2.SearchJobsRequest(filter=job_filter, page_size=page_size, page_token=token)
        page = await operator.SearchJobs(request, timeout=10)
        found.extend(job.job_id for job in page.jobs)
        token = page.next_page_token
        if not token:
            return found


async def test_search_by_document_uri_title_words_and_doi_pages_and_outlives_the_pruned_sources(service, database_url: str) -> None:  # type: ignore[no-untyped-def]
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    user, other = new_user(), new_user()
    for who in (user, other):
        await service.stubs.grant(who, 10)
    mark = uuid.uuid4().hex[:10]  # words, DOIs and uris no other test's jobs hold
    base = f"s3://theses-{mark}/"
    fair = await _admit(
        service, user, uri=f"{base}fair.pdf", title=f"Fair queues {mark} for citation analysis", dois=[f"10.5555/{mark}.Q", "10.5555/x"]
    )
    graphs = await _admit(service, other, uri=f"{base}graphs.pdf", title=f"On citation graphs {mark}", dois=[f"10.5555/{mark}.q"])
    unrelated = await _admit(service, other, uri=f"s3://elsewhere-{mark}/x.pdf", title="Unrelated", dois=[f"10.5555/{mark}.other"])

    # A DOI is case-insensitive, and a pasted `doi:` or resolver address in front is ignored.
    for pasted in (f"10.5555/{mark}.Q", f"  doi:10.5555/{mark}.q ", f"https://doi.org/10.5555/{mark.upper()}.Q"):
        assert await _search_all(operator, op_pb2.JobFilter(source_doi=pasted)) == [graphs.job_id, fair.job_id], pasted
    # A uri prefix, and a whole uri (a prefix of itself).
    assert await _search_all(operator, op_pb2.JobFilter(document_uri_prefix=base)) == [graphs.job_id, fair.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(document_uri_prefix=f"{base}fair.pdf")) == [fair.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(document_uri_prefix=f"{base}FAIR")) == []
    # Title words: every word, any order, any case, whole words.
    assert await _search_all(operator, op_pb2.JobFilter(title_words=f"{mark} citation")) == [graphs.job_id, fair.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(title_words=f"CITATION, queues {mark}")) == [fair.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(title_words=f"{mark} queue")) == []
    # Every set field narrows the match, the search fields and the others alike.
    assert await _search_all(operator, op_pb2.JobFilter(title_words=mark, user_id=other)) == [graphs.job_id]
    both = op_pb2.JobFilter(document_uri_prefix=f"s3://elsewhere-{mark}/", source_doi=f"10.5555/{mark}.OTHER")
    assert await _search_all(operator, both) == [unrelated.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(document_uri_prefix=base, source_doi=f"10.5555/{mark}.other")) == []

    # A page token is tied to its search: the next page under another DOI is refused.
    first = await operator.SearchJobs(op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(document_uri_prefix=base), page_size=1), timeout=10)
    assert first.next_page_token
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        request = op_pb2.SearchJobsRequest(filter=op_pb2.JobFilter(document_uri_prefix=f"{base}f"), page_token=first.next_page_token)
        await operator.SearchJobs(request, timeout=10)
    assert error_info(raised.value)[3][0][0] == "page_token"

    # The pruner empties an ended job's sources after a day (QUEUE_JOB_INPUTS_RETENTION_SECONDS):
    # the DOIs of its preview (its first 10 sources, which its detail still shows) stay searchable
    # for as long as the job row is kept; the others go with the sources (docs/security.md).
    long_list = await _admit(
        service, other, uri=f"{base}long.pdf", title="Long list", dois=[f"10.5555/{mark}.{i}" for i in range(10)] + [f"10.5555/{mark}.last"]
    )
    assert await _search_all(operator, op_pb2.JobFilter(source_doi=f"10.5555/{mark}.last")) == [long_list.job_id]
    pruned = [uuid.UUID(fair.job_id), uuid.UUID(graphs.job_id), uuid.UUID(long_list.job_id)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE analysis_jobs SET sources = NULL WHERE job_id = ANY(%s)", (pruned,))
    assert await _search_all(operator, op_pb2.JobFilter(source_doi=f"10.5555/{mark}.Q")) == [graphs.job_id, fair.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(source_doi=f"10.5555/{mark}.9")) == [long_list.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(source_doi=f"10.5555/{mark}.last")) == []

    # A bulk cancel takes the same filter: a dry run counts only the active jobs it matches.
    counted = await operator.CancelJobs(op_pb2.CancelJobsRequest(filter=op_pb2.JobFilter(source_doi=f"10.5555/{mark}.q"), dry_run=True))
    assert counted.matched == 2

    # So does a bulk retry: of the failed jobs, only those citing the DOI.
    running = await service.stubs.wait_for(fair.job_id, job_pb2.JOB_STATUS_RUNNING)
    await service.stubs.complete(running.run_id, succeeded=False)
    for doi, matched in ((f"10.5555/{mark}.q", 1), (f"10.5555/{mark}.other", 0)):
        request = op_pb2.RetryJobsRequest(filter=op_pb2.JobFilter(source_doi=doi), dry_run=True)
        assert (await operator.RetryJobs(request, timeout=10)).matched == matched, doi


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("document_uri_prefix", "   ", "empty after trimming"),
        ("document_uri_prefix", "s3://" + "u" * 2044, "at most 2048 characters"),
        ("title_words", " \t ", "empty after trimming"),
        ("title_words", "w" * 513, "at most 512 characters"),
        ("title_words", "-- !! ?", "at least one word"),
        ("source_doi", "  ", "empty after trimming"),
        ("source_doi", "10.5555/" + "d" * 249, "at most 256 characters"),
        ("source_doi", "a thesis title", "is not a DOI"),
        ("source_doi", "doi:", "holds no DOI"),
        # Invisible characters, each named by its code point (a search for text as it reads).
        ("source_doi", "10.5555/ab\u200bc", "U+200B at character 10"),
        ("title_words", "fair\u2060queues", "U+2060 at character 4"),
        ("document_uri_prefix", "s3://theses/\ufeff", "U+FEFF at character 12"),
        ("title_words", "fair queues\u2028", "U+2028 at character 11"),
    ],
)
async def test_search_fields_too_long_or_empty_after_trimming_are_invalid_argument(service, field: str, value: str, problem: str) -> None:  # type: ignore[no-untyped-def]
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    job_filter = op_pb2.JobFilter(**{field: value})
    for call in (
        operator.SearchJobs(op_pb2.SearchJobsRequest(filter=job_filter), timeout=10),
        operator.CancelJobs(op_pb2.CancelJobsRequest(filter=job_filter, dry_run=True), timeout=10),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call
        code, reason, _, violations = error_info(raised.value)
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST")
        assert violations[0][0] == f"filter.{field}" and problem in violations[0][1], violations


def _doi_bucket(doi: str) -> int:
    """The bucket of a DOI's search key, as functions/queue_doi_search_buckets.sql computes it."""
    return int(hashlib.md5(doi.lower().encode()).hexdigest()[:4], 16) % 16384


async def test_a_search_by_doi_finds_the_jobs_citing_it_not_those_citing_another_doi_of_its_bucket(service, database_url: str) -> None:  # type: ignore[no-untyped-def]
    """The search by DOI reads the jobs in the DOI's bucket (a bounded index, migration 0041) and
    keeps those that cite the DOI itself: a job citing another DOI of the same bucket is not found,
    and the database computes the buckets as stated here."""
    operator = op_grpc.OperatorServiceStub(service.stubs.channel)
    user = new_user()
    await service.stubs.grant(user, 3)
    mark = uuid.uuid4().hex[:10]
    wanted = f"10.5555/{mark}.wanted"
    neighbour = next(d for d in (f"10.5555/{mark}.n{i}" for i in range(1_000_000)) if _doi_bucket(d) == _doi_bucket(wanted))
    citing = await _admit(service, user, uri=f"s3://buckets-{mark}/a.pdf", title="Citing", dois=[wanted, "10.5555/other"])
    beside = await _admit(service, user, uri=f"s3://buckets-{mark}/b.pdf", title="Beside", dois=[neighbour])
    with psycopg.connect(database_url) as conn:
        buckets = conn.execute(
            "SELECT job_id::text, source_doi_buckets FROM analysis_job_search_keys WHERE job_id = ANY(%s::uuid[])",
            ([citing.job_id, beside.job_id],),
        ).fetchall()
    assert dict(buckets)[beside.job_id] == [_doi_bucket(neighbour)]
    assert _doi_bucket(wanted) in dict(buckets)[citing.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(source_doi=wanted)) == [citing.job_id]
    assert await _search_all(operator, op_pb2.JobFilter(source_doi=neighbour.upper())) == [beside.job_id]
