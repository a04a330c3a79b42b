"""The unit layer runs without a database: a unit test that asks for one fails at once instead of
starting PostgreSQL (the fixtures of `tests/conftest.py` are overridden here)."""

from __future__ import annotations

from tests.no_database import refusing_database

postgres, template_database, database_url = refusing_database("unit")
