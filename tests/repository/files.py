"""What the repository checks share: the repository's root, the pattern of a path on a
developer's machine (which no tracked file may hold), and the pins of a hash-locked file."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
MACHINE_PATH = re.compile(r"(?<![\w.])(/work/|/home/|/root/|/Users/|\.\./shared\b|\.\./reference\b)")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


@cache
def locked(name: str) -> dict[str, tuple[str, int]]:
    """package -> (version, number of hashes) of a lock file."""
    pins: dict[str, tuple[str, int]] = {}
    current = ""
    for line in (ROOT / name).read_text().splitlines():
        pin = _PIN.match(line)
        if pin:
            current = canonicalize_name(pin.group(1))
            assert current not in pins, f"{name}: {current} pinned twice"
            pins[current] = (pin.group(2), 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            version, hashes = pins[current]
            pins[current] = (version, hashes + 1)
    return pins
