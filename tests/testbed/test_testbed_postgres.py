"""The test bed's PostgreSQL: a fresh database per test, a real table round trip."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.testbed


def test_url_is_libpq_and_database_is_empty(postgres_url):
    assert postgres_url.startswith("postgresql://")
    with psycopg.connect(postgres_url) as conn:
        n = conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").fetchone()
    assert n == (0,)


def test_table_round_trip(postgres_url):
    with psycopg.connect(postgres_url) as conn:
        conn.execute("CREATE TABLE jobs (id serial PRIMARY KEY, name text NOT NULL, sm_active double precision)")
        conn.execute("INSERT INTO jobs (name, sm_active) VALUES (%s, %s), (%s, %s)", ("a", 0.25, "b", None))
        conn.commit()
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT name, sm_active FROM jobs ORDER BY id").fetchall()
    assert rows == [("a", 0.25), ("b", None)]


def test_shared_database_url_answers(testbed):
    with psycopg.connect(testbed.database_url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("testbed",)
