"""`queue-service core --help` says what every flag does and its default."""

from __future__ import annotations

import re

import pytest

from queue_service.cli import main


def test_every_flag_of_the_dev_core_has_a_help_text_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["core", "--help"])
    text = capsys.readouterr().out
    options = text.split("options:", 1)[1]
    # Each option's entry: its flag, then its help (on the same line or the next ones).
    entries = re.split(r"\n  (?=-)", "\n" + options.strip("\n"))
    flags = [entry for entry in entries if entry.strip().startswith("--") and not entry.strip().startswith("--help")]
    assert len(flags) >= 10, text
    for entry in flags:
        flag = entry.split()[0]
        words = " ".join(entry.split())
        assert "(default:" in words, f"{flag} shows no default: {words}"
        described = words.split("(default:")[0].split(maxsplit=1)[1:]
        assert described and len(described[0].split()) >= 3, f"{flag} has no help text: {words}"
