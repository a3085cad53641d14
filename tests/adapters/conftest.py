"""Fixtures of the adapter tests."""

import pytest


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.testbed)])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh store on SQLite, then on the test bed's PostgreSQL: every store test runs on both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("postgres_url")
