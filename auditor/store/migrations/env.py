"""Alembic environment for the gpu-auditor store.

:meth:`auditor.store.Store.open` runs the upgrade itself and hands over an open connection (in
``config.attributes["connection"]``) that already holds the migration lock inside a transaction,
so the schema change and the version stamp commit together. Used from the ``alembic`` command
line instead (``alembic -c <ini with script_location = auditor/store/migrations>``), it connects
to ``sqlalchemy.url`` itself; ``--sql`` prints the DDL for a DBA to apply by hand.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context

from auditor.errors import StoreError
from auditor.store.database import VERSION_TABLE

config = context.config


def _configure(**kwargs: Any) -> None:
    context.configure(
        version_table=VERSION_TABLE,
        render_as_batch=True,  # SQLite can only ALTER through table copies
        compare_type=True,
        **kwargs,
    )


def run_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise StoreError("migrations need a connection or sqlalchemy.url in the alembic config")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        _configure(connection=conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
