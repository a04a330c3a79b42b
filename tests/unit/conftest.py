"""The unit layer runs without a database: a unit test that asks for one fails at once instead of
starting PostgreSQL (the fixtures of `tests/conftest.py` are overridden here)."""

from __future__ import annotations

import pytest

_NO_DATABASE = "tests/unit runs without PostgreSQL: move this test to tests/integration"


@pytest.fixture(scope="session")
def postgres() -> None:
    pytest.fail(_NO_DATABASE)


@pytest.fixture(scope="session")
def template_database() -> None:
    pytest.fail(_NO_DATABASE)


@pytest.fixture(scope="module")
def database_url() -> None:
    pytest.fail(_NO_DATABASE)
