"""Every statement the store runs by name is a named block of queries.sql: a block lost in an edit
fails here, not as a KeyError at run time on the first call that needs it."""

from __future__ import annotations

import re
from pathlib import Path

from queue_service.store.store import queries

STORE = Path(__file__).resolve().parents[2] / "queue_service" / "store"
# `self._all("name", ...)`, `_one`, `_send`, `_views`, `_locked(user, "name", ...)`, `_statement("name")`.
_NAMED = re.compile(r"""(?:_all|_one|_send|_views|_statement|_locked)\(\s*(?:[\w.]+,\s*)?"([a-z_]+)\"""")


def test_every_statement_the_store_names_is_in_queries_sql() -> None:
    named = {name for path in STORE.glob("*.py") for name in _NAMED.findall(path.read_text())}
    assert len(named) > 40, f"the scan found only {sorted(named)}: it is broken"
    assert sorted(named - set(queries())) == []
