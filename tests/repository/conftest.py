"""The repository checks read the repository's files and need no database: one that asks for
PostgreSQL fails at once instead of starting it (the fixtures of `tests/conftest.py` are
overridden here, as in tests/unit)."""

from __future__ import annotations

from tests.no_database import refusing_database

postgres, template_database, database_url = refusing_database("repository")
