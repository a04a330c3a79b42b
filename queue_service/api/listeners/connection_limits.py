"""HTTP/2 limits of the gRPC listener: what one client connection may hold, and for how long.

gRPC's defaults suit a trusted network: unlimited streams per connection, a peer that vanished
without a FIN (a half-open connection) noticed only after two hours, connections that live
forever. Health needs no credentials, so anyone who reaches the listener gets these defaults.

- Streams per connection (QUEUE_MAX_STREAMS_PER_CONNECTION): a client beyond it waits for a
  free stream (it is not refused), so it stays above what one web backend process multiplexes
  on its connection: its WatchJobs streams plus its unary calls in flight.
- Keepalive: the server pings a quiet connection every minute and closes it when 20 s pass
  without an answer, so the streams of a vanished peer (WatchJobs, Health.Watch) end within
  ~80 s instead of two hours.
- Client pings: our clients (TypeScript, Rust) ping every 30 s, also while idle or while a
  stream is quiet. gRPC's default expects at most one ping per 5 minutes on a connection sending
  no data (one per 2 hours on a connection without calls) and answers the third early one with
  GOAWAY `too_many_pings`; here a ping every 10 s is fine, anything faster counts as abuse.
- Connection idle and age: a connection without calls for 10 minutes is closed (clients
  reconnect on their next call); any connection is asked to go away after 30 minutes (±10%
  jitter by gRPC), which also spreads long-lived clients over new replicas, and its calls get
  5 minutes more. A WatchJobs stream then ends with UNAVAILABLE, as in a drain, and the client
  reconnects.
"""

from __future__ import annotations

_MINUTE_MS = 60_000

KEEPALIVE_TIME_MS = 1 * _MINUTE_MS
KEEPALIVE_TIMEOUT_MS = 20_000
MIN_CLIENT_PING_INTERVAL_MS = 10_000
MAX_CONNECTION_IDLE_MS = 10 * _MINUTE_MS
MAX_CONNECTION_AGE_MS = 30 * _MINUTE_MS
MAX_CONNECTION_AGE_GRACE_MS = 5 * _MINUTE_MS


def connection_options(max_streams_per_connection: int) -> list[tuple[str, int]]:
    """grpc.aio.server options bounding each client connection."""
    return [
        ("grpc.max_concurrent_streams", max_streams_per_connection),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", MAX_CONNECTION_IDLE_MS),
        ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
        ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
    ]
