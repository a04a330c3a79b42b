"""The named queries of `store/sql/queries.sql` as the store runs them: an `-- include:` line
stands for the named query's text, so a query read by two statements is written once."""

from __future__ import annotations

from queue_service.store.store import queries


def test_every_include_is_expanded_into_its_query() -> None:
    for name, text in queries().items():
        assert "-- include:" not in text, name


def test_the_admit_reads_the_same_state_with_its_reservation_as_after_it() -> None:
    state = queries()["admit_state"]
    reserve = queries()["reserve_run_and_read_admit_state"]
    assert state.removesuffix(";") in reserve
    assert reserve.count("existing.request_digest") == 1
