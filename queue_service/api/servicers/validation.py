"""Request validation: every field violation at once, as `BadRequest` field violations.

Limits keep hostile input cheap to refuse: ids and keys are short printable strings, a job has
at most MAX_SOURCES sources, and the server caps the message size (see `server`).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid

from google.protobuf import timestamp_pb2

from queue_service import errors
from queue_service._gen.acurio.queue.v1 import queue_service_pb2 as queue_pb2
from queue_service.model import RETRY_KEY_PREFIX

MAX_ID_CHARS = 128
# A UUID is 36 characters; longer text is refused unparsed.
MAX_UUID_CHARS = 64
MAX_URI_CHARS = 2048
# An index holds the uri (`analysis_job_search_keys_by_document_uri`, a btree: an entry of more
# than about 2.7 KB fails its insert), and DOIs (`analysis_job_search_keys_by_source_doi`, GIN),
# so both are bounded in bytes as well: at most one byte per character allowed, as a real uri or
# DOI is (ASCII), and a caller who sends 4-byte characters stores no more than one who does not.
MAX_URI_BYTES = 2048
MAX_TITLE_CHARS = 512
MAX_SOURCES = 1000
MAX_DOI_CHARS = 256
MAX_DOI_BYTES = 256
# What a real thesis needs sets the caps, not the transport's 4 MiB: a PhD thesis cites about 100
# to 500 sources, rarely over 1000, and a formatted reference rarely runs past 1 to 2 KB (a long
# author list included). Every admitted job stores its sources until they are pruned
# (QUEUE_JOB_INPUTS_RETENTION_SECONDS), so the caps are what one user can store per job
# (docs/security.md, "What one user can store").
MAX_CITATION_CHARS = 2048
MAX_MESSAGE_CHARS = 1024
MAX_PAGE_SIZE = 100
# The most jobs one bulk call names (OperatorService.RetryJobs' `job_ids`).
MAX_BULK_JOB_IDS = 1000
DEFAULT_PAGE_SIZE = 20
MAX_GRANT = 1_000_000
# An admit's encoded size: 1 MiB holds 1000 sources of about 1 KB each, three times the
# references of a long thesis. It also keeps the CreateRun the admit becomes far within the core's
# receive limit (4 MiB, gRPC's default, `core_client.CORE_MAX_MESSAGE_BYTES`): a larger one would
# be refused by the core's transport, RESOURCE_EXHAUSTED, indistinguishable from a spent provider
# budget. The server receives up to 4 MiB, so a larger admit hears INVALID_REQUEST, naming its size.
MAX_ADMIT_BYTES = 1024 * 1024
# A grant's note (why, in the operator's words); the ledger's check says the same.
MAX_NOTE_CHARS = 512
# Idempotency keys that begin with `RETRY_KEY_PREFIX` are OperatorService.RetryJob's
# (`model.retry_idempotency_key` derives them from the job and the retry key, both of which the
# job's user may know); Admit refuses them, so a user who admits first under a retry's key cannot
# make the operator's retry fail or answer it with the user's own job.
# A BadRequest lists at most this many violations (a trailer of thousands would exceed a client's
# header limit, and the caller would hear RESOURCE_EXHAUSTED instead of INVALID_ARGUMENT).
MAX_LISTED_VIOLATIONS = 50

# google.protobuf.Timestamp's range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z.
_MIN_TIMESTAMP_SECONDS = -62_135_596_800
_MAX_TIMESTAMP_SECONDS = 253_402_300_799

# What a DOI search accepts in front of the DOI and ignores (as a DOI is often pasted).
_DOI_PREFIX = re.compile(r"^(?:doi:\s*|https?://(?:dx\.)?doi\.org/)", re.IGNORECASE)

# Registrant code after "10.", a slash, and a suffix without whitespace or control characters.
_DOI = re.compile(r"^10\.\d{4,9}(\.\d+)*/[^\s\x00-\x1f\x7f]+$")


# Bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069): a DOI ending
# "\u202egpj.exe" displays as "exe.jpg", so text holding them shows something other than what it
# says. Refused in everything a caller stores and others read; the console isolates user text too.
_BIDI_CONTROL = re.compile("[\u202a-\u202e\u2066-\u2069]")

# Characters that show as nothing (or as a line break where none is expected), so text holding them
# differs from what it reads as: a DOI with a zero-width space (U+200B) looks like one it is not
# and a search for it as it reads finds nothing. Refused, like the bidirectional controls above (also
# format characters), in every text field of every request but the core's own message:
# * every format character (Unicode category Cf, as of Unicode 14.0; tests/unit checks the ranges
#   against the running Python's `unicodedata`): zero-width spaces and joiners, the soft hyphen, the
#   word joiner, the byte order mark, the Arabic letter mark, tag characters;
# * the C1 controls U+0080-U+009F (U+0085 is a line break);
# * the line and paragraph separators U+2028, U+2029;
# * the Hangul fillers U+115F, U+1160, U+3164, U+FFA0 (letters that render blank).
_FORMAT_CHARACTER_RANGES = (
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x13438),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
)
_INVISIBLE_RANGES = (
    *_FORMAT_CHARACTER_RANGES,
    (0x0080, 0x009F),
    (0x2028, 0x2029),
    (0x115F, 0x1160),
    (0x3164, 0x3164),
    (0xFFA0, 0xFFA0),
)
_INVISIBLE = re.compile("[" + "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in _INVISIBLE_RANGES) + "]")


def _is_printable(value: str) -> bool:
    return value.isprintable()


def invisible_character(field: str, value: str) -> str | None:
    """The violation's description when `value` holds a character that shows as something other
    than it is (a bidirectional control) or as nothing (see `_INVISIBLE`), naming the first one."""
    found = _INVISIBLE.search(value)
    if found is None:
        return None
    code_point = ord(found.group())
    if _BIDI_CONTROL.match(found.group()):
        return (
            f"{field} must not contain bidirectional control characters (U+202A-U+202E, U+2066-U+2069): "
            f"U+{code_point:04X} at character {found.start()} makes the text display in another order than it is stored"
        )
    return (
        f"{field} must not contain invisible characters (format characters such as zero-width spaces and joiners, "
        f"C1 controls, line or paragraph separators, Hangul fillers): U+{code_point:04X} at character {found.start()} "
        "would be stored but not seen, so the text would not be what it reads as"
    )


def utf8_bytes_over(field: str, value: str, max_bytes: int) -> str | None:
    """The violation's description when `value` takes more than `max_bytes` in UTF-8: an index
    entry holds the text's bytes, not its characters (a btree entry at most about 2.7 KB), and
    what a job stores is bytes (docs/security.md, "What one user can store")."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size <= max_bytes:
        return None
    return f"{field} must be at most {max_bytes} bytes in UTF-8 (got {size}: characters outside ASCII take 2 to 4 bytes each)"


def search_doi(v: Violations, field: str, value: str) -> str:
    """A DOI to search for, lowercased as the jobs' DOIs are stored (DOIs are case-insensitive),
    without a `doi:` or `https://doi.org/` in front; '' when unset."""
    trimmed = v.check_trimmed(field, value, max_chars=MAX_DOI_CHARS)
    doi = _DOI_PREFIX.sub("", trimmed)
    if doi and not _DOI.match(doi):
        v.add(field, f"{field} {doi[:64]!r} is not a DOI (expected 10.<registrant>/<suffix>, such as 10.1000/xyz123)")
    elif trimmed and not doi:
        v.add(field, f"{field} holds no DOI after its {trimmed!r}")
    return doi.lower()


def search_words(v: Violations, field: str, value: str) -> str:
    """Words to find in a title, trimmed; '' when unset. Without a letter or digit it finds nothing."""
    words = v.check_trimmed(field, value, max_chars=MAX_TITLE_CHARS)
    if words and not any(character.isalnum() for character in words):
        v.add(field, f"{field} needs at least one word (a letter or digit); punctuation only separates words")
    return words


class Violations:
    """Collects (field, description) pairs and raises them together."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, field: str, description: str) -> None:
        self.items.append((field, description))

    def check_id(self, field: str, value: str) -> None:
        if not value:
            self.add(field, f"{field} is required")
        elif len(value) > MAX_ID_CHARS:
            self.add(field, f"{field} must be at most {MAX_ID_CHARS} characters (got {len(value)})")
        elif invisible := invisible_character(field, value):
            self.add(field, invisible)
        elif not _is_printable(value):
            self.add(field, f"{field} must be printable text without control characters")

    def check_uuid(self, field: str, value: str, *, required: bool = True) -> uuid.UUID | None:
        if not value:
            if required:
                self.add(field, f"{field} is required")
            return None
        try:
            if len(value) > MAX_UUID_CHARS:
                raise ValueError
            return uuid.UUID(value)
        except ValueError:
            self.add(field, f"{field} must be a UUID such as 123e4567-e89b-12d3-a456-426614174000")
            return None

    def check_text(
        self, field: str, value: str, *, max_chars: int, max_bytes: int | None = None, required: bool = False, invisible: bool = False
    ) -> None:
        """`max_bytes`: the most UTF-8 bytes too (text an index holds). `invisible`: allow
        invisible and bidirectional control characters (text from a trusted party that is only
        ever shown isolated, with such characters written out)."""
        if not value:
            if required:
                self.add(field, f"{field} is required")
            return
        if len(value) > max_chars:
            self.add(field, f"{field} must be at most {max_chars} characters (got {len(value)})")
        elif max_bytes is not None and (too_long := utf8_bytes_over(field, value, max_bytes)):
            self.add(field, too_long)
        elif "\x00" in value:
            self.add(field, f"{field} must not contain NUL characters")
        elif not invisible and (found := invisible_character(field, value)):
            self.add(field, found)

    def check_trimmed(self, field: str, value: str, *, max_chars: int) -> str:
        """An optional text without its surrounding whitespace ('' when unset); one of
        whitespace only is a violation (it would match nothing, or everything). The length counts
        the text as sent, so the largest valid request stays what `request_limits` computes."""
        if not value:
            return ""
        if len(value) > max_chars:
            self.add(field, f"{field} must be at most {max_chars} characters (got {len(value)})")
            return ""
        if found := invisible_character(field, value):
            # Before trimming: U+0085 and U+2028 are whitespace to `strip`, and would go unnamed.
            self.add(field, found)
            return ""
        trimmed = value.strip()
        if not trimmed:
            self.add(field, f"{field} is empty after trimming whitespace; leave it unset to match every job")
            return ""
        self.check_text(field, trimmed, max_chars=max_chars)
        return trimmed

    def check_timestamp(self, field: str, value: timestamp_pb2.Timestamp) -> dt.datetime | None:
        """The timestamp as an aware UTC datetime; one outside google.protobuf.Timestamp's range
        (years 1 to 9999, nanos 0 to 999999999) is a violation, and None is returned."""
        if not _MIN_TIMESTAMP_SECONDS <= value.seconds <= _MAX_TIMESTAMP_SECONDS:
            self.add(
                field,
                f"{field}.seconds must be between {_MIN_TIMESTAMP_SECONDS} and {_MAX_TIMESTAMP_SECONDS} (years 1 to 9999; got {value.seconds})",
            )
            return None
        if not 0 <= value.nanos <= 999_999_999:
            self.add(field, f"{field}.nanos must be between 0 and 999999999 (got {value.nanos})")
            return None
        return value.ToDatetime(dt.UTC)

    def raise_if_any(self) -> None:
        if self.items:
            fields = ", ".join(field for field, _ in self.items[:10])
            more = f" and {len(self.items) - 10} more" if len(self.items) > 10 else ""
            listed = self.items[:MAX_LISTED_VIOLATIONS]
            metadata = {"violations": str(len(self.items))}
            if len(self.items) > MAX_LISTED_VIOLATIONS:
                metadata["violationsNotListed"] = str(len(self.items) - MAX_LISTED_VIOLATIONS)
            raise errors.InvalidRequest(f"invalid request: {fields}{more}", metadata=metadata, field_violations=listed)


def validate_admit(request: queue_pb2.AdmitRequest) -> uuid.UUID | None:
    """Validates an AdmitRequest; returns the parsed delta_of_job_id (None for first-pass)."""
    v = Violations()
    v.check_id("user_id", request.user_id)
    v.check_id("idempotency_key", request.idempotency_key)
    if request.idempotency_key.startswith(RETRY_KEY_PREFIX):
        v.add(
            "idempotency_key",
            f"idempotency_key must not begin with {RETRY_KEY_PREFIX!r}: keys with that prefix are reserved for OperatorService.RetryJob; choose another key",
        )
    delta_of = v.check_uuid("delta_of_job_id", request.delta_of_job_id, required=False)
    if not request.delta_of_job_id:
        v.check_text("document.uri", request.document.uri, max_chars=MAX_URI_CHARS, max_bytes=MAX_URI_BYTES, required=True)
    v.check_text("document.title", request.document.title, max_chars=MAX_TITLE_CHARS)
    sources = request.sources
    size = request.ByteSize()
    if size > MAX_ADMIT_BYTES:
        v.add(
            "sources",
            f"the request is {size} bytes; at most {MAX_ADMIT_BYTES} bytes are accepted (about 1000 references of 1 KB): send fewer or shorter sources",
        )
    if not sources:
        v.add("sources", "at least one source is required")
    elif len(sources) > MAX_SOURCES:
        v.add("sources", f"at most {MAX_SOURCES} sources are allowed (got {len(sources)})")
    else:
        for index, source in enumerate(sources):
            field = f"sources[{index}]"
            if not source.doi and not source.citation:
                v.add(field, f"{field} needs a doi or a citation")
                continue
            if source.doi:
                if len(source.doi) > MAX_DOI_CHARS:
                    v.add(f"{field}.doi", f"{field}.doi must be at most {MAX_DOI_CHARS} characters")
                elif too_long := utf8_bytes_over(f"{field}.doi", source.doi, MAX_DOI_BYTES):
                    v.add(f"{field}.doi", too_long)
                elif invisible := invisible_character(f"{field}.doi", source.doi):
                    v.add(f"{field}.doi", invisible)
                elif not _DOI.match(source.doi):
                    v.add(f"{field}.doi", f"{field}.doi {source.doi[:64]!r} is not a DOI (expected 10.<registrant>/<suffix>)")
            v.check_text(f"{field}.citation", source.citation, max_chars=MAX_CITATION_CHARS)
    v.raise_if_any()
    return delta_of


def validate_user_id(user_id: str) -> None:
    v = Violations()
    v.check_id("user_id", user_id)
    v.raise_if_any()


def validate_job_id(job_id: str, field: str = "job_id") -> uuid.UUID:
    v = Violations()
    parsed = v.check_uuid(field, job_id)
    v.raise_if_any()
    assert parsed is not None
    return parsed


def validate_page_size(page_size: int) -> int:
    if page_size < 0 or page_size > MAX_PAGE_SIZE:
        raise errors.InvalidRequest(
            f"page_size must be between 0 and {MAX_PAGE_SIZE} (got {page_size})",
            field_violations=[("page_size", f"page_size must be between 0 and {MAX_PAGE_SIZE}; 0 means {DEFAULT_PAGE_SIZE}")],
        )
    return page_size or DEFAULT_PAGE_SIZE
