"""The Connect protocol as the browser speaks it, for the tests of the browser endpoint: one
POST, a unary call as JSON, a stream's envelopes, and the details of a Connect error."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import struct
from typing import Any

from google.rpc import error_details_pb2


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


async def connect_unary(port: int, method: str, message: dict[str, Any], token: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json", "connect-protocol-version": "1"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    status, _, body = await asyncio.to_thread(post, port, f"/acurio.queue.v1.{method}", json.dumps(message).encode(), headers)
    return status, json.loads(body)


def error_details(error: dict[str, Any]) -> tuple[str, list[str]]:
    """(ErrorInfo reason, BadRequest fields) of a Connect error body."""
    reason, fields = "", []
    for detail in error.get("details", []):
        raw = base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
        if detail["type"] == "google.rpc.ErrorInfo":
            info = error_details_pb2.ErrorInfo.FromString(raw)
            assert info.domain == "queue.acurio.app"
            reason = info.reason
        elif detail["type"] == "google.rpc.BadRequest":
            fields = [v.field for v in error_details_pb2.BadRequest.FromString(raw).field_violations]
    return reason, fields


def envelopes(body: bytes) -> list[tuple[int, dict[str, Any]]]:
    """The (flags, message) envelopes of a Connect stream's body."""
    found, offset = [], 0
    while offset < len(body):
        flags, length = struct.unpack(">BI", body[offset : offset + 5])
        found.append((flags, json.loads(body[offset + 5 : offset + 5 + length] or b"{}")))
        offset += 5 + length
    return found
