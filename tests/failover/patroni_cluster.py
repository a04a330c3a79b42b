"""A Patroni cluster on loopback for failover tests: etcd, PostgreSQL members managed by Patroni
(Debian's `patroni`, `etcd-server`, the PostgreSQL server binaries Patroni depends on) and
HAProxy routing to the primary on Patroni's REST `/primary` check.

Everything listens on 127.0.0.1 and lives in one temporary folder. PostgreSQL refuses to run as
root, so when the tests run as root the members (Patroni and the postmasters it starts) run as
the `postgres` system user. `stop()` ends every process the cluster started (also when the test
process gets SIGTERM: see `stop_on_sigterm`).

Helpers for the faults: `switchover` (patronictl), `crash_node` (kill -9 of a member's Patroni and
its postmaster with every backend: the node is gone at once, its leader key expires after the
TTL), `restart_node` (the crashed member comes back, rewinds and follows), `stall_replication`
(SIGSTOP of the primary's WAL senders: the standby falls behind while commits that do not wait
for it go on), `set_synchronous_mode`, `wait_for_leader`, `timeline`, and a write probe that
tells when the primary behind HAProxy takes commits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import yaml

from queue_service.dev.embedded_postgres import free_port

SYSTEM_USER = "postgres"
SCOPE = "acurio-queue-failover"
SUPERUSER = "postgres"
# Faster than Patroni's defaults (ttl 30, loop_wait 10, retry_timeout 10) so CI sees a crashed
# node replaced within about TTL seconds; loop_wait + 2 * retry_timeout stays within the TTL.
TTL = int(os.environ.get("QUEUE_FAILOVER_PATRONI_TTL", "10"))
LOOP_WAIT = 1
# Failed /primary checks (0.5 s apart) before HAProxy marks a member down and cuts its sessions.
HAPROXY_FALL = int(os.environ.get("QUEUE_FAILOVER_HAPROXY_FALL", "2"))
RETRY_TIMEOUT = 3

T = TypeVar("T")


def postgres_bin_dir() -> str:
    """The newest Debian PostgreSQL server's binaries (the version Patroni's dependency pulls)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(found[-1]) if found else ""


def missing() -> str:
    """Why a Patroni cluster cannot run here ("" when it can)."""
    for program, package in (("patroni", "patroni"), ("patronictl", "patroni"), ("etcd", "etcd-server"), ("haproxy", "haproxy")):
        if shutil.which(program) is None:
            return f"needs Debian's {package} ({program} not found; apt-get install patroni etcd-server haproxy postgresql)"
    if not postgres_bin_dir():
        return "needs Debian's PostgreSQL server (/usr/lib/postgresql/*/bin/postgres; a dependency of patroni)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            return f"needs a system user {SYSTEM_USER!r} to run PostgreSQL as (it refuses root)"
    return ""


def wait_until(condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1) -> T:
    """Polls `condition` until it returns something truthy (returned), failing after `timeout`
    seconds with `what` and the last exception the condition raised."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - conditions poll processes that may be down
            last_error = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s" + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(interval)


def _rest(port: int, path: str, method: str = "GET", body: dict[str, Any] | None = None, timeout: float = 2.0) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=json.dumps(body).encode() if body is not None else None
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        with contextlib.suppress(ValueError):
            return exc.code, json.loads(raw) if raw else None
        return exc.code, None


@dataclasses.dataclass
class Member:
    name: str
    pg_port: int
    rest_port: int
    folder: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def config_path(self) -> Path:
        return self.folder / "patroni.yml"

    @property
    def log_path(self) -> Path:
        return self.folder / "patroni.log"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.pg_port}/{database}"

    def status(self) -> dict[str, Any]:
        """Patroni's view of this member (GET /patroni): role, state, timeline, xlog."""
        code, body = _rest(self.rest_port, "/patroni")
        return body if isinstance(body, dict) else {"http_status": code}

    def is_primary(self) -> bool:
        """What HAProxy checks: /primary answers 200 on the running leader only."""
        try:
            return _rest(self.rest_port, "/primary", timeout=1.0)[0] == 200
        except OSError:
            return False

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data_dir / "postmaster.pid").read_text().split("\n")[0])
        return None


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            # The command may hold spaces and parentheses: the fields after the last ')'.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _descendants(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        found += [child, *_descendants(child)]
    return found


def _kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signals a process (a postmaster) and then every descendant it had (its backends), all
    found before the first signal, so nothing is restarted in between."""
    for target in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)


class PatroniCluster:
    """etcd, `members` Patroni-managed PostgreSQL members and HAProxy, all on loopback."""

    def __init__(self, *, members: int = 2, synchronous_mode: bool = True, maximum_lag_on_failover: int = 64 * 1024 * 1024) -> None:
        problem = missing()
        if problem:
            raise RuntimeError(problem)
        self.folder = Path(tempfile.mkdtemp(prefix="acurio-queue-patroni-"))
        self.bin_dir = postgres_bin_dir()
        self.version = int(self.bin_dir.split("/")[4])
        self.synchronous_mode = synchronous_mode
        self.maximum_lag_on_failover = maximum_lag_on_failover
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.haproxy_port = free_port()
        self.members = [Member(f"pg-{i + 1}", free_port(), free_port(), self.folder / f"pg-{i + 1}") for i in range(members)]
        self._etcd: subprocess.Popen[bytes] | None = None
        self._haproxy: subprocess.Popen[bytes] | None = None
        self._stopped_senders: list[int] = []
        self._account = pwd.getpwnam(SYSTEM_USER) if os.geteuid() == 0 else None

    # -- addresses --------------------------------------------------------------------------

    def haproxy_dsn(self, database: str = "postgres") -> str:
        """Routed by HAProxy to whichever member Patroni's /primary check names."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.haproxy_port}/{database}"

    def multi_host_dsn(self, database: str = "postgres") -> str:
        """libpq tries the members in order and keeps the first that takes writes."""
        hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in self.members)
        return f"postgresql://{SUPERUSER}@{hosts}/{database}?target_session_attrs=read-write&connect_timeout=2"

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- starting and stopping ----------------------------------------------------------------

    def _own(self, path: Path) -> None:
        if self._account is not None:
            os.chown(path, self._account.pw_uid, self._account.pw_gid)

    def _spawn(self, argv: list[str], log_path: Path, *, as_postgres: bool) -> subprocess.Popen[bytes]:
        log = open(log_path, "ab")
        try:
            extra: dict[str, Any] = {}
            if as_postgres and self._account is not None:
                extra = {"user": self._account.pw_uid, "group": self._account.pw_gid, "extra_groups": []}
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.folder), "LANG": "C.UTF-8"}
            else:
                env = {**os.environ}
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder, env=env, start_new_session=True, **extra)
        finally:
            log.close()

    def start(self, timeout: float = 120) -> None:
        self._own(self.folder)
        self.folder.chmod(0o755)
        self._start_etcd()
        for member in self.members:
            member.folder.mkdir()
            self._own(member.folder)
            member.config_path.write_text(yaml.safe_dump(self._patroni_config(member)))
            self._own(member.config_path)
        # The first member bootstraps (initdb); the others then clone it (pg_basebackup).
        self._start_member(self.members[0])
        wait_until(self.members[0].is_primary, timeout, f"{self.members[0].name} bootstrapped as primary ({self.members[0].log_path})")
        for member in self.members[1:]:
            self._start_member(member)
        self.wait_replicas_streaming(timeout)
        self._start_haproxy()
        # HAProxy starts with every server up until its first checks: wait for them.
        leader = wait_until(self.leader, 30, "a leader")
        wait_until(lambda: self.haproxy_servers_up() == [leader.name], 30, f"HAProxy routing to {leader.name} only")
        wait_until(lambda: self.write_probe(timeout=1.0), 30, "a write through HAProxy")

    def _start_etcd(self) -> None:
        data = self.folder / "etcd"
        self._etcd = self._spawn(
            [
                "etcd",
                "--name",
                "etcd-1",
                "--data-dir",
                str(data),
                "--listen-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-cluster",
                f"etcd-1=http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-cluster-state",
                "new",
            ],
            self.folder / "etcd.log",
            as_postgres=False,
        )

        def healthy() -> bool:
            assert self._etcd is not None and self._etcd.poll() is None, (self.folder / "etcd.log").read_text()[-2000:]
            with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/health", timeout=1) as response:
                return bool(json.loads(response.read()).get("health") == "true")

        wait_until(healthy, 30, "etcd healthy")

    def _patroni_config(self, member: Member) -> dict[str, Any]:
        hba = [
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        ]
        return {
            "scope": SCOPE,
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{member.rest_port}", "connect_address": f"127.0.0.1:{member.rest_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": self.maximum_lag_on_failover,
                    "synchronous_mode": self.synchronous_mode,
                    "synchronous_mode_strict": False,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 300,
                            "shared_buffers": "32MB",
                            "wal_keep_size": "256MB",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            # Faults here are process crashes, not power loss: the OS keeps
                            # what was written, so fsync only adds load to a shared machine.
                            "fsync": "off",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.pg_port}",
                "connect_address": f"127.0.0.1:{member.pg_port}",
                "data_dir": str(member.data_dir),
                "bin_dir": self.bin_dir,
                "pgpass": str(member.folder / "pgpass"),
                "authentication": {
                    "superuser": {"username": SUPERUSER, "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                },
                "pg_hba": hba,
                "parameters": {"unix_socket_directories": str(member.folder)},
                # A crashed primary that pg_rewind cannot bring onto the new timeline is cloned
                # afresh instead of staying down.
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }

    def _start_member(self, member: Member) -> None:
        member.process = self._spawn(["patroni", str(member.config_path)], member.log_path, as_postgres=True)

    def _start_haproxy(self) -> None:
        servers = "\n".join(f"    server {m.name} 127.0.0.1:{m.pg_port} maxconn 500 check port {m.rest_port}" for m in self.members)
        config = self.folder / "haproxy.cfg"
        # Patroni's documented HAProxy setup, with checks twice a second: a demoted or dead
        # primary is marked down after two failed checks and its sessions are cut at once.
        # HAProxy waits min(timeout connect, 1 s) before retrying a refused connection: kept
        # short, and the retry redispatched, so reconnections during a switchover do not sit
        # a second on the old primary while it restarts.
        config.write_text(
            f"global\n    maxconn 1000\n    stats socket {self.folder / 'haproxy.sock'} mode 600 level admin\n"
            "defaults\n    mode tcp\n    option redispatch 1\n    retries 2\n    timeout connect 250ms\n    timeout client 30m\n    timeout server 30m\n    timeout check 1s\n"
            f"listen primary\n    bind 127.0.0.1:{self.haproxy_port}\n"
            "    option httpchk GET /primary\n    http-check expect status 200\n"
            f"    default-server inter 500ms fall {HAPROXY_FALL} rise 1 on-marked-down shutdown-sessions\n"
            f"{servers}\n"
        )
        self._haproxy = self._spawn(["haproxy", "-db", "-f", str(config)], self.folder / "haproxy.log", as_postgres=False)

    def haproxy_servers_up(self) -> list[str]:
        """The members HAProxy routes to now (its `show stat` over the admin socket)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(2)
            sock.connect(str(self.folder / "haproxy.sock"))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        rows = [line.split(",") for line in data.decode().splitlines() if line and not line.startswith("#")]
        return sorted(row[1] for row in rows if row[0] == "primary" and row[1] not in ("FRONTEND", "BACKEND") and row[17].startswith("UP"))

    def stop(self) -> None:
        """Ends every process the cluster started and removes its folder. Safe to call twice."""
        self.resume_replication()
        for process in (self._haproxy,):
            if process is not None and process.poll() is None:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
                if process.poll() is None:
                    process.kill()
                    process.wait(timeout=5)
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                member.process.terminate()  # Patroni stops its PostgreSQL (fast shutdown)
        for member in self.members:
            if member.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    member.process.wait(timeout=20)
                if member.process.poll() is None:
                    member.process.kill()
                    member.process.wait(timeout=5)
            postmaster = member.postmaster_pid()
            if postmaster is not None and _alive(postmaster):
                _kill_tree(postmaster)
        if self._etcd is not None and self._etcd.poll() is None:
            self._etcd.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._etcd.wait(timeout=10)
            if self._etcd.poll() is None:
                self._etcd.kill()
                self._etcd.wait(timeout=5)
        keep = os.environ.get("QUEUE_FAILOVER_KEEP_LOGS")
        if keep:  # for a failure's post-mortem: every log of the cluster, the data removed
            target = Path(keep) / self.folder.name
            target.mkdir(parents=True, exist_ok=True)
            for log in self.folder.rglob("*.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(log, target / f"{log.parent.name}-{log.name}")
        shutil.rmtree(self.folder, ignore_errors=True)

    @contextlib.contextmanager
    def stop_on_sigterm(self) -> Iterator[None]:
        """While inside, SIGTERM to the test process unwinds it as Ctrl-C does (KeyboardInterrupt),
        so every finalizer runs: the test's own (its replicas) and the fixture's `stop()`. A
        second SIGTERM stops the cluster at once and ends the process."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGTERM)
        received = []

        def handler(signum: int, frame: Any) -> None:
            received.append(signum)
            if len(received) == 1:
                raise KeyboardInterrupt("SIGTERM")
            self.stop()
            os._exit(128 + signal.SIGTERM)

        signal.signal(signal.SIGTERM, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    # -- state ----------------------------------------------------------------------------------

    def leader(self) -> Member | None:
        """The member whose /primary answers 200 (the one HAProxy routes to), if any."""
        for member in self.members:
            if self._alive_member(member) and member.is_primary():
                return member
        return None

    def replicas(self) -> list[Member]:
        leader = self.leader()
        return [m for m in self.members if m is not leader]

    def _alive_member(self, member: Member) -> bool:
        return member.process is not None and member.process.poll() is None

    def timeline(self) -> int:
        """The leader's timeline: it grows by one at each promotion."""
        leader = wait_until(self.leader, 30, "a leader")
        return int(leader.status()["timeline"])

    def wait_for_leader(self, *, other_than: str = "", timeout: float = 60) -> Member:
        """Waits until a member other than `other_than` is the running primary."""
        return wait_until(
            lambda: (leader := self.leader()) is not None and leader.name != other_than and leader,
            timeout,
            f"a new leader other than {other_than!r}",
        )

    def wait_replicas_streaming(self, timeout: float = 120) -> None:
        """Waits until every member runs, one leads and the others stream from it (and, in
        synchronous mode, one of them is the synchronous standby)."""

        def ready() -> bool:
            leader = self.leader()
            if leader is None:
                return False
            with psycopg.connect(leader.dsn(), autocommit=True, connect_timeout=2) as conn:
                rows = conn.execute("SELECT application_name, state, sync_state FROM pg_stat_replication").fetchall()
            streaming = {name for name, state, _ in rows if state == "streaming"}
            others = {m.name for m in self.members if m is not leader}
            if not others <= streaming:
                return False
            if not self.synchronous_mode:
                return True
            # Only the standby named in the DCS's /sync key may be promoted automatically:
            # wait until Patroni has recorded it, not only until PostgreSQL treats it as sync.
            _, cluster = _rest(leader.rest_port, "/cluster")
            roles = {m["name"]: m.get("role") for m in (cluster or {}).get("members", [])}
            return any(sync == "sync" for _, _, sync in rows) and "sync_standby" in roles.values()

        wait_until(ready, timeout, "every standby streaming from the leader", interval=0.2)

    def synchronous_standby_names(self) -> str:
        leader = wait_until(self.leader, 30, "a leader")
        with psycopg.connect(leader.dsn(), autocommit=True, connect_timeout=2) as conn:
            return str(conn.execute("SHOW synchronous_standby_names").fetchone()[0])  # type: ignore[index]

    def write_probe(self, timeout: float = 1.0) -> int | None:
        """A commit through HAProxy (it waits for the synchronous standby when there is one);
        the port of the member that took it, None when it failed."""
        try:
            with psycopg.connect(self.haproxy_dsn(), autocommit=True, connect_timeout=max(1, int(timeout))) as conn:
                conn.execute(f"SET statement_timeout = {int(timeout * 1000)}")
                row = conn.execute("SELECT inet_server_port(), txid_current()").fetchone()
                return int(row[0]) if row else None
        except psycopg.Error:
            return None

    # -- faults and operations -----------------------------------------------------------------

    def patronictl(self, *args: str, timeout: float = 60) -> str:
        member = self.members[0]
        result = subprocess.run(["patronictl", "-c", str(member.config_path), *args], capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"patronictl {' '.join(args)} exited {result.returncode}: {result.stdout}{result.stderr}")
        return result.stdout

    def switchover(self, candidate: str = "") -> tuple[str, str]:
        """`patronictl switchover` to `candidate` (default: the first replica); (old, new) leader."""
        leader = wait_until(self.leader, 30, "a leader")
        candidate = candidate or next(m.name for m in self.members if m is not leader and self._alive_member(m))
        self.patronictl("switchover", "--leader", leader.name, "--candidate", candidate, "--force", SCOPE)
        return leader.name, candidate

    def crash_node(self, member: Member) -> None:
        """The whole node dies at once: kill -9 of its Patroni (so nothing restarts PostgreSQL
        or releases the leader key) and of its postmaster with every backend."""
        postmaster = member.postmaster_pid()
        if member.process is not None:
            member.process.kill()
        if postmaster is not None:
            _kill_tree(postmaster)
        if member.process is not None:
            member.process.wait(timeout=10)
        if postmaster is not None:
            wait_until(lambda: not _alive(postmaster), 10, f"postmaster {postmaster} gone")

    def restart_node(self, member: Member, timeout: float = 120) -> None:
        """A crashed member comes back: Patroni rewinds it onto the new timeline (pg_rewind) and
        it follows the leader."""
        assert not self._alive_member(member), f"{member.name} is still running"
        self._start_member(member)
        self.wait_replicas_streaming(timeout)

    def set_synchronous_mode(self, on: bool, timeout: float = 60) -> None:
        """Patroni's synchronous_mode (not strict): on, commits wait for a synchronous standby
        that Patroni picks; off, they do not wait for any."""
        self.patronictl("edit-config", "--force", "-s", f"synchronous_mode={'true' if on else 'false'}", SCOPE)
        self.synchronous_mode = on
        wait_until(lambda: bool(self.synchronous_standby_names()) == on, timeout, f"synchronous_standby_names {'set' if on else 'empty'}")
        self.wait_replicas_streaming(timeout)

    def stall_replication(self) -> list[int]:
        """SIGSTOPs the primary's WAL senders: the standbys receive nothing more, while commits
        that do not wait for them (asynchronous replication) go on. Their pids."""
        leader = wait_until(self.leader, 30, "a leader")
        with psycopg.connect(leader.dsn(), autocommit=True, connect_timeout=2) as conn:
            pids = [int(pid) for (pid,) in conn.execute("SELECT pid FROM pg_stat_replication").fetchall()]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self._stopped_senders = pids
        return pids

    def resume_replication(self) -> None:
        for pid in self._stopped_senders:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._stopped_senders = []

    def wal_positions(self) -> dict[str, str]:
        """Each running member's WAL position: the primary's current insert position, a
        standby's last received."""
        positions = {}
        for member in self.members:
            if not self._alive_member(member):
                continue
            with contextlib.suppress(psycopg.Error), psycopg.connect(member.dsn(), autocommit=True, connect_timeout=2) as conn:
                row = conn.execute(
                    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END::text"
                ).fetchone()
                positions[member.name] = str(row[0]) if row else ""
        return positions

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.haproxy_dsn(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.haproxy_dsn(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False
