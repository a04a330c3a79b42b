"""Every DSN the service prints hides its secrets, also the malformed ones libpq refuses to parse
(whose error messages quote the pieces they stumbled on)."""

from __future__ import annotations

import logging
import sys

import pytest

from queue_service import config, telemetry
from queue_service.config import Config, ConfigError, redact_dsn

# (DSN, pieces of a secret that must never be printed)
SHAPES = [
    pytest.param("host=db user=queue password=hunter2 dbname=queue", ["hunter2"], id="keywords"),
    pytest.param("postgresql://queue:hunter2@db:5432/queue", ["hunter2"], id="uri"),
    pytest.param("host=db user=queue password=hunter two dbname=queue", ["hunter", "two"], id="unquoted-space"),
    pytest.param("host=db user=queue pasword=hunter2 dbname=queue", ["hunter2"], id="misspelt-keyword"),
    pytest.param("postgresql://queue:hunt%zzer2@db/queue", ["hunt", "zzer2"], id="bad-percent-escape"),
    pytest.param("postgresql://queue:hunter@two@db/queue", ["hunter", "two"], id="at-in-password"),
    pytest.param("postgresql://queue@db/queue?password=hunter2&sslmode=require", ["hunter2"], id="password-in-query"),
    pytest.param("host=db password='hunter two' port=abc", ["hunter", "two"], id="quoted-with-a-bad-port"),
]


@pytest.mark.parametrize(("dsn", "secrets"), SHAPES)
def test_a_redacted_dsn_holds_no_piece_of_a_secret(dsn: str, secrets: list[str]) -> None:
    redacted = redact_dsn(dsn)
    assert "***" in redacted
    assert not [secret for secret in secrets if secret in redacted], redacted


@pytest.mark.parametrize(("dsn", "secrets"), SHAPES)
def test_a_configuration_error_holds_no_piece_of_a_secret(dsn: str, secrets: list[str]) -> None:
    try:
        Config.from_env({"DATABASE_URL": dsn, "QUEUE_LISTEN_DATABASE_URL": dsn, "QUEUE_MAX_STREAMS": "x"})
    except ConfigError as error:
        message = str(error)
    else:
        raise AssertionError("QUEUE_MAX_STREAMS=x was accepted")
    assert not [secret for secret in secrets if secret in message], message


def test_the_redacted_dsn_keeps_where_and_as_whom_it_connects() -> None:
    assert (
        redact_dsn("host=db port=5433 user=queue password=x dbname=q sslmode=require")
        == "host=db port=5433 user=queue password=*** dbname=q sslmode=require"
    )
    assert redact_dsn("postgresql://queue:x@db:5433/q?sslmode=require") == "postgresql://queue:***@db:5433/q?sslmode=require"
    assert redact_dsn("postgresql://db/q") == "postgresql://db/q"


def test_secrets_quoted_in_a_driver_message_are_hidden() -> None:
    dsn = "postgresql://queue:hunter@two@db/queue"
    message = f'could not translate host name "two@db" to address; connecting to {dsn}'
    assert (
        config.redact_dsn_in(message, dsn)
        == 'could not translate host name "***@db" to address; connecting to postgresql://queue:***@db/queue'
    )


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_log_line_hides_the_secrets_of_either_dsn_in_its_message_and_its_exception(log_format: str) -> None:
    settings = Config.from_env(
        {"DATABASE_URL": "postgresql://queue:good@db/queue", "QUEUE_LISTEN_DATABASE_URL": "postgresql://queue:Part1@Part2only@db/queue"}
    )
    formatter = (
        telemetry.JsonFormatter(settings.redact_secrets) if log_format == "json" else telemetry.TextFormatter(settings.redact_secrets)
    )
    try:
        raise OSError("failed to resolve host 'Part2only@db'")
    except OSError:
        record = logging.LogRecord(
            "feed", logging.WARNING, __file__, 1, "lost (%s)", ("failed to resolve host 'Part2only@db'",), sys.exc_info()
        )
    line = formatter.format(record)
    assert "***@db" in line and "Traceback" in line
    assert "Part2only" not in line and "Part1" not in line, line
