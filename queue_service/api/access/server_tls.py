"""The listener's TLS (QUEUE_TLS_CERT_FILE, QUEUE_TLS_KEY_FILE, QUEUE_TLS_CLIENT_CA_FILE),
re-readable while the replica serves.

The gRPC listener uses grpcio's dynamic server credentials: before each new handshake gRPC asks
`_fetch` whether the certificate configuration changed, so connections opened after a reload get
the new certificate (and client CA), and open ones keep what they negotiated: nothing is dropped.
TLS 1.2 is the floor either way (gRPC's default). The browser listener's `ssl.SSLContext` is
reloaded in place by the web endpoint.

A reload that cannot be used (a missing file, a key that is not the certificate's, a CA file
without a certificate) raises ConfigError and changes nothing.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from queue_service.config import ConfigError


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """The PEM contents of the listener's files, read at one moment and checked."""

    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None

    def grpc_configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(self.private_key, self.certificate_chain)], root_certificates=self.client_ca)


def read_tls_files(cert_file: str, key_file: str, client_ca_file: str) -> TlsFiles:
    """Reads and checks the files: the chain parses, the key is the first certificate's, the
    client CA bundle (when set) holds at least one certificate."""
    chain, key = _read(cert_file, "QUEUE_TLS_CERT_FILE"), _read(key_file, "QUEUE_TLS_KEY_FILE")
    try:
        certificates = x509.load_pem_x509_certificates(chain)
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: QUEUE_TLS_CERT_FILE={cert_file!r} holds no PEM certificate: {exc}") from None
    try:
        private_key = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid configuration: QUEUE_TLS_KEY_FILE={key_file!r} is not an unencrypted PEM private key: {exc}") from None
    if _public_der(private_key.public_key()) != _public_der(certificates[0].public_key()):
        raise ConfigError(
            f"invalid configuration: QUEUE_TLS_KEY_FILE={key_file!r} is not the key of the first certificate in "
            f"QUEUE_TLS_CERT_FILE={cert_file!r}"
        )
    client_ca = None
    if client_ca_file:
        client_ca = _read(client_ca_file, "QUEUE_TLS_CLIENT_CA_FILE")
        try:
            x509.load_pem_x509_certificates(client_ca)
        except ValueError as exc:
            raise ConfigError(
                f"invalid configuration: QUEUE_TLS_CLIENT_CA_FILE={client_ca_file!r} holds no PEM certificate: {exc}"
            ) from None
    return TlsFiles(chain, key, client_ca)


class ServerTls:
    """The listener's certificate, key and client CA; `reload` reads them again."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str) -> None:
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self._files = read_tls_files(cert_file, key_file, client_ca_file)
        # gRPC calls `_fetch` from its own threads, before handshakes.
        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path in (self.cert_file, self.key_file, self.client_ca_file) if path)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Mutual TLS (a client certificate required) when a client CA is set."""
        # grpcio reads None from the fetcher as "unchanged"; the type stubs omit the None.
        fetch = cast("Callable[[], grpc.ServerCertificateConfiguration]", self._fetch)
        return grpc.dynamic_ssl_server_credentials(
            self._files.grpc_configuration(),
            fetch,
            require_client_authentication=self._files.client_ca is not None,
        )

    def reload(self) -> bool:
        """Reads the files again; True when they changed (new handshakes use them from now on).
        ConfigError, and the current files kept, when they cannot be used."""
        files = read_tls_files(self.cert_file, self.key_file, self.client_ca_file)
        if files == self._files:
            return False
        with self._lock:
            self._pending = files.grpc_configuration()
        self._files = files
        return True

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's question before a handshake: a new configuration, or None to keep the current."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending


def _read(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"invalid configuration: {setting}={path!r} is not readable: {exc.strerror}") from None


def _public_der(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
