"""The store of Kueue's admission facts per job (migration 0008), on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from auditor.store.admission_tables import ADMISSIONS
from auditor.store.store import Store
from auditor.store.tables import JOBS
from auditor.store.urls import resolve


def test_admissions_table_matches_migration(store_url: str) -> None:
    Store.open(store_url).close()
    ours = sa.MetaData()
    JOBS.to_metadata(ours)  # the table its foreign key names
    ADMISSIONS.to_metadata(ours)
    engine = sa.create_engine(resolve(store_url))
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={"compare_type": True, "include_object": lambda o, n, t, r, c: t != "table" or n in ours.tables},
            )
            assert compare_metadata(ctx, ours) == []
    finally:
        engine.dispose()
