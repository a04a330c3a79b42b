"""The names the browser endpoint answers to: its defence against DNS rebinding.

A page served from `attacker.example` whose name is then re-pointed at this endpoint's address is,
to the browser, same-origin with it: its `fetch()` reaches the console's RPCs with whatever the
browser holds for that address, and a `dev` stack on loopback needs no token at all. The page
cannot change the `Host` its requests carry, though: it is `attacker.example`. So the endpoint
answers only requests whose `Host` (`:authority` over HTTP/2) is one of its own names (the host
of QUEUE_HTTP_ADDR, `localhost`, 127.0.0.1 and ::1, and QUEUE_HTTP_ALLOWED_HOSTS) and refuses any
other with 421 Misdirected Request, before any handler runs. The port is not compared: a proxy in
front may serve on another one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")


class AllowedHosts:
    def __init__(self, http_addr: str, configured: Iterable[str]) -> None:
        listen_host = http_addr.rpartition(":")[0].strip("[]").lower()
        names = {*_LOOPBACK_NAMES, *configured}
        if listen_host not in _WILDCARD_ADDRESSES:
            names.add(listen_host)
        self.names = frozenset(names)

    def allows(self, host: bytes | None) -> bool:
        name = _host_name(host)
        return name is not None and name in self.names


def _host_name(host: bytes | None) -> str | None:
    """The name of a Host header without its port, lowercase; None when it is not one."""
    if not host:
        return None
    try:
        text = host.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return None
    if text.startswith("["):  # an IPv6 literal, [::1]:8080
        literal, _, _ = text[1:].partition("]")
        try:
            return str(ipaddress.IPv6Address(literal))
        except ValueError:
            return None
    name, _, port = text.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".")


def header(scope_headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((value for key, value in scope_headers if key == name), None)
