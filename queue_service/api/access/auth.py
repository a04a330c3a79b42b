"""Who may call what: bearer tokens or client-certificate names, mapped to roles.

Roles follow the callers we have: the web backend (`web`) uses AnalysisQueueService, the core
(`core`) only CoreCallbackService, operators (`operator`) CreditsService, OperatorService, the
tooling RPCs (Promote, Release), the read RPCs and CancelJob (the console cancels any user's job),
and viewers (`viewer`) every read an operator has and nothing that changes anything (the console
on a wall screen, support staff). Health stays open to everyone (load balancers and
probes); reflection is for operators when authentication is on.

The auth file (QUEUE_AUTH_FILE) is JSON; tokens are stored as SHA-256 hex digests, never in
clear:

    {"tokens": [{"name": "web-backend", "role": "web", "sha256": "<hex of sha256(token)>"}],
     "certificates": [{"san": "rust-core", "role": "core"}]}

A client certificate (mutual TLS) is identified by its subject alternative names, DNS names and
URIs (a SPIFFE ID such as `spiffe://acurio.example/core`), never by its subject's common name:
RFC 6125 retired the CN as an identity, one certificate can carry a CN and SANs that disagree,
and a CA constrains SANs (name constraints), not CNs. An entry's `san` must equal one of them
exactly (byte for byte, no wildcard expansion, no case folding). `common_name` is read as the old
spelling of `san`, with the same meaning and a warning; an entry with both is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import grpc

from queue_service import audit, errors

log = logging.getLogger(__name__)

_QUEUE = "/acurio.queue.v1.AnalysisQueueService/"
_CALLBACK = "/acurio.queue.v1.CoreCallbackService/"
_CREDITS = "/acurio.queue.v1.CreditsService/"
_OPERATOR = "/acurio.queue.v1.OperatorService/"

ROLE_METHODS: dict[str, frozenset[str]] = {
    "web": frozenset(_QUEUE + m for m in ("Admit", "ListJobs", "GetJob", "CancelJob", "WatchJobs")),
    "core": frozenset({_CALLBACK + "CompleteRun"}),
    "operator": frozenset(
        [_CREDITS + "GrantCredits", _CREDITS + "GetBalance"]
        + [_QUEUE + m for m in ("Promote", "Release", "ListJobs", "GetJob", "WatchJobs")]
        # The web console's operator view: its RPCs, and cancel (single and bulk) on any user's job.
        + [_OPERATOR + m for m in ("GetOverview", "SearchJobs", "WatchOverview", "CancelJobs", "ListLedgerEntries")]
        # The fleet settings: the core's capacity, users' limits, pauses of releases, a user's
        # settings in force, and who changed them.
        + [_OPERATOR + m for m in ("SetCoreCapacity", "SetUserQueueLimit", "SetReleasesPaused", "GetUserSettings", "ListSettingChanges")]
        # A failed or canceled job admitted again (charged to its user, the operator its actor),
        # one or many.
        + [_OPERATOR + m for m in ("RetryJob", "RetryJobs")]
        # Who has work (the User queue's picker), and the queue's history (the overview's charts).
        + [_OPERATOR + m for m in ("ListUsersWithWork", "GetQueueHistory")]
        # Which replicas serve, and the core's health as each sees it.
        + [_OPERATOR + "ListReplicas"]
        # The pauses in force in one place, a job's run checked with the core now, and the audit
        # timeline.
        + [_OPERATOR + m for m in ("ListReleasePauses", "CheckJobWithCore", "ListAuditEvents")]
        + [_QUEUE + "CancelJob"]
    ),
}
# A read-only operator (a wall screen, support staff): every read the console makes, no change.
ROLE_METHODS["viewer"] = frozenset(
    [_CREDITS + "GetBalance"]
    + [_QUEUE + m for m in ("ListJobs", "GetJob", "WatchJobs")]
    + [
        _OPERATOR + m
        for m in (
            "GetOverview",
            "SearchJobs",
            "WatchOverview",
            "ListLedgerEntries",
            "GetUserSettings",
            "ListSettingChanges",
            "ListUsersWithWork",
            "GetQueueHistory",
            "ListReplicas",
            "ListReleasePauses",
            "ListAuditEvents",
        )
    ]
)
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
# Server reflection answers tens of KB of descriptors per 50-byte request: one web token's
# reflection streams slowed every other caller's calls several times over (docs/security.md,
# section 5), and only on-call tooling needs it (the web backend builds from protos/).
_OPERATOR_PREFIXES = ("/grpc.reflection.",)
# The auth-context properties gRPC fills from a verified client certificate's subject
# alternative names: DNS names and URIs. Not `x509_subject_alternative_name` (every SAN type
# mixed, IP addresses and e-mail addresses included) and never `x509_common_name`.
_CERTIFICATE_IDENTITY_PROPERTIES = ("peer_dns", "peer_uri")


class CallCredentialsSource(Protocol):
    """What `Authorizer.identify` reads from a call: a grpc.aio context, or the browser
    endpoint's request (`api.web`), which has headers but no client certificate."""

    def invocation_metadata(self) -> Iterable[tuple[str, str | bytes]] | None: ...

    def auth_context(self) -> Mapping[str, Iterable[bytes]]: ...


@dataclasses.dataclass(frozen=True)
class Caller:
    name: str
    role: str


class AuthConfigError(ValueError):
    """The auth file cannot be used; the message says which entry is wrong."""


@dataclasses.dataclass(frozen=True)
class _Callers:
    """One reading of the auth file: who each token digest and each certificate SAN is."""

    tokens: Mapping[str, Caller]
    certificates: Mapping[str, Caller]


class Authorizer:
    """Who a call's credentials name. `reload` swaps in a new reading of the auth file at once:
    a call sees either the old file or the new one, never a mix."""

    def __init__(
        self, tokens: dict[str, Caller], certificates: dict[str, Caller], *, built_in_tokens: Mapping[str, Caller] | None = None
    ) -> None:
        # Token digests every reading of the file is extended with: the `dev` command's own
        # core, whose token is in no file the developer edits.
        self._built_in = dict(built_in_tokens or {})
        self._callers = _Callers({**tokens, **self._built_in}, certificates)

    @classmethod
    def from_file(cls, path: str, *, built_in_tokens: Mapping[str, Caller] | None = None) -> Authorizer:
        callers = _read_auth_file(path)
        return cls(dict(callers.tokens), dict(callers.certificates), built_in_tokens=built_in_tokens)

    def reload(self, path: str) -> tuple[int, int]:
        """Reads `path` again and serves from it; AuthConfigError (and the old file kept) when it
        cannot be used. Returns how many tokens and certificate entries it holds."""
        callers = _read_auth_file(path)
        # one reference swap: no call sees half of each file
        self._callers = _Callers({**callers.tokens, **self._built_in}, callers.certificates)
        return len(callers.tokens), len(callers.certificates)

    def caller_of_token(self, token: str) -> Caller | None:
        """Who a bearer token names in the file in force (None: nobody)."""
        return self._callers.tokens.get(hashlib.sha256(token.strip().encode()).hexdigest())

    def identify(self, context: CallCredentialsSource) -> Caller | None:
        callers = self._callers  # the same reading for the whole call, whatever a reload does
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                caller = callers.tokens.get(hashlib.sha256(value[7:].strip().encode()).hexdigest())  # the same reading as above
                if caller is not None:
                    return caller
        return _identify_certificate(callers.certificates, context.auth_context() or {})

    async def authorize(self, method: str, context: CallCredentialsSource) -> None:
        """Raises Unauthenticated or PermissionDenied; returns when the call may proceed, with the
        caller marked as the call's actor (`audit`: the roads await this in the call's context)."""
        if method.startswith(_OPEN_PREFIXES):
            return
        caller = self.identify(context)
        if caller is None:
            raise errors.Unauthenticated(
                "no valid credentials: send `authorization: Bearer <token>` or a client certificate",
                metadata={"method": method},
            )
        if method in ROLE_METHODS[caller.role] or (caller.role == "operator" and method.startswith(_OPERATOR_PREFIXES)):
            audit.identify(audit.caller_actor(caller.role, caller.name))
            return
        raise errors.PermissionDenied(
            f"{caller.name} (role {caller.role}) may not call {method}",
            metadata={"method": method, "role": caller.role, "caller": caller.name},
        )


def _read_auth_file(path: str) -> _Callers:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise AuthConfigError(f"QUEUE_AUTH_FILE={path!r} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AuthConfigError(f"QUEUE_AUTH_FILE={path!r} must hold a JSON object with `tokens` and `certificates`")
    tokens, certificates = {}, {}
    for index, entry in enumerate(_entries(data, "tokens")):
        digest, caller = str(entry.get("sha256", "")).lower(), _caller(entry, f"tokens[{index}]")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise AuthConfigError(f"tokens[{index}].sha256 must be 64 hex digits (sha256 of the token)")
        tokens[digest] = caller
    for index, entry in enumerate(_entries(data, "certificates")):
        san = _certificate_san(entry, f"certificates[{index}]")
        if san in certificates:
            raise AuthConfigError(f"certificates[{index}].san {san!r} appears twice; one identity has one role")
        certificates[san] = _caller(entry, f"certificates[{index}]")
    return _Callers(tokens, certificates)


def _entries(data: dict[str, Any], field: str) -> list[dict[str, Any]]:
    entries = data.get(field, [])
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise AuthConfigError(f"QUEUE_AUTH_FILE: `{field}` must be a list of objects")
    return entries


def _identify_certificate(certificates: Mapping[str, Caller], auth_context: Mapping[str, Iterable[bytes]]) -> Caller | None:
    """The caller whose `san` is one of the certificate's DNS or URI SANs. A certificate naming
    several callers of the file is refused rather than resolved by order."""
    matched: dict[str, Caller] = {}
    for prop in _CERTIFICATE_IDENTITY_PROPERTIES:
        for value in auth_context.get(prop, []):
            san = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            if san in certificates:
                matched[san] = certificates[san]
    if len(matched) > 1:
        raise errors.Unauthenticated(
            f"the client certificate names {len(matched)} identities of the auth file ({', '.join(sorted(matched))}); "
            "issue it with one of them",
            metadata={"subjectAlternativeNames": ",".join(sorted(matched))},
        )
    return next(iter(matched.values()), None)


def _caller(entry: dict[str, Any], where: str) -> Caller:
    role = entry.get("role")
    if role not in ROLE_METHODS:
        raise AuthConfigError(f"{where}.role must be one of {', '.join(sorted(ROLE_METHODS))} (got {role!r})")
    return Caller(name=str(entry.get("name") or entry.get("san") or entry.get("common_name") or role), role=role)


def _certificate_san(entry: dict[str, Any], where: str) -> str:
    """The SAN a certificate entry names; `common_name` is accepted as its old spelling only when
    it is the entry's one identity field."""
    if "san" in entry and "common_name" in entry:
        raise AuthConfigError(
            f"{where} has both `san` and `common_name`; certificates are identified by their subject alternative "
            "names only, so keep `san` and remove `common_name`"
        )
    if "common_name" in entry:
        log.warning(
            "QUEUE_AUTH_FILE %s: `common_name` is read as `san` (matched against the certificate's DNS and URI "
            "subject alternative names, never its common name); rename the field to `san`",
            where,
        )
    san = str(entry.get("san", entry.get("common_name", ""))).strip()
    if not san:
        raise AuthConfigError(f"{where}.san is required: a DNS name or URI among the client certificate's subject alternative names")
    return san


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def core_channel_credentials(ca_file: str, cert_file: str, key_file: str) -> grpc.ChannelCredentials | None:
    """TLS (and optionally a client certificate) for the outgoing connection to the core."""
    if not ca_file:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file),
        private_key=_read(key_file) if key_file else None,
        certificate_chain=_read(cert_file) if cert_file else None,
    )
