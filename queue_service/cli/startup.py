"""Start-up of `serve` and `migrate`: settings, the checks before starting, the exit code of each
failure, and serving until a signal drains the replica."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from queue_service.config import Config, ConfigError, redact_dsn, redact_dsn_in

if TYPE_CHECKING:
    from queue_service.api.access.auth import Caller
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
    """Start-up cannot go on: one line for the operator and the process's exit code.

    `expected`: the line says all there is (an unreachable database), so even `--debug` prints no
    traceback; `redact` hides the DSNs' secrets in the traceback `--debug` prints otherwise."""

    def __init__(self, exit_code: int, message: str, *, expected: bool = False, redact: Callable[[str], str] = lambda text: text) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.expected = expected
        self.redact = redact


# Time a drain may take beyond the grace period (stopping loops, closing the pool) before the
# process gives up on it.
_DRAIN_MARGIN_SECONDS = 15


def _load_config(**overrides: Any) -> Config:
    try:
        return Config.from_env(**overrides)
    except ConfigError as exc:
        raise StartupFailure(EXIT_CONFIG, str(exc)) from None


def explain_start_failure(exc: BaseException, database_url: str = "", *other_dsns: str) -> StartupFailure | None:
    """The one line (and exit code) for a failure at start; None for one we did not foresee.
    Every DSN given is redacted in the line and in the traceback `--debug` prints."""
    import psycopg
    from psycopg_pool import PoolTimeout

    from queue_service import errors
    from queue_service.api.access.auth import AuthConfigError
    from queue_service.store import migrations

    def redact(text: str) -> str:
        return redact_dsn_in(text, database_url, *other_dsns)

    where = f" at {redact_dsn(database_url)}" if database_url else ""
    if isinstance(exc, StartupFailure):
        return exc
    if isinstance(exc, (ConfigError, AuthConfigError)):
        return StartupFailure(EXIT_CONFIG, str(exc), redact=redact)
    if isinstance(exc, migrations.MigrationError):
        return StartupFailure(EXIT_SCHEMA, f"database schema{where}: {redact(str(exc))}", redact=redact)
    cause = exc.__cause__ if isinstance(exc, errors.DatabaseUnavailable) and exc.__cause__ is not None else exc
    if isinstance(cause, psycopg.ProgrammingError):
        return StartupFailure(EXIT_CONFIG, f"DATABASE_URL is not usable: {redact(_first_line(cause))}", redact=redact)
    if isinstance(cause, (psycopg.OperationalError, PoolTimeout, errors.DatabaseUnavailable)):
        return StartupFailure(
            EXIT_DATABASE_UNREACHABLE,
            f"cannot reach the database{where}: {redact(_first_line(cause))}; check DATABASE_URL and that PostgreSQL is running",
            expected=True,
            redact=redact,
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
        raise explain_start_failure(exc, config.database_url, config.listen_database_url) or exc from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # SIGHUP re-reads the credential files (auth file, TLS, assertion keys) without a restart.
    loop.add_signal_handler(signal.SIGHUP, app.reload_credentials)
    # A stop signal during start-up (waiting for the database, migrating) ends the start at once
    # and exits 0, as a stop while serving does: nothing was serving, so nothing drains.
    starting = asyncio.create_task(app.start(), name="start-up")
    stop_asked = asyncio.create_task(stop.wait(), name="stop-signal")
    await asyncio.wait((starting, stop_asked), return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.info("stopped during start-up: a stop signal came before the replica served")
        await _cancel_start(app, starting)
        return
    stop_asked.cancel()
    try:
        starting.result()
    except Exception as exc:
        failure = explain_start_failure(exc, config.database_url, config.listen_database_url)
        await _close_unserved(app)
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


async def _close_unserved(app: QueueApp) -> None:
    with contextlib.suppress(Exception):  # nothing was serving yet: close what start opened
        await asyncio.wait_for(asyncio.gather(app.store.close(), app.core.close()), 10)


async def _cancel_start(app: QueueApp, starting: asyncio.Task[int]) -> None:
    """Cancels a start still in progress and closes what it opened; a start that got as far as
    its listener is stopped without a grace period (no call was answered yet)."""
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await starting
    if app.server is None:
        await _close_unserved(app)
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(app.stop(grace=0), _DRAIN_MARGIN_SECONDS)


def cmd_serve(_: argparse.Namespace) -> int:
    from queue_service import telemetry

    config = _load_config()
    try:
        config.require_service_targets()
    except ConfigError as exc:
        raise StartupFailure(EXIT_CONFIG, str(exc)) from None
    require_free_listen_addr(config.listen_addr)
    telemetry.configure_logging(log_format=config.log_format, level=config.log_level, redact=config.redact_secrets)
    telemetry.configure(service_name="acurio-queue", console_traces=config.trace_console, metrics_addr=config.metrics_addr)
    asyncio.run(_serve_until_signal(config))
    return 0


def cmd_migrate(_: argparse.Namespace) -> int:
    from queue_service import telemetry
    from queue_service.store import migrations

    config = _load_config()
    if not config.database_url:
        raise StartupFailure(EXIT_CONFIG, "invalid configuration: DATABASE_URL must be set for `migrate`")
    telemetry.configure_logging(log_format=config.log_format, level=config.log_level, redact=config.redact_secrets)
    try:
        applied = asyncio.run(migrations.migrate(config.database_url))
    except Exception as exc:
        failure = explain_start_failure(exc, config.database_url)
        if failure is None:
            raise
        raise failure from exc
    print(f"applied migrations: {applied or 'none (schema is current)'}")
    return 0


def reachable_addr(listen_addr: str) -> str:
    """The address a local client dials: a wildcard listener is reached on loopback."""
    host, _, port = listen_addr.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"{host}:{port}"
