"""Audit runs (table ``audit_runs``): one row per audit or operator cycle; the operator's
cycle cursor is the last run it recorded."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from auditor.core.model import Window
from auditor.store.database import Database
from auditor.store.tables import AUDIT_RUNS
from auditor.store.values import Invalid, aware, plain_json


class AuditRuns:
    """The audit runs of one :class:`~auditor.store.database.Database`."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def record_run(
        self,
        window: Window,
        started: datetime,
        finished: datetime,
        *,
        jobs: int,
        queries: int,
        status: str,
        detail: dict,
    ) -> int:
        """Record one audit (its window, timing, counts and outcome); returns the run id."""
        with self._db.checking("record audit run"):
            try:
                values = {
                    "window_start": window.start,
                    "window_end": window.end,
                    "started": aware(started, "started"),
                    "finished": aware(finished, "finished"),
                    "jobs": int(jobs),
                    "queries": int(queries),
                    "status": str(status),
                    "detail": plain_json(detail, "detail", default=str),
                }
            except (TypeError, ValueError, AttributeError) as exc:
                raise Invalid(str(exc)) from None
        stmt = sa.insert(AUDIT_RUNS).values(values).returning(AUDIT_RUNS.c.id)
        with self._db.writing("record audit run") as conn:
            run_id = conn.execute(stmt).scalar_one()
            return int(run_id)

    def runs(self, *, limit: int = 100) -> list[dict]:
        """The latest audit runs, newest first: ``id, window_start, window_end, started,
        finished, jobs, queries, status, detail``."""
        r = AUDIT_RUNS.c
        q = sa.select(AUDIT_RUNS).order_by(r.id.desc()).limit(max(1, int(limit)))
        with self._db.reading("read audit runs") as conn:
            return [dict(row) for row in conn.execute(q).mappings()]
