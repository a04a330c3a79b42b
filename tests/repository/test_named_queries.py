"""The named queries of `store/sql/queries/` as the store runs them: every statement the store
names is a block of one of the folder's files (a block lost in an edit fails here, not as a KeyError
on the first call that needs it), a name is unique across the folder, every file says what it
holds, and an `-- include:` line stands for the named query's text, whichever file holds it, so a
query read by two statements is written once."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from queue_service.store.queries import queries, query_files, query_names

STORE = Path(__file__).resolve().parents[2] / "queue_service" / "store"
QUERIES_FOLDER = STORE / "sql" / "queries"
# `self._all("name", ...)`, `_one`, `_send`, `_views`, `_locked(user, "name", ...)`, `statement("name")`, and the
# claim kinds' table of retry statements, `_RetrySchedule("name", ...)`.
_NAMED = re.compile(r"""(?:_all|_one|_send|_views|statement|_locked|_RetrySchedule)\(\s*(?:[\w.]+,\s*)?"([a-z_]+)\"""")


def test_every_statement_the_store_names_is_in_the_queries_folder() -> None:
    named = {name for path in STORE.rglob("*.py") for name in _NAMED.findall(path.read_text())}
    assert len(named) > 40, f"the scan found only {sorted(named)}: it is broken"
    assert {"schedule_release_retry", "schedule_run_settle_retry", "schedule_run_reservation_retry"} <= named, "the scan misses the table"
    assert sorted(named - set(queries())) == []


def test_a_query_name_is_unique_across_the_folder() -> None:
    counts = Counter(name for text in query_files().values() for name in query_names(text))
    assert [name for name, count in counts.items() if count > 1] == []
    assert len(counts) == len(queries())


def test_every_file_of_the_folder_says_what_it_holds_and_holds_queries() -> None:
    files = query_files()
    assert set(files) == {path.name for path in QUERIES_FOLDER.glob("*.sql")}
    assert len(files) > 5, f"only {sorted(files)}: the loader does not read the folder"
    for file_name, text in files.items():
        assert query_names(text), f"{file_name} holds no named query"
        header = text[: text.index("-- name: ")].strip()
        assert header.startswith("-- ") and len(header) > 20, f"{file_name} does not start with what it holds"


def test_the_folder_readme_names_every_file() -> None:
    readme = (QUERIES_FOLDER / "README.md").read_text()
    assert [name for name in query_files() if f"`{name}`" not in readme] == []


def test_every_include_is_expanded_into_its_query() -> None:
    for name, text in queries().items():
        assert "-- include:" not in text, name


def test_the_admit_reads_the_same_state_with_its_reservation_as_after_it() -> None:
    """Both read it through one function (functions/queue_admit_state.sql), with the same arguments."""
    state = queries()["admit_state"]
    reserve = queries()["reserve_run_and_read_admit_state"]
    call = re.search(r"FROM (queue_admit_state\(.*\)) AS state", state)
    assert call is not None, state
    assert reserve.count(call.group(1)) == 1, reserve
    assert "existing.request_digest" not in reserve
