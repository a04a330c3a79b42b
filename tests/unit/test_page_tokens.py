"""Page tokens: a token comes back to the page it was issued for, is refused for any other filter,
and any other string (garbage, oversized, a forged payload) is INVALID_REQUEST, never a crash."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_service.api.servicers import page_tokens
from queue_service.errors import InvalidRequest
from queue_service.model import JobStatus

KEY = page_tokens.list_filter_key("ada", [JobStatus.QUEUED])
OTHER_KEY = page_tokens.list_filter_key("bob", [JobStatus.QUEUED])
SEARCH_KEY = page_tokens.filter_key("ada", ["failed"], True)

# Hypothesis runs a few dozen examples each: the whole unit folder stays within seconds.
QUICK = settings(max_examples=60, deadline=None)


def forged(payload: Any) -> str:
    """A token spelled by hand the way the codec spells its own (urlsafe base64 of JSON)."""
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def assert_refused(call: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        call()
    assert refused.value.reason == "INVALID_REQUEST"
    assert [field for field, _ in refused.value.field_violations] == ["page_token"]
    return refused.value


# -- ListJobs -----------------------------------------------------------------------------------


@QUICK
@given(st.uuids())
def test_a_list_token_returns_the_job_it_was_issued_after(job_id: uuid.UUID) -> None:
    token = page_tokens.encode_list_token(job_id, KEY)
    assert page_tokens.decode_list_token(token, KEY) == (job_id, None)
    assert len(token) <= 200  # within the size the decoder accepts


def test_an_empty_list_token_is_the_first_page() -> None:
    assert page_tokens.decode_list_token("", KEY) == (None, None)


def test_a_list_token_of_another_user_or_status_filter_is_refused() -> None:
    token = page_tokens.encode_list_token(uuid.uuid4(), KEY)
    refused = assert_refused(lambda: page_tokens.decode_list_token(token, OTHER_KEY))
    assert "same user_id and statuses" in refused.message
    other_statuses = page_tokens.list_filter_key("ada", [JobStatus.QUEUED, JobStatus.RUNNING])
    assert_refused(lambda: page_tokens.decode_list_token(token, other_statuses))


def test_the_list_filter_key_tells_filters_apart() -> None:
    keys = {
        page_tokens.list_filter_key("ada", []),
        page_tokens.list_filter_key("ada", [JobStatus.QUEUED]),
        page_tokens.list_filter_key("ada", [JobStatus.PENDING]),
        page_tokens.list_filter_key("bob", [JobStatus.QUEUED]),
        page_tokens.list_filter_key("ada", [JobStatus.QUEUED, JobStatus.PENDING]),
    }
    assert len(keys) == 5
    assert page_tokens.list_filter_key("ada", [JobStatus.QUEUED]) == KEY  # stable, not salted


def test_a_legacy_before_seq_token_still_pages() -> None:
    """Tokens of earlier versions carried the queue sequence to continue before (`b`)."""
    assert page_tokens.decode_list_token(forged({"b": 41, "f": KEY}), KEY) == (None, 41)
    assert page_tokens.decode_list_token(forged({"b": 2**63 - 1, "f": KEY}), KEY) == (None, 2**63 - 1)


@pytest.mark.parametrize("before_seq", [0, -1, 2**63, True, 1.5, "7", None, [1]])
def test_a_legacy_token_with_an_impossible_before_seq_is_refused(before_seq: object) -> None:
    assert_refused(lambda: page_tokens.decode_list_token(forged({"b": before_seq, "f": KEY}), KEY))


def test_a_legacy_token_of_another_filter_is_refused() -> None:
    assert_refused(lambda: page_tokens.decode_list_token(forged({"b": 41, "f": OTHER_KEY}), KEY))


def test_an_oversized_list_token_is_refused_before_it_is_decoded() -> None:
    padded = forged({"a": str(uuid.uuid4()), "f": KEY, "pad": "x" * 200})
    assert len(padded) > 200
    assert_refused(lambda: page_tokens.decode_list_token(padded, KEY))


# -- SearchJobs ---------------------------------------------------------------------------------

MOMENTS = st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(dt.UTC))


@QUICK
@given(MOMENTS, st.uuids())
def test_a_search_token_returns_its_keyset_position_to_the_microsecond(moment: dt.datetime, job_id: uuid.UUID) -> None:
    token = page_tokens.encode_search_token(moment, job_id, SEARCH_KEY)
    assert page_tokens.decode_search_token(token, SEARCH_KEY) == (moment, job_id)
    assert len(token) <= 300


def test_a_search_token_keeps_the_instant_of_a_non_utc_time() -> None:
    moment = dt.datetime(2024, 5, 1, 12, 30, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    job_id = uuid.uuid4()
    decoded = page_tokens.decode_search_token(page_tokens.encode_search_token(moment, job_id, SEARCH_KEY), SEARCH_KEY)
    assert decoded == (moment, job_id)


def test_an_empty_search_token_is_the_first_page() -> None:
    assert page_tokens.decode_search_token("", SEARCH_KEY) is None


def test_a_search_token_of_another_filter_is_refused() -> None:
    token = page_tokens.encode_search_token(dt.datetime.now(dt.UTC), uuid.uuid4(), SEARCH_KEY)
    refused = assert_refused(lambda: page_tokens.decode_search_token(token, page_tokens.filter_key("ada", [], True)))
    assert "same filter" in refused.message


@pytest.mark.parametrize(
    "payload",
    [
        {"t": 1.5, "j": "00000000-0000-0000-0000-000000000001"},
        {"t": True, "j": "00000000-0000-0000-0000-000000000001"},
        {"t": 10**30, "j": "00000000-0000-0000-0000-000000000001"},  # past datetime's range
        {"t": 0, "j": "not a uuid"},
        {"t": 0, "j": 7},
        {"t": 0},
        {"j": "00000000-0000-0000-0000-000000000001"},
    ],
)
def test_a_forged_search_token_is_refused(payload: dict[str, Any]) -> None:
    assert_refused(lambda: page_tokens.decode_search_token(forged({**payload, "f": SEARCH_KEY}), SEARCH_KEY))


def test_an_oversized_search_token_is_refused() -> None:
    assert_refused(lambda: page_tokens.decode_search_token("A" * 301, SEARCH_KEY))


# -- anything else ------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
# Payloads that decode as JSON and carry the right filter key but anything in the other fields.
FORGED_PAYLOADS = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries(
        {"f": st.sampled_from([KEY, SEARCH_KEY])},
        optional={"a": JSON_VALUES, "b": JSON_VALUES, "t": JSON_VALUES, "j": JSON_VALUES | st.uuids().map(str)},
    ),
)


def decodes_or_refuses(token: str) -> None:
    """Either decoder answers a page position or INVALID_REQUEST; any other exception fails."""
    for decode, key in ((page_tokens.decode_list_token, KEY), (page_tokens.decode_search_token, SEARCH_KEY)):
        try:
            decode(token, key)
        except InvalidRequest as refused:
            assert refused.field_violations[0][0] == "page_token"


@QUICK
@given(st.text(max_size=400))
def test_arbitrary_text_is_never_anything_but_a_page_or_invalid_request(token: str) -> None:
    decodes_or_refuses(token)


@QUICK
@given(st.binary(max_size=250).map(lambda raw: base64.urlsafe_b64encode(raw).decode().rstrip("=")))
def test_arbitrary_base64_is_never_anything_but_a_page_or_invalid_request(token: str) -> None:
    decodes_or_refuses(token)


@QUICK
@given(FORGED_PAYLOADS)
def test_forged_json_is_never_anything_but_a_page_or_invalid_request(payload: Any) -> None:
    decodes_or_refuses(forged(payload))
