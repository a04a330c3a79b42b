"""Settings from the environment, validated once at start.

Every variable of the design's configuration table is here, plus the bounds that keep a
replica from waiting forever (timeouts, pool size, stream caps). A bad value stops start-up with
a message naming the variable, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Settings = TypeVar("Settings", bound=DataclassInstance)


class ConfigError(ValueError):
    """A configuration variable has a value the service cannot run with."""


# The parsers of the settings: each takes a variable's raw text and returns its value, or raises
# ValueError saying what is allowed (the start-up message quotes it).


def _parse_number(kind: type, low: float, high: float) -> Callable[[str], Any]:
    noun = "an integer" if kind is int else "a number"

    def parse(raw: str) -> Any:
        try:
            value = kind(raw.strip())
        except ValueError:
            raise ValueError(f"expected {noun} between {low} and {high}") from None
        if not low <= value <= high:
            raise ValueError(f"expected {noun} between {low} and {high}")
        return value

    return parse


def int_between(low: int, high: int) -> Callable[[str], int]:
    return _parse_number(int, low, high)


def float_between(low: float, high: float) -> Callable[[str], float]:
    return _parse_number(float, low, high)


def boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def host_port(raw: str) -> str:
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected host:port, for example 127.0.0.1:50051")
    return raw.strip()


def optional_host_port(raw: str) -> str:
    return host_port(raw) if raw.strip() else ""


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


# A DNS name (letters, digits, hyphens, dots) or an IPv4/IPv6 literal, without a port.
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?$")


def host_names(raw: str) -> tuple[str, ...]:
    names = []
    for item in raw.split(","):
        name = item.strip().lower()
        if not name:
            continue
        literal = name.removeprefix("[").removesuffix("]")
        try:
            ipaddress.ip_address(literal)
            names.append(literal)
            continue
        except ValueError:
            pass
        if not _HOST_NAME.match(name):
            raise ValueError(
                f"{item.strip()!r} is not a host name; expected names without ports or wildcards, comma-separated, e.g. queue.example.com,console.example.com"
            )
        names.append(name.rstrip("."))
    return tuple(names)


def trimmed_text(raw: str) -> str:
    return raw.strip()


def connection_string(raw: str) -> str:
    """A libpq connection string or URI, checked for syntax only (reachability is a start-up check)."""
    from psycopg import conninfo

    value = raw.strip()
    if value:
        try:
            params = conninfo.conninfo_to_dict(value)
        except Exception as exc:  # psycopg.ProgrammingError: libpq's own words on what is wrong
            problem = redact_dsn_in(str(exc).strip(), value)
            raise ValueError(
                f"not a PostgreSQL connection string ({problem}), expected e.g. postgresql://user:password@host:5432/dbname"
            ) from None
        ports = str(params.get("port") or "5432").split(",")
        if not all(port.strip().isdigit() for port in ports):
            raise ValueError(f"port {params.get('port')!r} is not a number")
    return value


def optional_port(raw: str) -> int:
    return int_between(1, 65535)(raw) if raw.strip() else 0


def non_empty_text(raw: str) -> str:
    if not raw.strip():
        raise ValueError("expected a non-empty value")
    return raw.strip()


# Keywords whose values a redacted DSN still shows: where and as whom it connects, never a
# secret. Any other keyword's value is hidden, a misspelt `pasword=` included.
_SHOWN_DSN_KEYWORDS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "application_name",
        "connect_timeout",
        "target_session_attrs",
        "load_balance_hosts",
        "gssencmode",
        "channel_binding",
        "service",
    }
)
_DSN_WORD = re.compile(r"(\w+)(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)|(\S+)|(\s+)")


def _redacted_dsn(dsn: str) -> tuple[str, list[str]]:
    """The DSN with every secret replaced by ***, and the secrets, for scrubbing messages that quote them.

    Made without parsing the DSN, so it also holds for the malformed ones libpq refuses."""
    secrets: list[str] = []
    if re.match(r"\s*postgres(?:ql)?://", dsn):
        scheme, _, rest = dsn.partition("://")
        head = f"{scheme}://"
        # The last @ ends the user and password: an unescaped @ in the password stays hidden
        # (libpq itself splits at the first, and names the rest of the password as the host).
        at = rest.rfind("@")
        if at >= 0:
            user, colon, password = rest[:at].partition(":")
            if colon:
                secrets.append(password)
                secrets.extend(password.split("@"))
            head += f"{user}{':***' if colon else ''}@"
            rest = rest[at + 1 :]
        base, question, query = rest.partition("?")
        if question:
            items = []
            for item in query.split("&"):
                key, equals, value = item.partition("=")
                if equals and key.lower() not in _SHOWN_DSN_KEYWORDS:
                    secrets.append(value)
                    item = f"{key}=***"
                items.append(item)
            rest = f"{base}?{'&'.join(items)}"
        return head + rest, secrets
    words = []
    for match in _DSN_WORD.finditer(dsn):
        key, equals, value, bare, space = match.groups()
        if space is not None:
            words.append(space)
        elif bare is not None:  # a piece of a value with an unquoted space in it
            secrets.append(bare)
            words.append("***")
        elif key.lower() in _SHOWN_DSN_KEYWORDS:
            words.append(match.group(0))
        else:
            secrets.append(value)
            secrets.append(value.strip("'"))
            words.append(f"{key}{equals}***")
    return "".join(words), secrets


def redact_dsn(dsn: str) -> str:
    """The DSN with its password (and every value that may be a secret) replaced by ***, for
    messages and logs."""
    return _redacted_dsn(dsn)[0]


@functools.lru_cache(maxsize=8)
def _dsn_scrub(dsn: str) -> tuple[str, tuple[str, ...]]:
    """The redacted DSN and its secrets, longest first: worked out once per DSN, as every log
    line passes through `redact_dsn_in`."""
    redacted, secrets = _redacted_dsn(dsn)
    return redacted, tuple(sorted({s for s in secrets if s}, key=len, reverse=True))


def redact_dsn_in(text: str, *dsns: str) -> str:
    """`text` with each of `dsns` redacted, and every piece of their secrets that libpq or
    psycopg quoted in it (`after "ret"`, a host `'ss@db'`) replaced by ***."""
    for dsn in dsns:
        if not dsn:
            continue
        redacted, secrets = _dsn_scrub(dsn)
        text = text.replace(dsn, redacted)
        for secret in secrets:
            if secret not in text:
                continue  # nothing quoted holds it (the common case: a line with no secret)
            # re.sub calls the lambda before the loop moves on, so it sees this iteration's secret.
            text = re.sub(r""""[^"]*"|'[^']*'""", lambda quoted: quoted.group(0).replace(secret, "***"), text)  # noqa: B023
    return text


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: its name, its default as written in the environment (parsed like
    any other value), the parser that checks it, and its meaning for docs/configuration.md."""

    env: str
    default: str
    parse: Callable[[str], Any]
    meaning: str


def setting(env: str, default: str, parse: Callable[[str], Any], meaning: str) -> Any:
    """A field of Config or DevConfig read from `env`: the one place a setting is declared."""
    return dataclasses.field(metadata={"setting": Setting(env, default, parse, meaning)})


def _settings_of(cls: type) -> dict[str, Setting]:
    return {field.name: field.metadata["setting"] for field in dataclasses.fields(cls)}


def _parse_settings(settings: Mapping[str, Setting], environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    problems: list[str] = []
    for field, declared in settings.items():
        raw = environ.get(declared.env, declared.default)
        try:
            values[field] = declared.parse(raw)
        except ValueError as exc:
            shown = redact_dsn(raw) if declared.parse is connection_string else raw
            problems.append(f"{declared.env}={shown!r}: {exc}")
    return values, problems


# Settings only `queue-service dev` reads (docs/configuration.md lists them under their own heading).
@dataclasses.dataclass(frozen=True)
class DevConfig:
    state_dir: str = setting(
        "QUEUE_STATE_DIR", ".state", non_empty_text, "folder of the embedded PostgreSQL's data and the dev core's runs"
    )
    pg_port: int = setting("QUEUE_DEV_PG_PORT", "", optional_port, "port of the embedded PostgreSQL")
    core_judging_seconds: float = setting(
        "QUEUE_DEV_CORE_JUDGING_SECONDS", "5", float_between(0.0, 86400), "how long the dev core judges a run"
    )
    core_callback_token: str = setting(
        "QUEUE_DEV_CORE_CALLBACK_TOKEN",
        "",
        trimmed_text,
        "the dev core's bearer token for `CompleteRun` under `QUEUE_AUTH_FILE` (must be a `core` token of that file)",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DevConfig:
        values, problems = _parse_settings(_settings_of(cls), os.environ if environ is None else environ)
        if problems:
            raise ConfigError("invalid configuration: " + "; ".join(problems))
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Config:
    # Each field is one setting (`setting`); their order is the order of docs/configuration.md.
    database_url: str = setting("DATABASE_URL", "", connection_string, "PostgreSQL DSN; unset: `dev` starts an embedded PostgreSQL")
    listen_database_url: str = setting(
        "QUEUE_LISTEN_DATABASE_URL",
        "",
        connection_string,
        "DSN for the one LISTEN connection per replica when `DATABASE_URL` goes through a transaction-mode pooler (LISTEN needs a session)",
    )
    listen_addr: str = setting("QUEUE_LISTEN_ADDR", "127.0.0.1:50051", host_port, "host:port to serve gRPC on")
    http_addr: str = setting(
        "QUEUE_HTTP_ADDR",
        "",
        optional_host_port,
        "host:port of the web console and the Connect / gRPC-Web endpoint (same services, roles and errors as gRPC); empty: none (`dev`: `127.0.0.1:8080`, or a free port when taken)",
    )
    http_allowed_hosts: tuple[str, ...] = setting(
        "QUEUE_HTTP_ALLOWED_HOSTS",
        "",
        host_names,
        "comma-separated host names the browser endpoint answers to besides its own address, `localhost`, 127.0.0.1 and ::1 (the names its users and proxies reach it by); a request with any other `Host` hears 421, so a page on another name that resolves to this endpoint (DNS rebinding) cannot use it",
    )
    core_addr: str = setting(
        "QUEUE_CORE_ADDR", "", optional_host_port, "host:port of the core's RunService; unset: `dev` starts the dev core"
    )
    max_active_per_user: int = setting(
        "QUEUE_MAX_ACTIVE_PER_USER",
        "1",
        int_between(1, 1000),
        "first-pass slots per user (`OperatorService.SetUserQueueLimit` changes it per user)",
    )
    core_capacity: int = setting(
        "QUEUE_CORE_CAPACITY",
        "0",
        int_between(0, 1_000_000),
        "the most first-pass runs being released or judging at the core at once across every replica (delta re-checks count too but never wait); `0`: unlimited. Only seeds a fresh database: afterwards `OperatorService.SetCoreCapacity` changes it at run time",
    )
    core_probe_interval_seconds: float = setting(
        "QUEUE_CORE_PROBE_INTERVAL_SECONDS",
        "1",
        float_between(0.05, 600),
        "while the core answers releases `RESOURCE_EXHAUSTED`, the fleet tries one release above what the core took at most this often",
    )
    max_queued_per_user: int = setting(
        "QUEUE_MAX_QUEUED_PER_USER", "100", int_between(1, 100_000), "queued jobs per user before `USER_QUEUE_FULL`"
    )
    release_window_seconds: float = setting(
        "QUEUE_RELEASE_WINDOW_SECONDS", "1800", float_between(0.1, 7 * 86400), "how long release is retried after promotion"
    )
    sweep_interval_seconds: float = setting(
        "QUEUE_SWEEP_INTERVAL_SECONDS", "30", float_between(0.0, 86400), "sweeper period (jittered); `0` disables it"
    )
    max_active_deltas_per_user: int = setting(
        "QUEUE_MAX_ACTIVE_DELTAS_PER_USER",
        "4",
        int_between(1, 10_000),
        "delta re-checks running at once per user before `USER_DELTA_LIMIT` (`RESOURCE_EXHAUSTED`)",
    )
    max_free_admits_per_user_per_hour: int = setting(
        "QUEUE_MAX_FREE_ADMITS_PER_USER_PER_HOUR",
        "20",
        int_between(1, 100_000),
        "jobs of a user admitted within the last hour that cost nothing in the end by her own choice (a delta re-check at `QUEUE_DELTA_PRICE` 0, a job refunded after she canceled it; never a refund she did not ask for, such as the core's failure or an operator's cancel) before her next Admit answers `USER_FREE_WORK_LIMIT` (`RESOURCE_EXHAUSTED`, RetryInfo: when the oldest of them leaves the hour). An operator's `RetryJob`/`RetryJobs` is never refused by it. Bounds what one user can store for free (docs/security.md, \"What one user can store\")",
    )
    job_inputs_retention_seconds: float = setting(
        "QUEUE_JOB_INPUTS_RETENTION_SECONDS",
        "86400",
        float_between(1, 10 * 366 * 86400),
        "an ended job's full sources (what `OperatorService.RetryJob` admits again) are deleted this long after it ended; its document, first 10 sources and source count stay. A retry after that answers `JOB_INPUTS_PRUNED`",
    )
    job_retention_seconds: float = setting(
        "QUEUE_JOB_RETENTION_SECONDS",
        str(30 * 86400),
        float_between(1, 10 * 366 * 86400),
        "an ended job (its run settled) is deleted this long after it ended, once no kept delta re-check names it as its base, and never within an hour of its admit (the free-work limit counts the hour's jobs); its ledger entries stay, and open WatchJobs streams are told it vanished. Its idempotency key is remembered as long. Keep it well above how long the core retries a `CompleteRun` (a day)",
    )
    prune_interval_seconds: float = setting(
        "QUEUE_PRUNE_INTERVAL_SECONDS",
        "60",
        float_between(0.0, 86400),
        "the sweeper's pruner (ended jobs' sources and ended jobs past their retention) runs at the first sweeper pass this long after its previous run, never more often than the sweeper, and at every pass while its previous run left rows past their retention; `0`: every pass",
    )
    admit_price: int = setting("QUEUE_ADMIT_PRICE", "1", int_between(0, 1_000_000), "credits per first-pass job")
    delta_price: int = setting("QUEUE_DELTA_PRICE", "0", int_between(0, 1_000_000), "credits per delta re-check")
    core_deadline_seconds: float = setting(
        "QUEUE_CORE_DEADLINE_SECONDS", "5", float_between(0.05, 120), "deadline of calls to the core (admit retries included)"
    )
    release_lease_seconds: float = setting(
        "QUEUE_RELEASE_LEASE_SECONDS",
        "15",
        float_between(0.1, 3600),
        "a claimed release is reserved this long before another replica may retry it",
    )
    release_backoff_max_seconds: float = setting(
        "QUEUE_RELEASE_BACKOFF_MAX_SECONDS", "60", float_between(0.01, 3600), "cap of the release retry backoff"
    )
    core_reconcile_interval_seconds: float = setting(
        "QUEUE_CORE_RECONCILE_INTERVAL_SECONDS",
        "60",
        float_between(0.0, 86400),
        "the sweeper reconciles the core's live runs (`ListRuns`) with the jobs at most this often, and at once when the database's timeline changes (a failover); `0`: only then",
    )
    reconcile_after_seconds: float = setting(
        "QUEUE_RECONCILE_AFTER_SECONDS",
        "900",
        float_between(0.1, 7 * 86400),
        "a RUNNING job without completion this long is checked with `GetRun`",
    )
    grace_period_seconds: float = setting(
        "QUEUE_GRACE_PERIOD_SECONDS", "10", float_between(0.0, 600), "on SIGTERM: time for in-flight calls to finish"
    )
    lock_timeout_ms: int = setting("QUEUE_LOCK_TIMEOUT_MS", "5000", int_between(1, 600_000), "`lock_timeout` of every transaction")
    statement_timeout_ms: int = setting(
        "QUEUE_STATEMENT_TIMEOUT_MS", "10000", int_between(1, 600_000), "`statement_timeout` of every transaction"
    )
    pool_min_size: int = setting("QUEUE_DB_POOL_MIN_SIZE", "2", int_between(1, 1000), "database connections kept open")
    pool_max_size: int = setting("QUEUE_DB_POOL_MAX_SIZE", "20", int_between(1, 1000), "database connections at most")
    pool_timeout_seconds: float = setting(
        "QUEUE_DB_POOL_TIMEOUT_SECONDS", "5", float_between(0.05, 600), "wait for a free connection before `UNAVAILABLE`"
    )
    db_dead_peer_seconds: int = setting(
        "QUEUE_DB_DEAD_PEER_SECONDS",
        "10",
        int_between(2, 3600),
        "how long a silent database peer (a crashed node, a cut network) may stay unnoticed: every connection gets TCP keepalives (idle half of it, probes a sixth of it apart, 3 probes) and tcp_user_timeout of this many seconds, unless DATABASE_URL sets them",
    )
    db_liveness_seconds: float = setting(
        "QUEUE_DB_LIVENESS_SECONDS",
        "2",
        float_between(0.1, 600),
        "the LISTEN connection runs a liveness query after this long without traffic and reconnects (then resyncs every stream) when no answer comes within it again",
    )
    db_reconnect_max_seconds: float = setting(
        "QUEUE_DB_RECONNECT_MAX_SECONDS",
        "0.5",
        float_between(0.05, 60),
        "longest wait between two attempts to reconnect to the database (pool and LISTEN connection), so the service follows a database that is back within about this long",
    )
    db_start_wait_seconds: float = setting(
        "QUEUE_DB_START_WAIT_SECONDS",
        "300",
        float_between(0, 86400),
        "`serve` waits this long for an unreachable database at start, retrying and logging, before it exits 4; 0: exit at once. SIGTERM ends the wait at once (exit 0)",
    )
    db_prepared_statements: bool = setting(
        "QUEUE_DB_PREPARED_STATEMENTS",
        "true",
        boolean,
        "let the driver prepare statements it runs often on the server; false behind PgBouncer in transaction mode before 1.21 (or without max_prepared_statements)",
    )
    health_interval_seconds: float = setting(
        "QUEUE_HEALTH_INTERVAL_SECONDS",
        "0.5",
        float_between(0.05, 60),
        "how often health commits a tiny durable write (given 1 s): readiness follows the database, writes included, within about this long",
    )
    migrate_on_start: bool = setting("QUEUE_MIGRATE_ON_START", "true", boolean, "`serve` applies pending migrations first")
    max_concurrent_calls: int = setting(
        "QUEUE_MAX_CONCURRENT_CALLS",
        "16",
        int_between(1, 100_000),
        "unary calls one replica works on at once; more wait their turn as long as their deadline allows (without one, `QUEUE_DB_POOL_TIMEOUT_SECONDS`), then hear `UNAVAILABLE` `REPLICA_BUSY`; keeps an overloaded replica answering within deadlines; raise it when the core answers slowly and the replica has CPU to spare",
    )
    max_concurrent_calls_per_caller: int = setting(
        "QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER",
        "0",
        int_between(0, 100_000),
        "of `QUEUE_MAX_CONCURRENT_CALLS`, the unary calls one caller may have worked on at once, on both listeners together: a caller is a token's or certificate's entry in the auth file (the core, an operator, each web token); with authentication off no caller is told apart and only `QUEUE_MAX_CONCURRENT_CALLS` applies; more of its calls wait their turn within their deadline, then hear `UNAVAILABLE` `REPLICA_BUSY`, so one caller leaves the rest of the slots to the others; `0`: half of `QUEUE_MAX_CONCURRENT_CALLS` (at least 1) ([security.md](security.md))",
    )
    max_streams_per_user: int = setting(
        "QUEUE_MAX_STREAMS_PER_USER",
        "16",
        int_between(1, 100_000),
        "open WatchJobs streams per caller, user and replica (each caller's own: another caller's streams never lock an operator out of a user); operators may open this many beyond `QUEUE_MAX_STREAMS`",
    )
    max_streams: int = setting(
        "QUEUE_MAX_STREAMS",
        "2000",
        int_between(1, 1_000_000),
        "open streams per replica (WatchJobs, WatchOverview and server reflection, on both listeners together; `Health.Watch` has its own bound); more are refused with `RESOURCE_EXHAUSTED` `TOO_MANY_STREAMS`; operators may open `QUEUE_MAX_STREAMS_PER_USER` beyond it",
    )
    max_streams_per_caller: int = setting(
        "QUEUE_MAX_STREAMS_PER_CALLER",
        "0",
        int_between(0, 1_000_000),
        "of `QUEUE_MAX_STREAMS`, the streams one caller may have open at once, on both listeners together (a caller as for `QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER`; with authentication off only `QUEUE_MAX_STREAMS` applies); more are refused with `RESOURCE_EXHAUSTED` `TOO_MANY_STREAMS` (`maxStreamsPerCaller`), so one web token leaves the rest of the streams to the other callers; `0`: half of `QUEUE_MAX_STREAMS` (at least 1). Raise it (with `QUEUE_MAX_STREAMS`) when one web backend serves more open pages per replica ([security.md](security.md))",
    )
    watch_backlog_bytes: int = setting(
        "QUEUE_WATCH_BACKLOG_BYTES",
        "65536",
        int_between(4096, 1 << 30),
        "changes one WatchJobs stream may hold for a slow reader, in estimated bytes (about 1 KB a job plus its error text); beyond it they are dropped and the stream resyncs. Part of a stream's memory budget ([operations.md](operations.md#11-memory-per-watchjobs-stream))",
    )
    max_health_watches: int = setting(
        "QUEUE_MAX_HEALTH_WATCHES",
        "256",
        int_between(1, 100_000),
        "open `Health.Watch` streams per replica (health needs no credentials); more are refused with `RESOURCE_EXHAUSTED` `TOO_MANY_STREAMS`",
    )
    max_streams_per_connection: int = setting(
        "QUEUE_MAX_STREAMS_PER_CONNECTION",
        "4096",
        int_between(1, 1_000_000),
        "calls one client connection may have open at once (HTTP/2 max concurrent streams); a client beyond it waits for a free stream, so keep it above what one web backend multiplexes (its WatchJobs streams plus its calls in flight). Keepalive and connection-age limits: `queue_service/api/listeners/connection_limits.py`",
    )
    http_max_connections: int = setting(
        "QUEUE_HTTP_MAX_CONNECTIONS",
        "512",
        int_between(1, 1_000_000),
        "connections the browser listener (`QUEUE_HTTP_ADDR`) holds at once, at most half of the process's descriptor limit (`RLIMIT_NOFILE`) so the rest stays for the gRPC listener and the database; beyond it new connections wait in the kernel's backlog ([security.md](security.md))",
    )
    http_body_timeout_seconds: float = setting(
        "QUEUE_HTTP_BODY_TIMEOUT_SECONDS",
        "10",
        float_between(0.1, 600),
        "time a browser-listener request may take to send its body after its headers; a slower one is answered `DEADLINE_EXCEEDED` (HTTP 408) and its HTTP/1.1 connection closed",
    )
    reflection: bool = setting("QUEUE_REFLECTION", "true", boolean, "serve gRPC server reflection")
    log_format: str = setting("QUEUE_LOG_FORMAT", "json", one_of("json", "text"), "log lines as JSON or readable text")
    log_level: str = setting("QUEUE_LOG_LEVEL", "info", one_of("debug", "info", "warning", "error"), "log level")
    metrics_addr: str = setting("QUEUE_METRICS_ADDR", "", optional_host_port, "host:port of a Prometheus scrape endpoint; empty: none")
    trace_console: bool = setting("QUEUE_TRACE_CONSOLE", "false", boolean, "print spans to the console (for `dev`)")
    tls_cert_file: str = setting(
        "QUEUE_TLS_CERT_FILE", "", trimmed_text, "PEM certificate chain of the listener; set with the key to serve TLS"
    )
    tls_key_file: str = setting("QUEUE_TLS_KEY_FILE", "", trimmed_text, "PEM private key of the listener")
    tls_client_ca_file: str = setting(
        "QUEUE_TLS_CLIENT_CA_FILE", "", trimmed_text, "PEM CA bundle: require client certificates (mutual TLS)"
    )
    auth_file: str = setting(
        "QUEUE_AUTH_FILE",
        "",
        trimmed_text,
        "JSON file mapping bearer tokens (SHA-256) and certificate names to roles; set: every call but health is authenticated",
    )
    credentials_reload_seconds: float = setting(
        "QUEUE_CREDENTIALS_RELOAD_SECONDS",
        "60",
        float_between(0.0, 86400),
        "how often the auth file, the listener's TLS files and the user assertion key file are checked and re-read when they changed, without a restart; `SIGHUP` re-reads them at once; `0`: on `SIGHUP` only",
    )
    allow_unauthenticated: bool = setting(
        "QUEUE_ALLOW_UNAUTHENTICATED",
        "false",
        boolean,
        "allow a non-loopback listener without `QUEUE_AUTH_FILE` (behind a trusted proxy only)",
    )
    tls_terminated_upstream: bool = setting(
        "QUEUE_TLS_TERMINATED_UPSTREAM",
        "false",
        boolean,
        "with `QUEUE_AUTH_FILE` but no `QUEUE_TLS_CERT_FILE`, a non-loopback listener (`QUEUE_LISTEN_ADDR`, `QUEUE_HTTP_ADDR`) is refused, since bearer tokens would cross the network in plaintext; `true` states that a mesh or ingress terminates TLS in front of it",
    )
    user_assertion_key_file: str = setting(
        "QUEUE_USER_ASSERTION_KEY_FILE",
        "",
        trimmed_text,
        "per-user assertions (needs `QUEUE_AUTH_FILE`): the web backend's Ed25519, ECDSA P-256 or RSA public key (PEM, recommended; several during a key rotation) or an HS256 secret file; set, every `web` call must carry a JWT in `x-user-assertion` whose `sub` is its `user_id` ([security](security.md))",
    )
    user_assertion_issuer: str = setting("QUEUE_USER_ASSERTION_ISSUER", "", trimmed_text, "the `iss` every user assertion must carry")
    user_assertion_audience: str = setting(
        "QUEUE_USER_ASSERTION_AUDIENCE", "acurio-queue", non_empty_text, "the `aud` every user assertion must carry"
    )
    user_assertion_max_age_seconds: float = setting(
        "QUEUE_USER_ASSERTION_MAX_AGE_SECONDS", "300", float_between(1, 86400), "longest lifetime (`exp` − `iat`) of a user assertion"
    )
    user_assertion_leeway_seconds: float = setting(
        "QUEUE_USER_ASSERTION_LEEWAY_SECONDS", "30", float_between(0, 600), "clock skew allowed on its `exp`, `iat`, `nbf`"
    )
    core_tls_ca_file: str = setting("QUEUE_CORE_TLS_CA_FILE", "", trimmed_text, "PEM CA bundle: call the core over TLS")
    core_tls_cert_file: str = setting("QUEUE_CORE_TLS_CERT_FILE", "", trimmed_text, "PEM client certificate for the core (mutual TLS)")
    core_tls_key_file: str = setting("QUEUE_CORE_TLS_KEY_FILE", "", trimmed_text, "PEM client key for the core")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Reads every setting; collects all bad values into one ConfigError."""
        values, problems = _parse_settings(SETTINGS, os.environ if environ is None else environ)
        if not problems and values["pool_min_size"] > values["pool_max_size"]:
            problems.append("QUEUE_DB_POOL_MIN_SIZE must not exceed QUEUE_DB_POOL_MAX_SIZE")
        for first, second in (("tls_cert_file", "tls_key_file"), ("core_tls_cert_file", "core_tls_key_file")):
            if bool(values.get(first)) != bool(values.get(second)):
                problems.append(f"{SETTINGS[first].env} and {SETTINGS[second].env} must be set together")
        if not problems and values["max_concurrent_calls_per_caller"] > values["max_concurrent_calls"]:
            problems.append("QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER must not exceed QUEUE_MAX_CONCURRENT_CALLS (it is a share of them)")
        if values.get("tls_client_ca_file") and not values.get("tls_cert_file"):
            problems.append("QUEUE_TLS_CLIENT_CA_FILE needs QUEUE_TLS_CERT_FILE and QUEUE_TLS_KEY_FILE (mutual TLS is TLS first)")
        if values.get("user_assertion_key_file") and not values.get("auth_file"):
            problems.append(
                "QUEUE_USER_ASSERTION_KEY_FILE needs QUEUE_AUTH_FILE: assertions bind the `web` role's calls to a user, "
                "and without an auth file no caller has a role"
            )
        for field in (
            "tls_cert_file",
            "tls_key_file",
            "tls_client_ca_file",
            "auth_file",
            "user_assertion_key_file",
            "core_tls_ca_file",
            "core_tls_cert_file",
            "core_tls_key_file",
        ):
            path = values.get(field)
            if path and not os.path.isfile(path):
                problems.append(f"{SETTINGS[field].env}={path!r}: no such file")
        if problems:
            raise ConfigError("invalid configuration: " + "; ".join(problems))
        values.update(overrides)
        return cls(**values)

    def redact_secrets(self, text: str) -> str:
        """`text` without the secrets of this configuration's DSNs (for log lines and tracebacks
        that quote what the driver said about them)."""
        return redact_dsn_in(text, self.database_url, self.listen_database_url)

    @property
    def unary_calls_per_caller(self) -> int:
        """QUEUE_MAX_CONCURRENT_CALLS_PER_CALLER, its `0` read as half of the replica's cap."""
        return self.max_concurrent_calls_per_caller or max(1, self.max_concurrent_calls // 2)

    @property
    def streams_per_caller(self) -> int:
        """QUEUE_MAX_STREAMS_PER_CALLER, its `0` read as half of the replica's streams."""
        return self.max_streams_per_caller or max(1, self.max_streams // 2)

    @property
    def listens_on_loopback(self) -> bool:
        return _is_loopback(self.listen_addr)

    def require_service_targets(self) -> None:
        """`serve` needs a database and a core; `dev` fills both in itself."""
        missing = [s.env for f, s in SETTINGS.items() if f in ("database_url", "core_addr") and not getattr(self, f)]
        if missing:
            raise ConfigError(f"invalid configuration: {', '.join(missing)} must be set for `serve` (or use `queue-service dev`)")
        self.require_safe_listener()

    def require_safe_listener(self) -> None:
        """A listener other machines can reach must authenticate its callers, and bearer tokens
        must not reach it in plaintext."""
        self._require_tls_for_tokens()
        if not self.auth_file and not self.allow_unauthenticated and not self.listens_on_loopback:
            raise ConfigError(
                f"invalid configuration: QUEUE_LISTEN_ADDR={self.listen_addr} is not a loopback address, so callers must be "
                "authenticated: set QUEUE_AUTH_FILE (or QUEUE_ALLOW_UNAUTHENTICATED=true behind a trusted proxy)"
            )
        if self.http_addr and not self.auth_file and not self.allow_unauthenticated and not _is_loopback(self.http_addr):
            raise ConfigError(
                f"invalid configuration: QUEUE_HTTP_ADDR={self.http_addr} is not a loopback address, so callers must be "
                "authenticated: set QUEUE_AUTH_FILE (or QUEUE_ALLOW_UNAUTHENTICATED=true behind a trusted proxy)"
            )

    def _require_tls_for_tokens(self) -> None:
        """With QUEUE_AUTH_FILE, callers send bearer tokens: a non-loopback listener serving
        plaintext would let anyone on the path read them. Either this process serves TLS
        (QUEUE_TLS_CERT_FILE, which covers both listeners) or the operator states that TLS ends
        in front of it (QUEUE_TLS_TERMINATED_UPSTREAM)."""
        if not self.auth_file or self.tls_cert_file or self.tls_terminated_upstream:
            return
        for env, addr in (("QUEUE_LISTEN_ADDR", self.listen_addr), ("QUEUE_HTTP_ADDR", self.http_addr)):
            if addr and not _is_loopback(addr):
                raise ConfigError(
                    f"invalid configuration: {env}={addr} is not a loopback address and serves plaintext, so the bearer "
                    "tokens of QUEUE_AUTH_FILE would cross the network readable: set QUEUE_TLS_CERT_FILE and "
                    "QUEUE_TLS_KEY_FILE, or QUEUE_TLS_TERMINATED_UPSTREAM=true when a mesh or ingress terminates TLS "
                    "in front of this listener"
                )


# Every setting by field name, in the order of the fields (the deploy manifests' and docs' tests read these).
SETTINGS: dict[str, Setting] = _settings_of(Config)
DEV_SETTINGS: dict[str, Setting] = _settings_of(DevConfig)


def _is_loopback(addr: str) -> bool:
    """True for a literal loopback address (127.0.0.0/8, ::1) or `localhost`. Any other name is
    not loopback, whatever it starts with: `127.attacker.example` or `127.0.0.1.nip.io` resolve
    wherever their owner likes."""
    host = addr.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def reference_markdown() -> str:
    """docs/configuration.md: every setting with its meaning and default, written from the fields
    of Config and DevConfig so a meaning is written once (`python -m queue_service.config > docs/configuration.md`;
    tests/repository/test_readme.py fails when the file is stale)."""

    def rows(settings: Mapping[str, Setting]) -> list[str]:
        return [f"| `{s.env}` | {s.meaning} | {f'`{s.default}`' if s.default else '—'} |" for s in settings.values()]

    header = ["| variable | meaning | default |", "| --- | --- | --- |"]
    return "\n".join(
        [
            "# Configuration",
            "",
            "<!-- Generated from queue_service/config.py by `python -m queue_service.config > docs/configuration.md`; edit the tables there. -->",
            "",
            "Environment variables, validated at start: a bad value stops start-up with a message naming",
            "the variable, the value and what is allowed. OpenTelemetry exporters follow the standard",
            "`OTEL_*` variables (OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set).",
            "",
            "## `queue-service serve` (and `dev`)",
            "",
            *header,
            *rows(SETTINGS),
            "",
            "## `queue-service dev` only",
            "",
            *header,
            *rows(DEV_SETTINGS),
            "",
        ]
    )


def settings_of(cls: type[Settings], config: Config, **nested: Any) -> Settings:
    """A room's settings value (a frozen dataclass beside the room): each field read from the
    setting of its name, so a room declares what it reads and nothing copies it by hand; `nested`
    gives the fields that are settings values of their own."""
    return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls) if field.name not in nested}, **nested)


if __name__ == "__main__":
    print(reference_markdown(), end="")
