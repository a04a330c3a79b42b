"""The named queries of `store/sql/queries.sql` as the store runs them: every statement the store
names is a block of queries.sql (a block lost in an edit fails here, not as a KeyError on the first
call that needs it), and an `-- include:` line stands for the named query's text, so a query read
by two statements is written once."""

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


def test_every_include_is_expanded_into_its_query() -> None:
    for name, text in queries().items():
        assert "-- include:" not in text, name


def test_the_admit_reads_the_same_state_with_its_reservation_as_after_it() -> None:
    state = queries()["admit_state"]
    reserve = queries()["reserve_run_and_read_admit_state"]
    assert state.removesuffix(";") in reserve
    assert reserve.count("existing.request_digest") == 1
