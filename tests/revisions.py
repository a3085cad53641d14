"""A store at an older schema revision, with rows in it: what an upgrade test starts from."""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from auditor.store.store import MIGRATIONS_DIR
from auditor.store.urls import resolve


def store_at(url: str, revision: str, rows: dict[sa.Table, list[dict]]) -> None:
    """Migrate the empty database at ``url`` to ``revision`` and insert ``rows`` (table → rows)."""
    engine = sa.create_engine(resolve(url))
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            for table, values in rows.items():
                conn.execute(table.insert(), values)
    finally:
        engine.dispose()


def assert_tables_match_migrations(url: str, tables: Sequence[sa.Table]) -> None:
    """The migrated schema at ``url`` holds ``tables`` exactly as declared (columns, types,
    indexes, constraints); only these tables are compared."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    ours = sa.MetaData()
    for t in tables:
        t.to_metadata(ours)
    engine = sa.create_engine(resolve(url))
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={"compare_type": True, "include_object": lambda o, n, t, r, c: t != "table" or n in ours.tables},
            )
            assert compare_metadata(ctx, ours) == []
    finally:
        engine.dispose()
