"""The small tools: `probe` (a health check for container engines) and `hash-token` (an auth-file
entry)."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import secrets
import sys
from pathlib import Path

from queue_service.cli.startup import EXIT_CONFIG, StartupFailure, reachable_addr

log = logging.getLogger("queue_service")


def cmd_probe(args: argparse.Namespace) -> int:
    """Exit 0 when the service's health (service "") is SERVING, else 1: a container HEALTHCHECK."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = reachable_addr(args.addr or os.environ.get("QUEUE_LISTEN_ADDR", "127.0.0.1:50051"))
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
    from queue_service.api.access.auth import ROLE_METHODS

    if args.role not in ROLE_METHODS:
        raise StartupFailure(EXIT_CONFIG, f"--role {args.role!r}: expected one of {', '.join(sorted(ROLE_METHODS))}")
    if args.generate:
        token = secrets.token_urlsafe(32)
        print(f"token for {args.name} (hand it to the caller; only its hash is stored): {token}", file=sys.stderr)
    else:
        token = sys.stdin.readline().strip()
        if not token:
            raise StartupFailure(
                EXIT_CONFIG, 'no token on stdin: pipe one in (printf %s "$TOKEN" | queue-service hash-token ...) or use --generate'
            )
    entry = {"name": args.name, "role": args.role, "sha256": hashlib.sha256(token.encode()).hexdigest()}
    print(json.dumps(entry))
    return 0
