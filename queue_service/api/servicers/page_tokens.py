"""Page tokens (AIP-158): opaque to callers, tied to the filter they were issued for.

A ListJobs token carries the page's last job (the caller's own) and nothing about other users'
activity; a SearchJobs token carries the keyset position (admit time, job id). Each carries a key
of the filter, so a token used with another filter is refused with INVALID_ARGUMENT.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

from queue_service.errors import InvalidRequest
from queue_service.model import JobStatus

_MAX_LIST_TOKEN_CHARS = 200
_MAX_SEARCH_TOKEN_CHARS = 300
# The longest page token of any kind: the request limits of the browser endpoint count on it.
MAX_TOKEN_CHARS = max(_MAX_LIST_TOKEN_CHARS, _MAX_SEARCH_TOKEN_CHARS)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def filter_key(*parts: object) -> str:
    """A short digest of a filter; statuses are given as their names (stable across versions)."""
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()[:16]


def list_filter_key(user_id: str, statuses: Sequence[JobStatus]) -> str:
    return filter_key(user_id, [str(status) for status in statuses])


def _encode(data: dict[str, Any]) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(token: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))


def encode_list_token(last_job_id: uuid.UUID, key: str) -> str:
    return _encode({"a": str(last_job_id), "f": key})


def decode_list_token(token: str, key: str) -> tuple[uuid.UUID | None, int | None]:
    """(after_job_id, before_seq); tokens of earlier versions carry before_seq. ("", key) is the
    first page."""
    if not token:
        return None, None
    invalid = InvalidRequest(
        "page_token is not valid for this request; pass the next_page_token of a ListJobs call with the same user_id and statuses",
        field_violations=[("page_token", "unknown or issued for another user_id or statuses")],
    )
    if len(token) > _MAX_LIST_TOKEN_CHARS:
        raise invalid
    try:
        data = _decode(token)
        if data["f"] != key:
            raise invalid
        if "a" in data:
            return uuid.UUID(data["a"]), None
        before_seq = data["b"]
        if not isinstance(before_seq, int) or isinstance(before_seq, bool) or not 0 < before_seq < 2**63:
            raise invalid
        return None, before_seq
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        raise invalid from None


def encode_search_token(create_time: dt.datetime, job_id: uuid.UUID, key: str) -> str:
    micros = int(create_time.timestamp()) * 1_000_000 + create_time.microsecond
    return _encode({"t": micros, "j": str(job_id), "f": key})


def decode_search_token(token: str, key: str) -> tuple[dt.datetime, uuid.UUID] | None:
    """The keyset position to continue below; None for the first page."""
    if not token:
        return None
    invalid = InvalidRequest(
        "page_token is not valid for this request; pass the next_page_token of a SearchJobs call with the same filter",
        field_violations=[("page_token", "unknown or issued for another filter")],
    )
    if len(token) > _MAX_SEARCH_TOKEN_CHARS:
        raise invalid
    try:
        data = _decode(token)
        micros, job_id, issued_for = data["t"], uuid.UUID(data["j"]), data["f"]
        if issued_for != key or not isinstance(micros, int) or isinstance(micros, bool):
            raise ValueError
        moment = _EPOCH + dt.timedelta(microseconds=micros)
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError, OverflowError, AttributeError):
        raise invalid from None
    return moment, job_id


def encode_ledger_token(last_entry_id: int, key: str) -> str:
    return _encode({"e": last_entry_id, "f": key})


def decode_ledger_token(token: str, key: str) -> int | None:
    """The entry id to continue below; None for the first page."""
    if not token:
        return None
    invalid = InvalidRequest(
        "page_token is not valid for this request; pass the next_page_token of a ListLedgerEntries call with the same user_id and job_id",
        field_violations=[("page_token", "unknown or issued for another user_id or job_id")],
    )
    if len(token) > _MAX_LIST_TOKEN_CHARS:
        raise invalid
    try:
        data = _decode(token)
        entry_id, issued_for = data["e"], data["f"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        raise invalid from None
    if issued_for != key or not isinstance(entry_id, int) or isinstance(entry_id, bool) or not 0 < entry_id < 2**63:
        raise invalid
    return entry_id


def encode_setting_changes_token(last_change_id: int) -> str:
    return _encode({"c": last_change_id})


def decode_setting_changes_token(token: str) -> int | None:
    """The keyset position of a ListSettingChanges page token (None: the first page)."""
    if not token:
        return None
    try:
        if len(token) > _MAX_LIST_TOKEN_CHARS:
            raise ValueError("too long")
        data = _decode(token)
        return int(data["c"])
    except Exception:
        raise InvalidRequest(
            "page_token is not valid for this request; pass the next_page_token of a ListSettingChanges call",
            field_violations=[("page_token", "unknown or malformed")],
        ) from None


def encode_audit_token(occurred_at: dt.datetime, event_key: str, key: str) -> str:
    return _encode({"t": occurred_at.isoformat(), "e": event_key, "f": key})


def decode_audit_token(token: str, key: str) -> tuple[dt.datetime, str] | None:
    """The keyset position (time, event key) of a ListAuditEvents page token (None: the first
    page)."""
    if not token:
        return None
    invalid = InvalidRequest(
        "page_token is not valid for this request; pass the next_page_token of a ListAuditEvents call with the same actor and user_id",
        field_violations=[("page_token", "unknown or issued for another actor or user_id")],
    )
    if len(token) > MAX_TOKEN_CHARS:
        raise invalid
    try:
        data = _decode(token)
        if not isinstance(data, dict) or data.get("f") != key:
            raise invalid
        occurred_at = dt.datetime.fromisoformat(data["t"])
        event_key = data["e"]
        if occurred_at.tzinfo is None or not isinstance(event_key, str) or len(event_key) > 64:
            raise invalid
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        raise invalid from None
    return occurred_at, event_key
