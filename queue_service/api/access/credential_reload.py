"""Re-reading the credential files while serving: on SIGHUP (`reload`, installed by the cli) and,
every QUEUE_CREDENTIALS_RELOAD_SECONDS, when their contents changed (`watch`: a Kubernetes
Secret update reaches the mounted files within about a minute, and nobody has to signal).

What is re-read: the auth file (tokens and certificate SANs, swapped in at once: a revoked token
is refused from the next call on), the listener's certificate, key and client CA (new
connections get them; open ones keep theirs), and the per-user assertion key file. Each part
stands alone: a file that cannot be used is logged with the reason and its previous reading
stays in force, and the replica keeps serving. Calls in flight are never dropped.

Not re-read: the core's TLS files (QUEUE_CORE_TLS_*) and every other setting; they need a restart.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from queue_service.api.access.auth import Authorizer
from queue_service.api.access.server_tls import ServerTls
from queue_service.api.access.user_assertions import UserAssertions
from queue_service.background import SupervisedLoop

log = logging.getLogger(__name__)


class CredentialReloader:
    def __init__(
        self,
        *,
        authorizer: Authorizer | None,
        auth_file: str,
        tls: ServerTls | None,
        assertions: UserAssertions | None,
        assertion_key_file: str,
        on_new_certificate: Callable[[], None] | None = None,
    ) -> None:
        self._authorizer, self._auth_file = authorizer, auth_file
        self._tls = tls
        self._assertions, self._assertion_key_file = assertions, assertion_key_file
        self._on_new_certificate = on_new_certificate
        self._fingerprint = self.fingerprint()

    @property
    def paths(self) -> tuple[str, ...]:
        """The files a reload reads."""
        paths: list[str] = []
        if self._authorizer is not None:
            paths.append(self._auth_file)
        if self._tls is not None:
            paths.extend(self._tls.paths)
        if self._assertions is not None:
            paths.append(self._assertion_key_file)
        return tuple(paths)

    def reload(self) -> bool:
        """Re-reads every credential file; False when one of them was refused (and kept as it was)."""
        self._fingerprint = self.fingerprint()
        ok = True
        if self._authorizer is not None:
            ok &= self._part("QUEUE_AUTH_FILE", self._auth_file, self._reload_auth)
        if self._tls is not None:
            ok &= self._part("QUEUE_TLS_CERT_FILE/KEY_FILE/CLIENT_CA_FILE", self._tls.cert_file, self._reload_tls)
        if self._assertions is not None:
            ok &= self._part("QUEUE_USER_ASSERTION_KEY_FILE", self._assertion_key_file, self._reload_assertion_keys)
        return ok

    def _part(self, setting: str, path: str, reload: Callable[[], str]) -> bool:
        try:
            outcome = reload()
        except Exception as exc:  # any reason at all: the replica keeps serving with what it had
            log.error("credentials: %s (%s) not reloaded, the previous one stays in force: %s", setting, path, exc)
            return False
        log.info("credentials: %s (%s) %s", setting, path, outcome)
        return True

    def _reload_auth(self) -> str:
        assert self._authorizer is not None
        tokens, certificates = self._authorizer.reload(self._auth_file)
        return f"reloaded: {tokens} tokens, {certificates} certificate identities"

    def _reload_tls(self) -> str:
        assert self._tls is not None
        if not self._tls.reload():
            return "unchanged"
        if self._on_new_certificate is not None:
            self._on_new_certificate()
        return "reloaded: new connections use the new certificate"

    def _reload_assertion_keys(self) -> str:
        assert self._assertions is not None
        return f"reloaded: {self._assertions.reload(self._assertion_key_file)} keys"

    def fingerprint(self) -> tuple[str, ...]:
        """A digest of each file's contents (or why it cannot be read)."""
        digests = []
        for path in self.paths:
            try:
                digests.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
            except OSError as exc:
                digests.append(f"unreadable: {exc.strerror}")
        return tuple(digests)

    async def watch(self, interval_seconds: float) -> None:
        """Reloads whenever the files' contents change, checked every `interval_seconds`."""
        watch = SupervisedLoop(
            "credentials-watch",
            self._reload_if_changed,
            interval_seconds=interval_seconds,
            wait_first=True,
            expected=(),
            failure_log=("", "credentials: the watch of the credential files failed; it looks again"),
        )
        await watch.run()

    async def _reload_if_changed(self) -> None:
        if self.fingerprint() != self._fingerprint:
            log.info("credentials: a credential file changed; reloading")
            self.reload()
