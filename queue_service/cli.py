"""`queue-service`: serve, migrate, dev (everything for a newcomer), core (the dev core alone)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path

from queue_service import migrations, telemetry
from queue_service.config import Config, ConfigError

log = logging.getLogger("queue_service")

# Time a drain may take beyond the grace period (stopping loops, closing the pool) before the
# process gives up on it.
_DRAIN_MARGIN_SECONDS = 15


def _load_config(**overrides: object) -> Config:
    try:
        return Config.from_env(**overrides)
    except ConfigError as exc:
        print(f"queue-service: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


async def _serve_until_signal(config: Config, *, on_serving=None) -> None:  # type: ignore[no-untyped-def]
    from queue_service.auth import AuthConfigError
    from queue_service.server import QueueApp

    try:
        app = QueueApp(config)
    except (ConfigError, AuthConfigError) as exc:
        print(f"queue-service: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await app.start()
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
    config = _load_config()
    try:
        config.require_service_targets()
    except ConfigError as exc:
        print(f"queue-service: {exc}", file=sys.stderr)
        return 2
    telemetry.configure_logging(log_format=config.log_format, level=config.log_level)
    telemetry.configure(service_name="acurio-queue", console_traces=config.trace_console, metrics_addr=config.metrics_addr)
    asyncio.run(_serve_until_signal(config))
    return 0


def cmd_migrate(_: argparse.Namespace) -> int:
    config = _load_config()
    if not config.database_url:
        print("queue-service: invalid configuration: DATABASE_URL must be set for `migrate`", file=sys.stderr)
        return 2
    telemetry.configure_logging(log_format=config.log_format, level=config.log_level)
    applied = asyncio.run(migrations.migrate(config.database_url))
    print(f"applied migrations: {applied or 'none (schema is current)'}")
    return 0


def cmd_core(args: argparse.Namespace) -> int:
    from queue_service.dev_core import DevCore

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
        port = await core.start(args.listen)
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
    """Embedded PostgreSQL (data reused across runs), the dev core and the service, together."""
    from queue_service.dev_core import DevCore
    from queue_service.embedded_db import EmbeddedPostgres, EmbeddedPostgresError

    started = time.monotonic()
    base = _load_config(log_format=os.environ.get("QUEUE_LOG_FORMAT", "text"))
    telemetry.configure_logging(log_format=base.log_format, level=base.log_level)
    telemetry.configure(service_name="acurio-queue-dev", console_traces=base.trace_console, metrics_addr=base.metrics_addr)

    state_dir = Path(os.environ.get("QUEUE_STATE_DIR", ".state")).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    database_url = base.database_url
    embedded: EmbeddedPostgres | None = None
    if not database_url:
        embedded = EmbeddedPostgres(state_dir / "postgres", port=_dev_pg_port())
        try:
            database_url = embedded.start()
        except EmbeddedPostgresError as exc:
            print(f"queue-service dev: could not start the embedded PostgreSQL: {exc}", file=sys.stderr)
            return 1
        log.info("embedded PostgreSQL at %s (data in %s)", database_url, embedded.data_dir)

    async def run() -> None:
        core: DevCore | None = None
        core_addr = base.core_addr
        if not core_addr:
            core = DevCore(
                judging_seconds=float(os.environ.get("QUEUE_DEV_CORE_JUDGING_SECONDS", "5")),
                callback_token=os.environ.get("QUEUE_DEV_CORE_CALLBACK_TOKEN", ""),
            )
            core_port = await core.start("127.0.0.1:0")
            core_addr = f"127.0.0.1:{core_port}"
            log.info("dev core on %s (judging %.1fs)", core_addr, core.judging_seconds)
        config = _load_config(
            database_url=database_url,
            core_addr=core_addr,
            log_format=base.log_format,
            sweep_interval_seconds=base.sweep_interval_seconds,
            http_addr=base.http_addr or _dev_http_addr(),
        )

        def announce(app) -> None:  # type: ignore[no-untyped-def]
            host = config.listen_addr.rpartition(":")[0]
            address = f"{host}:{app.port}"
            if core is not None:
                core.set_callback_addr(address)
            print(_banner(address, time.monotonic() - started), flush=True)
            if app.http_port:
                http_host = config.http_addr.rpartition(":")[0]
                print(f"Web console: http://{http_host}:{app.http_port}/\n", flush=True)

        try:
            await _serve_until_signal(config, on_serving=announce)
        finally:
            if core is not None:
                await core.stop()

    try:
        asyncio.run(run())
    finally:
        if embedded is not None and not args.keep_db_running:
            embedded.stop()
    return 0


def _dev_pg_port() -> int:
    """QUEUE_DEV_PG_PORT when set; else 54329, or any free port when another program holds it."""
    from queue_service.embedded_db import free_port, port_is_free

    configured = os.environ.get("QUEUE_DEV_PG_PORT")
    if configured:
        return int(configured)
    return 54329 if port_is_free(54329) else free_port()


def _dev_http_addr() -> str:
    """The console's address for `dev`: 127.0.0.1:8080, or any free port when it is taken."""
    from queue_service.embedded_db import free_port, port_is_free

    return f"127.0.0.1:{8080 if port_is_free(8080) else free_port()}"


def _banner(address: str, seconds: float) -> str:
    return f"""
Acurio analysis queue is SERVING on {address} (ready in {seconds:.1f}s). Try:

  grpcurl -plaintext {address} list
  grpcurl -plaintext -d '{{"user_id":"ada","amount":5,"idempotency_key":"grant-1"}}' {address} acurio.queue.v1.CreditsService/GrantCredits
  grpcurl -plaintext -d '{{"user_id":"ada","idempotency_key":"click-1","document":{{"uri":"s3://theses/1.pdf"}},"sources":[{{"doi":"10.1234/abc"}}]}}' {address} acurio.queue.v1.AnalysisQueueService/Admit

Ctrl-C stops it.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="queue-service", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the gRPC service against DATABASE_URL and QUEUE_CORE_ADDR").set_defaults(func=cmd_serve)
    sub.add_parser("migrate", help="apply pending migrations to DATABASE_URL").set_defaults(func=cmd_migrate)
    dev = sub.add_parser("dev", help="start embedded PostgreSQL, the dev core and the service")
    dev.add_argument("--keep-db-running", action="store_true", help="leave the embedded PostgreSQL running on exit")
    dev.set_defaults(func=cmd_dev)
    core = sub.add_parser("core", help="run the dev core (a stand-in for the Rust core) alone")
    core.add_argument("--listen", default="127.0.0.1:50061")
    core.add_argument("--callback", default="127.0.0.1:50051", help="address of the queue's CoreCallbackService")
    core.add_argument("--judging-seconds", type=float, default=1.0)
    core.add_argument("--manual", action="store_true", help="never complete runs by itself (until SIGUSR1 starts judging)")
    core.add_argument("--daily-budget", type=int, default=1_000_000)
    core.add_argument("--fail-releases", action="store_true")
    core.add_argument("--drop-callbacks", action="store_true")
    core.add_argument("--slow-seconds", type=float, default=0.0)
    core.add_argument("--judging-spread-seconds", type=float, default=0.0, help="on SIGUSR1, spread the held batch's judging starts over this long")
    core.add_argument("--record", metavar="PATH", help="append a JSON line per run created, release received, completion sent/returned")
    core.set_defaults(func=cmd_core)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
