"""`queue-service`: serve, migrate, dev (everything for a newcomer), core (the dev core alone),
probe (a health check for container engines), hash-token (an auth-file entry)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from queue_service.cli.dev_stack import cmd_core, cmd_dev
from queue_service.cli.startup import (
    EXIT_ALREADY_RUNNING,
    EXIT_CONFIG,
    EXIT_DATABASE_UNREACHABLE,
    EXIT_EMBEDDED_POSTGRES,
    EXIT_MISSING_EXTRA,
    EXIT_SCHEMA,
    StartupFailure,
    _serve_until_signal,
    cmd_migrate,
    cmd_serve,
    explain_start_failure,
)
from queue_service.cli.tools import cmd_hash_token, cmd_probe

__all__ = [
    "EXIT_ALREADY_RUNNING",
    "EXIT_CONFIG",
    "EXIT_DATABASE_UNREACHABLE",
    "EXIT_EMBEDDED_POSTGRES",
    "EXIT_MISSING_EXTRA",
    "EXIT_SCHEMA",
    "StartupFailure",
    "_serve_until_signal",
    "explain_start_failure",
    "main",
]


def main(argv: list[str] | None = None) -> int:
    """Runs the command `argv` names; its exit code (a failed start's is the failure's)."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except StartupFailure as failure:
        return _report_start_failure(args, failure)


def _parser() -> argparse.ArgumentParser:
    """Every command with its flags; each sets `func`, the function that runs it."""
    # The commands that start something take --debug, for a failed start's traceback.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="on a failed start, print the traceback too")
    parser = argparse.ArgumentParser(prog="queue-service", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", parents=[common], help="run the gRPC service against DATABASE_URL and QUEUE_CORE_ADDR").set_defaults(
        func=cmd_serve
    )
    sub.add_parser(
        "migrate", parents=[common], help="apply pending migrations and changed SQL function files to DATABASE_URL"
    ).set_defaults(func=cmd_migrate)
    dev = sub.add_parser("dev", parents=[common], help="start embedded PostgreSQL, the dev core and the service")
    dev.add_argument("--keep-db-running", action="store_true", help="leave the embedded PostgreSQL running on exit")
    dev.set_defaults(func=cmd_dev)
    _add_core_command(sub, common)
    _add_probe_command(sub)
    _add_hash_token_command(sub)
    return parser


def _add_core_command(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    """`core`: the dev core alone, with the switches that make it a slow, failing or forgetful core."""
    core = sub.add_parser(
        "core",
        parents=[common],
        help="run the dev core (a stand-in for the Rust core) alone",
        # Every flag says what it does and its default.
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    core.add_argument("--listen", default="127.0.0.1:50061", help="host:port the dev core's RunService listens on")
    core.add_argument("--callback", default="127.0.0.1:50051", help="address of the queue's CoreCallbackService")
    core.add_argument("--judging-seconds", type=float, default=1.0, help="how long a released run judges before its completion is sent")
    core.add_argument("--manual", action="store_true", help="never complete runs by itself (until SIGUSR1 starts judging)")
    core.add_argument(
        "--daily-budget",
        type=int,
        default=1_000_000,
        help="CreateRun calls taken per day; then RESOURCE_EXHAUSTED (the queue answers PROVIDER_BUDGET_EXHAUSTED)",
    )
    core.add_argument("--fail-releases", action="store_true", help="answer every ReleaseRun UNAVAILABLE (a stuck release)")
    core.add_argument("--drop-callbacks", action="store_true", help="never send CompleteRun (a lost completion: the sweeper reconciles)")
    core.add_argument("--slow-seconds", type=float, default=0.0, help="delay every answer by this long (a slow core)")
    core.add_argument(
        "--judging-ceiling",
        type=int,
        default=None,
        help="answer ReleaseRun RESOURCE_EXHAUSTED while this many runs judge (none: no ceiling)",
    )
    core.add_argument(
        "--judging-spread-seconds", type=float, default=0.0, help="on SIGUSR1, spread the held batch's judging starts over this long"
    )
    core.add_argument(
        "--record",
        metavar="PATH",
        default=None,
        help="append a JSON line per run created, release received, completion sent/returned (none: no record)",
    )
    core.set_defaults(func=cmd_core)


def _add_probe_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`probe`: a health check for container engines."""
    probe = sub.add_parser("probe", help="exit 0 when the service answers health SERVING (a container HEALTHCHECK)")
    probe.add_argument("--addr", help="host:port to check (default: QUEUE_LISTEN_ADDR, a wildcard host as 127.0.0.1)")
    probe.add_argument("--service", default="", help="health service name (default: the whole server)")
    probe.add_argument("--timeout", type=float, default=3.0)
    probe.add_argument("--tls-ca", metavar="PEM", help="CA bundle: check over TLS")
    probe.add_argument("--server-name", help="name the TLS certificate is issued to, when not the address's host")
    probe.set_defaults(func=cmd_probe)


def _add_hash_token_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`hash-token`: an auth-file entry for a bearer token."""
    hash_token = sub.add_parser("hash-token", help="print a QUEUE_AUTH_FILE entry for a bearer token (read from stdin)")
    hash_token.add_argument("--name", required=True, help="who holds the token, e.g. web-backend")
    hash_token.add_argument("--role", required=True, help="web, core, operator or viewer")
    hash_token.add_argument("--generate", action="store_true", help="make a random token (printed to stderr) instead of reading one")
    hash_token.set_defaults(func=cmd_hash_token)


def _report_start_failure(args: argparse.Namespace, failure: StartupFailure) -> int:
    """Says why the command could not start (with the cause's traceback when debugging an
    unexpected failure); the failure's exit code."""
    debug = getattr(args, "debug", False) or os.environ.get("QUEUE_LOG_LEVEL", "").strip().lower() == "debug"
    if debug and failure.__cause__ is not None and not failure.expected:
        print(failure.redact("".join(traceback.format_exception(failure.__cause__))), end="", file=sys.stderr)
    print(f"queue-service {args.command}: {failure}", file=sys.stderr)
    return failure.exit_code
