"""The repository checks read the repository's files and need no database: one that asks for
PostgreSQL fails at once instead of starting it (the fixtures of `tests/conftest.py` are
overridden here, as in tests/unit)."""

from __future__ import annotations

import pytest

_NO_DATABASE = "tests/repository runs without PostgreSQL: move this test to tests/integration"


@pytest.fixture(scope="session")
def postgres() -> None:
    pytest.fail(_NO_DATABASE)


@pytest.fixture(scope="session")
def template_database() -> None:
    pytest.fail(_NO_DATABASE)


@pytest.fixture(scope="module")
def database_url() -> None:
    pytest.fail(_NO_DATABASE)
