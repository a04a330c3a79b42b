"""Per-user assertions: the `web` role acts only for the user the web backend vouches for.

Off by default. With QUEUE_USER_ASSERTION_KEY_FILE set, every call of the `web` role (each of its
methods names a `user_id`) must carry, in the `x-user-assertion` metadata, a JWT the web backend
signed for that user: `sub` is the user id, `aud` the configured audience, `iat` and `exp` a
lifetime of at most QUEUE_USER_ASSERTION_MAX_AGE_SECONDS (and `iss` the configured issuer, when
one is). A bug in the web backend that sends another user's id then fails here instead of
reading that user's jobs or spending their credits, as long as the key that signs assertions is
kept apart from the code that picks the user id (see docs/security.md, "Per-user assertions").

No assertion, or one that does not verify: UNAUTHENTICATED `USER_ASSERTION_INVALID` (metadata
`method` and `problem`). A valid assertion for another user: PERMISSION_DENIED `USER_MISMATCH`
(metadata `method`, `userId`, `assertionSubject`). Other roles are not affected.

The key file decides the algorithms, and only those are accepted (no `alg: none`, no RSA key
read as an HMAC secret): each PEM public key in it is Ed25519 (EdDSA), ECDSA P-256 (ES256) or RSA
of at least 2048 bits (RS256), and an assertion verified by any of them is valid (several keys:
a key rotation in progress); a file without PEM is one HS256 secret of at least 32 bytes.
Asymmetric keys are the recommended choice: the queue then holds nothing that can mint an
assertion.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from queue_service import errors
from queue_service.api.access.auth import ROLE_METHODS, CallCredentialsSource, Caller
from queue_service.api.servicers.validation import Violations
from queue_service.config import Config, ConfigError

USER_ASSERTION_HEADER = "x-user-assertion"
# The role that acts for users, and so the one whose calls carry assertions.
ASSERTING_ROLE = "web"
_MIN_RSA_BITS = 2048
_MIN_SECRET_BYTES = 32
# A compact JWS larger than this is not an assertion we would issue; refuse before parsing.
_MAX_TOKEN_CHARS = 4096

_PEM_BLOCK = re.compile(rb"-----BEGIN [A-Z0-9 ]+-----.+?-----END [A-Z0-9 ]+-----", re.DOTALL)

Identify = Callable[[CallCredentialsSource], Caller | None]


@dataclasses.dataclass(frozen=True)
class AssertionKey:
    """The key assertions are verified with, and the one algorithm it allows."""

    key: Any
    algorithm: str


def load_keys(path: str) -> list[AssertionKey]:
    """The verification keys of QUEUE_USER_ASSERTION_KEY_FILE; ConfigError names what is wrong."""
    where = f"QUEUE_USER_ASSERTION_KEY_FILE={path!r}"
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"invalid configuration: {where} is not readable: {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        secret = data.strip()
        if len(secret) < _MIN_SECRET_BYTES:
            raise ConfigError(
                f"invalid configuration: {where} is neither a PEM public key nor an HS256 secret of at least "
                f"{_MIN_SECRET_BYTES} bytes (it has {len(secret)}); prefer an Ed25519 public key"
            )
        return [AssertionKey(secret, "HS256")]
    if b"PRIVATE KEY" in data:
        raise ConfigError(
            f"invalid configuration: {where} holds a private key; give the queue the public key only "
            "(the web backend keeps the private one to sign assertions)"
        )
    blocks = _PEM_BLOCK.findall(data)
    if not blocks:
        raise ConfigError(f"invalid configuration: {where} is not a PEM public key (no complete PEM block)")
    return [_public_key(block, f"{where} (key {index + 1} of {len(blocks)})") for index, block in enumerate(blocks)]


def _public_key(block: bytes, where: str) -> AssertionKey:
    try:
        key = serialization.load_pem_public_key(block)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid configuration: {where} is not a PEM public key: {exc}") from None
    if isinstance(key, ed25519.Ed25519PublicKey):
        return AssertionKey(key, "EdDSA")
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return AssertionKey(key, "ES256")
    if isinstance(key, rsa.RSAPublicKey) and key.key_size >= _MIN_RSA_BITS:
        return AssertionKey(key, "RS256")
    raise ConfigError(
        f"invalid configuration: {where} is a {type(key).__name__.removeprefix('_')}; expected an Ed25519, "
        f"ECDSA P-256 or RSA (at least {_MIN_RSA_BITS} bits) public key"
    )


class AssertionVerifier:
    """Verifies one assertion and returns the user it vouches for."""

    def __init__(self, keys: list[AssertionKey], *, audience: str, issuer: str, max_age_seconds: float, leeway_seconds: float) -> None:
        self._keys = keys
        self._audience = audience
        self._issuer = issuer
        self._max_age = max_age_seconds
        self._leeway = leeway_seconds
        self._required = ["sub", "aud", "iat", "exp"] + (["iss"] if issuer else [])

    def use_keys(self, keys: list[AssertionKey]) -> None:
        """Verifies with `keys` from now on (a reload of the key file); one reference swap."""
        self._keys = keys

    def subject(self, token: str, method: str) -> str:
        """The assertion's `sub`; UserAssertionInvalid (with the problem named) when it does not verify."""
        if len(token) > _MAX_TOKEN_CHARS:
            raise _invalid(method, "malformed", f"is {len(token)} characters long (at most {_MAX_TOKEN_CHARS})")
        try:
            algorithm = jwt.get_unverified_header(token).get("alg")
        except jwt.InvalidTokenError as exc:
            raise _invalid(method, "malformed", f"is not a valid JWT ({exc})") from None
        candidates = [key for key in self._keys if key.algorithm == algorithm]
        if not candidates:
            allowed = ", ".join(sorted({key.algorithm for key in self._keys}))
            raise _invalid(method, "wrong_algorithm", f"is signed with {str(algorithm)[:16]!r}; the configured keys verify {allowed} only")
        for key in candidates:
            try:
                claims = self._verified_claims(token, key, method)
                break
            except jwt.InvalidSignatureError:
                continue  # another key of the file (a rotation) may verify it
        else:
            raise _invalid(method, "bad_signature", "has a signature no configured key verifies")
        subject, lifetime = claims["sub"], claims["exp"] - claims["iat"]
        if lifetime > self._max_age:
            raise _invalid(
                method,
                "too_long_lived",
                f"lives {lifetime:.0f}s (`exp` - `iat`), longer than the {self._max_age:.0f}s allowed (QUEUE_USER_ASSERTION_MAX_AGE_SECONDS)",
            )
        if not isinstance(subject, str) or not subject:
            raise _invalid(method, "missing_claim", "has an empty `sub`; it must be the user id the call acts for")
        return subject

    def _verified_claims(self, token: str, key: AssertionKey, method: str) -> dict[str, Any]:
        """The claims once `key` verifies the signature; InvalidSignatureError when it does not."""
        try:
            return jwt.decode(
                token,
                key.key,
                algorithms=[key.algorithm],
                audience=self._audience,
                issuer=self._issuer or None,
                leeway=self._leeway,
                options={"require": self._required},
            )
        except jwt.ExpiredSignatureError:
            raise _invalid(method, "expired", "has expired; mint a fresh one for each call or each minute") from None
        except jwt.ImmatureSignatureError:
            raise _invalid(
                method, "not_yet_valid", "is not valid yet (`iat` or `nbf` in the future); check the web backend's clock"
            ) from None
        except jwt.MissingRequiredClaimError as exc:
            raise _invalid(method, "missing_claim", f"lacks the `{exc.claim}` claim (required: {', '.join(self._required)})") from None
        except jwt.InvalidAudienceError:
            raise _invalid(method, "wrong_audience", f"is not for this service (`aud` must be {self._audience!r})") from None
        except jwt.InvalidIssuerError:
            raise _invalid(method, "wrong_issuer", f"is from another issuer (`iss` must be {self._issuer!r})") from None
        except jwt.InvalidSignatureError:
            raise
        except jwt.InvalidTokenError as exc:  # DecodeError and the claim-type checks
            raise _invalid(method, "malformed", f"is not a valid JWT ({exc})") from None


def _invalid(method: str, problem: str, what: str) -> errors.UserAssertionInvalid:
    return errors.UserAssertionInvalid(
        f"the `{USER_ASSERTION_HEADER}` user assertion {what}", metadata={"method": method, "problem": problem}
    )


class UserAssertions:
    """The check the edge runs on every call once the request is read: for the `web` role, the
    request's `user_id` must be the subject of a valid assertion."""

    def __init__(self, verifier: AssertionVerifier, identify: Identify) -> None:
        self._verifier = verifier
        self._identify = identify

    @classmethod
    def from_config(cls, config: Config, identify: Identify | None) -> UserAssertions | None:
        """None when assertions are off (no key file)."""
        if not config.user_assertion_key_file:
            return None
        if identify is None:
            raise ConfigError(
                "invalid configuration: QUEUE_USER_ASSERTION_KEY_FILE needs QUEUE_AUTH_FILE (without it no caller has a role)"
            )
        verifier = AssertionVerifier(
            load_keys(config.user_assertion_key_file),
            audience=config.user_assertion_audience,
            issuer=config.user_assertion_issuer,
            max_age_seconds=config.user_assertion_max_age_seconds,
            leeway_seconds=config.user_assertion_leeway_seconds,
        )
        return cls(verifier, identify)

    def reload(self, key_file: str) -> int:
        """Reads the key file again and verifies with it; ConfigError (the old keys kept) when it
        cannot be used. Returns how many keys it holds."""
        keys = load_keys(key_file)
        self._verifier.use_keys(keys)
        return len(keys)

    def check(self, method: str, request: Any, context: CallCredentialsSource) -> None:
        """Returns when the call may go on; raises InvalidRequest, UserAssertionInvalid or UserMismatch."""
        if method not in ROLE_METHODS[ASSERTING_ROLE]:
            return
        caller = self._identify(context)
        if caller is None or caller.role != ASSERTING_ROLE:
            return
        user_id = request.user_id
        if not user_id:
            violations = Violations()
            violations.add(
                "user_id",
                f"user_id is required: per-user assertions are on, so every call of the `{ASSERTING_ROLE}` role names the user it acts for",
            )
            violations.raise_if_any()
        tokens = [value for key, value in context.invocation_metadata() or () if key == USER_ASSERTION_HEADER]
        if not tokens:
            raise _invalid(method, "missing", f"is missing: the `{ASSERTING_ROLE}` role must send one signed for user_id on every call")
        if len(tokens) > 1 or not isinstance(tokens[0], str):
            raise _invalid(method, "malformed", "must be sent once, as text")
        subject = self._verifier.subject(tokens[0].strip(), method)
        if subject != user_id:
            raise errors.UserMismatch(
                f"the user assertion vouches for {subject!r}, not for user_id {user_id!r}",
                metadata={"method": method, "userId": user_id, "assertionSubject": subject},
            )
