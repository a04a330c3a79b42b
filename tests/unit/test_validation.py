"""Request validation: each rule names its field, every violation is reported at once, and a
request with very many is capped at 50 listed (the count and the unlisted rest in metadata)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from queue_service._gen.acurio.queue.v1 import job_pb2
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.api.servicers import validation
from queue_service.errors import InvalidRequest

DOI = "10.1234/abc"


def admit(
    *,
    user_id: str = "ada",
    idempotency_key: str = "click-1",
    document: job_pb2.Document | None = None,
    sources: list[job_pb2.Source] | None = None,
    delta_of_job_id: str = "",
) -> queue_pb2.AdmitRequest:
    return queue_pb2.AdmitRequest(
        user_id=user_id,
        idempotency_key=idempotency_key,
        document=job_pb2.Document(uri="s3://theses/1.pdf", title="Thesis") if document is None else document,
        sources=[job_pb2.Source(doi=DOI)] if sources is None else sources,
        delta_of_job_id=delta_of_job_id,
    )


def violations_of(request: queue_pb2.AdmitRequest) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as refused:
        validation.validate_admit(request)
    assert refused.value.reason == "INVALID_REQUEST"
    return dict(refused.value.field_violations)


def test_a_well_formed_admit_passes() -> None:
    assert validation.validate_admit(admit()) is None
    base = uuid.uuid4()
    assert validation.validate_admit(admit(delta_of_job_id=str(base), document=job_pb2.Document())) == base


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        ({"user_id": ""}, "user_id", "required"),
        ({"user_id": "u" * 129}, "user_id", "at most 128 characters (got 129)"),
        ({"user_id": "ada\n"}, "user_id", "printable"),
        ({"idempotency_key": ""}, "idempotency_key", "required"),
        ({"idempotency_key": "k\x00"}, "idempotency_key", "printable"),
        ({"delta_of_job_id": "not-a-uuid"}, "delta_of_job_id", "must be a UUID"),
        ({"delta_of_job_id": "0" * 65}, "delta_of_job_id", "must be a UUID"),
        ({"document": job_pb2.Document()}, "document.uri", "required"),
        ({"document": job_pb2.Document(uri="s3://" + "x" * 2044)}, "document.uri", "at most 2048 characters"),
        ({"document": job_pb2.Document(uri="s3://a\x00b")}, "document.uri", "NUL"),
        ({"document": job_pb2.Document(uri="s3://a", title="t" * 513)}, "document.title", "at most 512 characters"),
        ({"sources": []}, "sources", "at least one source"),
        ({"sources": [job_pb2.Source(doi=DOI)] * 1001}, "sources", "at most 1000 sources"),
        ({"sources": [job_pb2.Source()]}, "sources[0]", "needs a doi or a citation"),
        ({"sources": [job_pb2.Source(doi="10.1234/" + "x" * 250)]}, "sources[0].doi", "at most 256 characters"),
        ({"sources": [job_pb2.Source(doi="doi:10.1234/abc")]}, "sources[0].doi", "is not a DOI"),
        ({"sources": [job_pb2.Source(doi="10.12/abc")]}, "sources[0].doi", "is not a DOI"),  # registrant too short
        ({"sources": [job_pb2.Source(doi="10.1234/a b")]}, "sources[0].doi", "is not a DOI"),
        ({"sources": [job_pb2.Source(citation="c" * 2049)]}, "sources[0].citation", "at most 2048 characters"),
        ({"sources": [job_pb2.Source(doi=DOI, citation="a\x00")]}, "sources[0].citation", "NUL"),
    ],
)
def test_each_rule_names_its_field(overrides: dict[str, Any], field: str, says: str) -> None:
    found = violations_of(admit(**overrides))
    assert list(found) == [field]
    assert says in found[field]


def test_every_violation_is_reported_at_once_in_field_order() -> None:
    request = admit(
        user_id="",
        idempotency_key="",
        document=job_pb2.Document(),
        sources=[job_pb2.Source(doi=DOI), job_pb2.Source(), job_pb2.Source(doi="nope")],
    )
    assert list(violations_of(request)) == ["user_id", "idempotency_key", "document.uri", "sources[1]", "sources[2].doi"]


def test_a_delta_needs_no_document_uri_but_keeps_the_other_rules() -> None:
    request = admit(delta_of_job_id=str(uuid.uuid4()), document=job_pb2.Document(title="t" * 600))
    assert list(violations_of(request)) == ["document.title"]


def test_a_doi_is_quoted_shortened_in_its_message() -> None:
    description = violations_of(admit(sources=[job_pb2.Source(doi="x" * 200)]))["sources[0].doi"]
    assert repr("x" * 64) in description and "x" * 65 not in description


def test_the_bad_request_lists_at_most_50_violations_and_counts_the_rest() -> None:
    request = admit(sources=[job_pb2.Source()] * 60)
    with pytest.raises(InvalidRequest) as refused:
        validation.validate_admit(request)
    error = refused.value
    assert len(error.field_violations) == validation.MAX_LISTED_VIOLATIONS == 50
    assert error.field_violations[0][0] == "sources[0]" and error.field_violations[-1][0] == "sources[49]"
    assert error.metadata == {"violations": "60", "violationsNotListed": "10"}
    # The message names the first ten fields and how many more there are.
    assert error.message.startswith("invalid request: sources[0], sources[1],")
    assert "sources[9] and 50 more" in error.message and "sources[10]" not in error.message


def test_exactly_50_violations_are_all_listed() -> None:
    with pytest.raises(InvalidRequest) as refused:
        validation.validate_admit(admit(sources=[job_pb2.Source()] * 50))
    assert len(refused.value.field_violations) == 50
    assert refused.value.metadata == {"violations": "50"}


def test_a_single_violation_counts_one_and_lists_its_field() -> None:
    with pytest.raises(InvalidRequest) as refused:
        validation.validate_user_id("")
    assert refused.value.metadata == {"violations": "1"}
    assert refused.value.message == "invalid request: user_id"


def test_user_ids() -> None:
    validation.validate_user_id("ada")
    validation.validate_user_id("u" * 128)
    for bad in ("", "u" * 129, "tab\there", "\x7f"):
        with pytest.raises(InvalidRequest):
            validation.validate_user_id(bad)


def test_job_ids() -> None:
    job_id = uuid.uuid4()
    assert validation.validate_job_id(str(job_id)) == job_id
    assert validation.validate_job_id(job_id.hex) == job_id  # uuid's own spellings are accepted
    with pytest.raises(InvalidRequest) as refused:
        validation.validate_job_id("", field="delta_of_job_id")
    assert refused.value.field_violations == [("delta_of_job_id", "delta_of_job_id is required")]
    with pytest.raises(InvalidRequest):
        validation.validate_job_id("123")


@pytest.mark.parametrize(("given", "used"), [(0, 20), (1, 1), (100, 100)])
def test_page_sizes(given: int, used: int) -> None:
    assert validation.validate_page_size(given) == used


@pytest.mark.parametrize("page_size", [-1, 101, 2**31 - 1])
def test_page_sizes_out_of_range(page_size: int) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validation.validate_page_size(page_size)
    assert refused.value.field_violations == [("page_size", "page_size must be between 0 and 100; 0 means 20")]
    assert f"(got {page_size})" in refused.value.message


def test_the_invisible_characters_are_every_format_character_of_this_pythons_unicode_and_the_named_others() -> None:
    """The ranges are written out (a regex built at import would walk 1.1 million code points):
    they must be exactly category Cf of the running Python's Unicode database, plus the C1
    controls, the line and paragraph separators and the Hangul fillers."""
    import unicodedata

    others = {*range(0x80, 0xA0), 0x2028, 0x2029, 0x115F, 0x1160, 0x3164, 0xFFA0}
    expected = {cp for cp in range(0x110000) if unicodedata.category(chr(cp)) == "Cf"} | others
    matched = {cp for cp in range(0x110000) if validation._INVISIBLE.fullmatch(chr(cp))}
    assert matched == expected


@pytest.mark.parametrize("sql_file", ["functions/queue_doi_search_key.sql", "migrations/0036_doi_search_keys_as_they_read.sql"])
def test_the_doi_search_keys_drop_exactly_the_characters_validation_refuses_as_invisible(sql_file: str) -> None:
    """The database writes a DOI's search key without them (a DOI stored before validation refused
    them is found as it reads): its class, written out in SQL (`\\uXXXX`, `\\UXXXXXXXX`, which
    Python's re reads alike), must be validation's set."""
    import re
    from pathlib import Path

    import queue_service.store

    text = (Path(queue_service.store.__file__).parent / "sql" / sql_file).read_text()
    classes = set(re.findall(r"'(\[\\u[^']*\])'", text))
    assert len(classes) == 1, classes
    written = re.compile(classes.pop())
    matched = {cp for cp in range(0x110000) if written.fullmatch(chr(cp))}
    assert matched == {cp for cp in range(0x110000) if validation._INVISIBLE.fullmatch(chr(cp))}


@pytest.mark.parametrize(
    "character",
    ["\u200b", "\u200d", "\u200e", "\u061c", "\u2060", "\ufeff", "\u0085", "\u2028", "\U000e0041", "\u3164", "\u00ad", "\u202e"],
)
def test_an_invisible_character_is_refused_in_every_admit_field_naming_its_code_point(character: str) -> None:
    request = admit(
        user_id=f"ada{character}",
        idempotency_key=f"click{character}",
        document=job_pb2.Document(uri=f"s3://theses/{character}1.pdf", title=f"Thesis{character}"),
        sources=[job_pb2.Source(doi=f"10.1234/abc{character}"), job_pb2.Source(doi=DOI, citation=f"Smith{character} 2020")],
    )
    found = violations_of(request)
    assert sorted(found) == sorted(
        ["user_id", "idempotency_key", "document.uri", "document.title", "sources[0].doi", "sources[1].citation"]
    )
    for field, says in found.items():
        assert f"U+{ord(character):04X}" in says, (field, says)


def test_uris_and_dois_are_bounded_in_utf8_bytes_too() -> None:
    wide = "\U00020000"  # 4 bytes in UTF-8
    found = violations_of(
        admit(
            document=job_pb2.Document(uri="s3://" + wide * 600),
            sources=[job_pb2.Source(doi="10.1234/" + wide * 63), job_pb2.Source(doi="10.1234/" + wide * 62)],
        )
    )
    assert set(found) == {"document.uri", "sources[0].doi"}
    assert "at most 2048 bytes" in found["document.uri"] and "at most 256 bytes" in found["sources[0].doi"]
