"""Folded statistics per job (table ``job_aggregates``): derived from the buckets, so that a
cycle folds only its new buckets instead of re-reading a long job's whole history."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

import orjson
import sqlalchemy as sa

from auditor.core.accumulate import JobAggregate
from auditor.store.database import Database
from auditor.store.driver import DriverStatement
from auditor.store.tables import AGGREGATES, JOBS
from auditor.store.values import Invalid, aware

log = logging.getLogger("auditor.store.store")


class Aggregates:
    """The job aggregates of one :class:`~auditor.store.database.Database`."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # built once: a cycle reads and saves the aggregate of every job (thousands)
        self._read_stmt = sa.select(AGGREGATES.c.state).where(AGGREGATES.c.job_id == sa.bindparam("job_id"))
        upsert = db.insert(AGGREGATES)
        self._upsert = DriverStatement(
            db,
            upsert.on_conflict_do_update(
                index_elements=["job_id"], set_={k: upsert.excluded[k] for k in ("through", "updated", "state")}
            ),
            times=("through", "updated"),
        )

    def aggregate(self, job_id: int) -> JobAggregate | None:
        """The job's folded statistics (None when there are none, or they cannot be read: they
        are derived from the buckets, and the caller rebuilds them from there)."""
        with self._db.reading(f"read the aggregate of job {job_id}") as conn:
            state = conn.execute(self._read_stmt, {"job_id": job_id}).scalar_one_or_none()
        if state is None:
            return None
        try:
            return JobAggregate.from_json(orjson.loads(state))
        except (ValueError, orjson.JSONDecodeError) as exc:
            log.warning(
                "store %s: the aggregate of job %d is unreadable (%s); it will be rebuilt",
                self._db.display_url,
                job_id,
                exc,
            )
            return None

    def save_aggregate(self, job_id: int, agg: JobAggregate, now: datetime) -> None:
        """Store the job's folded statistics, replacing the previous ones."""
        self.save_aggregates([(job_id, agg)], now)

    def save_aggregates(self, items: Sequence[tuple[int, JobAggregate]], now: datetime) -> None:
        """:meth:`save_aggregate` of several jobs in one statement (a job given twice keeps the
        last); nothing is written if any is refused."""
        values: dict[int, dict] = {}
        for job_id, agg in items:
            with self._db.checking(f"save the aggregate of job {job_id}"):
                if agg.through is None:
                    raise Invalid("an aggregate without 'through' cannot be stored")
                values.pop(job_id, None)
                values[job_id] = {
                    "job_id": job_id,
                    "through": agg.through,
                    "updated": aware(now, "now"),
                    "state": orjson.dumps(agg.to_json()),
                }
        if not values:
            return
        ids = list(values)
        where = f"save the aggregate of job {ids[0]}" if len(ids) == 1 else f"save the aggregates of {len(ids)} jobs"
        with self._db.writing(where) as conn:
            self._upsert.executemany(conn, values.values())

    def advance_aggregates(self, items: Sequence[tuple[int, datetime]], now: datetime) -> int:
        """Move the stored ``through`` of jobs whose state is written later (the operator keeps
        the newer state in memory: :class:`auditor.operator_loop.cycle._KeptAggregates`), and
        stamp them ``now``; the state itself, with its own ``through``, stays as it was.

        The column then says which buckets a newer state holds, so a rewrite of any of them
        still deletes the row (:class:`~auditor.store.buckets.Buckets`' stale-aggregate rule) and
        the keeper sees its stamp gone; a reader of the state folds the buckets after the state's
        own ``through``, which the store holds. Returns the rows moved (a deleted row is not)."""
        if not items:
            return 0
        a = AGGREGATES.c
        stmt = (
            sa.update(AGGREGATES)
            .where(a.job_id == sa.bindparam("b_job_id"))
            .values(through=sa.bindparam("b_through"), updated=sa.bindparam("b_updated"))
        )
        where = f"advance the aggregates of {len(items)} job(s)"
        with self._db.checking(where):
            stamp = aware(now, "now")
            rows = [{"b_job_id": job_id, "b_through": aware(t, "through"), "b_updated": stamp} for job_id, t in items]
        with self._db.writing(where) as conn:
            return int(conn.execute(stmt, rows).rowcount or 0)

    def stamps(self, cluster: str) -> dict[int, tuple[datetime, datetime]]:
        """``(through, updated)`` of every stored aggregate of ``cluster``'s jobs: what tells a
        copy kept in memory (the operator's, between cycles) from the stored one, whoever wrote
        or deleted it since."""
        a = AGGREGATES.c
        q = sa.select(a.job_id, a.through, a.updated).join(JOBS, JOBS.c.id == a.job_id).where(JOBS.c.cluster == cluster)
        with self._db.reading(f"read the aggregates' stamps of cluster {cluster}") as conn:
            return {int(job_id): (through, updated) for job_id, through, updated in conn.execute(q)}
