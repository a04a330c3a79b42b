"""`free_port` hands out ports below the kernel's ephemeral range: a port the kernel picked for a
probe goes back to that range, where any outbound connection could take it as its local port
before the caller's server binds it (a benchmark run in CI failed so: "address already in use")."""

from __future__ import annotations

import socket
from pathlib import Path

from queue_service.dev.embedded_postgres import free_port


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports), ports
    assert all(1024 <= port < start for port in ports), (start, ports)
    for port in ports[:5]:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
            server.listen()
