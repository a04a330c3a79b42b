"""The largest legitimate request of each method, in bytes of JSON, from the limits validation
enforces (`validation`, `page_tokens`, `convert`), and a bound on what decoding may cost.

The browser endpoint reads a body no longer than its method's largest valid request (never more
than the gRPC listener's message limit), so a caller cannot make the replica inflate and parse
megabytes to learn that a ListJobs is invalid. The bound counts every field of the request at its
longest valid value, every character of a string as the longest JSON can spell one (a surrogate
pair written as two `\\uXXXX` escapes), and room for whitespace between tokens.

`check_repeated` refuses, before the JSON becomes a message (protobuf's parser is pure Python,
on the event loop), a list longer than validation would accept: the parse of a valid request
costs at most what the largest valid request costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from queue_service.api.servicers import page_tokens, validation
from queue_service.api.servicers.convert import MAX_STATUS_FILTERS
from queue_service.api.servicers.validation import Violations

# The longest text a string field may hold, by field name (the same name means the same limit in
# every message of the contract). A request field missing here fails `largest_json_bytes`, so a
# new field cannot arrive without its limit.
_STRING_CHARS: Mapping[str, int] = {
    "user_id": validation.MAX_ID_CHARS,
    "idempotency_key": validation.MAX_ID_CHARS,
    "job_id": validation.MAX_UUID_CHARS,
    "run_id": validation.MAX_UUID_CHARS,
    "delta_of_job_id": validation.MAX_UUID_CHARS,
    "uri": validation.MAX_URI_CHARS,
    "title": validation.MAX_TITLE_CHARS,
    "doi": validation.MAX_DOI_CHARS,
    "citation": validation.MAX_CITATION_CHARS,
    "message": validation.MAX_MESSAGE_CHARS,
    "note": validation.MAX_NOTE_CHARS,
    "retry_key": validation.MAX_ID_CHARS,
    "document_uri_prefix": validation.MAX_URI_CHARS,
    "title_words": validation.MAX_TITLE_CHARS,
    "source_doi": validation.MAX_DOI_CHARS,
    "job_ids": validation.MAX_UUID_CHARS,
    "actor": validation.MAX_ID_CHARS,
    "page_token": page_tokens.MAX_TOKEN_CHARS,
}
# The most entries a repeated field may hold, by field name.
_REPEATED_ENTRIES: Mapping[str, int] = {
    "sources": validation.MAX_SOURCES,
    "statuses": MAX_STATUS_FILTERS,
    "job_ids": validation.MAX_BULK_JOB_IDS,
}
_JSON_BYTES_PER_CHAR = 12
# Whitespace a pretty-printing client may put around one field or entry (a newline and indentation).
_WHITESPACE_PER_TOKEN = 16
_NUMBER_BYTES = 22  # an int64 is a quoted string in proto JSON: "-9223372036854775808"
_TIMESTAMP_BYTES = 32  # "9999-12-31T23:59:59.999999999Z", quoted
_BOOL_BYTES = 5


def largest_json_bytes(message: Descriptor) -> int:
    """The longest valid request of type `message`, spelled as JSON."""
    total = 2  # the braces
    for field in message.fields:
        key = max(len(field.name), len(field.json_name)) + 3  # quotes and the colon
        value = _value_bytes(field)
        if field.is_repeated:
            entries = _limit(_REPEATED_ENTRIES, field)
            value = 2 + entries * (value + 1 + _WHITESPACE_PER_TOKEN)
        total += key + value + 1 + _WHITESPACE_PER_TOKEN
    return total


def _value_bytes(field: FieldDescriptor) -> int:
    if field.type == FieldDescriptor.TYPE_STRING:
        return 2 + _limit(_STRING_CHARS, field) * _JSON_BYTES_PER_CHAR
    if field.type == FieldDescriptor.TYPE_BOOL:
        return _BOOL_BYTES
    if field.enum_type is not None:
        return 2 + max(len(value.name) for value in field.enum_type.values)
    if field.message_type is not None:
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return _TIMESTAMP_BYTES
        return largest_json_bytes(field.message_type)
    if field.type in _NUMBER_TYPES:
        return _NUMBER_BYTES
    raise ValueError(f"{field.full_name}: no JSON size bound for field type {field.type}")


_NUMBER_TYPES = frozenset(
    {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64}
)


def _limit(limits: Mapping[str, int], field: FieldDescriptor) -> int:
    try:
        return limits[field.name]
    except KeyError:
        raise ValueError(
            f"{field.full_name}: no limit for this field in api/road/request_limits.py; add the one validation enforces"
        ) from None


def check_repeated(message: Descriptor, value: Any, path: str = "") -> None:
    """Raises InvalidRequest when a list of the decoded JSON `value` is longer than validation
    would accept; anything else (wrong types, unknown fields) is left to the parser."""
    if not isinstance(value, dict):
        return
    violations = Violations()
    _collect_long_lists(message, value, path, violations)
    violations.raise_if_any()


def _collect_long_lists(message: Descriptor, value: dict[str, Any], path: str, violations: Violations) -> None:
    for field in message.fields:
        given = value.get(field.json_name, value.get(field.name))
        where = f"{path}{field.name}"
        if field.is_repeated and isinstance(given, list):
            allowed = _REPEATED_ENTRIES.get(field.name)
            if allowed is not None and len(given) > allowed:
                violations.add(where, f"{where} lists {len(given)} entries; at most {allowed} are allowed")
                continue
            if field.message_type is not None:
                for index, entry in enumerate(given):
                    if isinstance(entry, dict):
                        _collect_long_lists(field.message_type, entry, f"{where}[{index}].", violations)
        elif field.message_type is not None and isinstance(given, dict):
            _collect_long_lists(field.message_type, given, f"{where}.", violations)
