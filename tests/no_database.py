"""The fixtures a layer without a database overrides: a test of tests/unit or tests/repository
that asks for PostgreSQL fails at once instead of starting it."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def refusing_database(layer: str) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """`postgres`, `template_database` and `database_url` for `layer`'s conftest: each fails, naming the layer."""
    message = f"tests/{layer} runs without PostgreSQL: move this test to tests/integration"

    @pytest.fixture(scope="session")
    def postgres() -> None:
        pytest.fail(message)

    @pytest.fixture(scope="session")
    def template_database() -> None:
        pytest.fail(message)

    @pytest.fixture(scope="module")
    def database_url() -> None:
        pytest.fail(message)

    return postgres, template_database, database_url
