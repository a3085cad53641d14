"""Statements of many rows handed to the database driver directly.

An operator cycle writes thousands of rows per table (pod owners, jobs, aggregates, summaries);
SQLAlchemy's executemany processes every parameter of every row in Python (its bind processors,
one dict per row), which measured several times the database's own work. A
:class:`DriverStatement` is compiled once; its rows' times go through the column type's own
conversion (:class:`~auditor.store.tables.UTCDateTime`) once per distinct value, and the rest
go to the driver as they are: the stored values are the same as through SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from operator import itemgetter
from typing import Any, Callable

from sqlalchemy.engine import Connection
from sqlalchemy.sql.compiler import SQLCompiler

from auditor.store.database import Database
from auditor.store.tables import UTCDateTime


class DriverStatement:
    """One executemany statement (an ``INSERT .. ON CONFLICT``), compiled for the driver.

    ``times`` names the parameters that are :class:`UTCDateTime` values; every other parameter
    must be what the driver takes as is (strings, numbers, None, bytes, JSON text), and so must
    the literals of the statement's own SQL. ``columns``:
    the parameters each row gives, where the statement does not name all of its own.
    """

    def __init__(
        self, db: Database, stmt: Any, *, times: Iterable[str] = (), columns: Iterable[str] | None = None
    ) -> None:
        dialect = db.engine.dialect
        keys = {} if columns is None else {"column_keys": list(columns)}
        compiled: SQLCompiler = stmt.compile(dialect=dialect, for_executemany=True, **keys)
        self.sql = str(compiled)
        names = tuple(compiled.positiontup or ()) if compiled.positional else None
        #: a row's parameters in the SQL's order (qmark: SQLite), or None: by name (PostgreSQL)
        self._order: Callable[[Mapping[str, Any]], Any] | None = None
        if names is not None and len(names) == 1:  # itemgetter of one name gives no tuple
            self._order = lambda p, _n=names[0]: (p[_n],)
        elif names:
            self._order = itemgetter(*names)
        # values the statement holds itself (a literal in its SQL: ``team != ''``), for every row
        self._consts = {
            name: bp.value for bp, name in compiled.bind_names.items() if not bp.required and bp.callable is None
        }
        self._times = tuple(times)
        self._to_db = UTCDateTime().dialect_impl(dialect).bind_processor(dialect) or (lambda v: v)

    def executemany(self, conn: Connection, params: Iterable[Mapping[str, Any]]) -> None:
        """Execute the statement for each row of ``params`` (nothing for none)."""
        rows = self.rows(params)
        if rows:
            conn.exec_driver_sql(self.sql, rows)

    def rows(self, params: Iterable[Mapping[str, Any]]) -> list[Any]:
        """The driver's parameters of each row: tuples in the SQL's order, or dicts."""
        converted: dict[datetime, Any] = {}
        to_db, times, order, consts = self._to_db, self._times, self._order, self._consts
        out: list[Any] = []
        for p in params:
            if times or consts:
                p = {**consts, **p}
                for name in times:
                    value = p[name]
                    if value is not None:
                        db_value = converted.get(value)
                        if db_value is None:
                            db_value = converted[value] = to_db(value)
                        p[name] = db_value
            out.append(order(p) if order is not None else p)
        return out
