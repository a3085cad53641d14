"""The latest audit-JSON object per job (table ``job_summaries``) and its indexed columns."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from auditor.core.model import JobRef
from auditor.store.database import Database
from auditor.store.driver import DriverStatement
from auditor.store.jobs import job_ref
from auditor.store.lineage_tables import record_summaries
from auditor.store.summaries import SUMMARY_FIELDS, summary_columns
from auditor.store.tables import JOBS, SUMMARIES
from auditor.store.values import Invalid, aware, number, parse_time, plain_json_text

#: the columns :meth:`SummaryRecords.save_summary` writes (besides ``job_id``)
_WRITTEN = (
    "verdict",
    "start",
    "end",
    "gpu_hours",
    "waste_gpu_hours",
    "computed_at",
    "data",
    *SUMMARY_FIELDS,
    "cluster",
    "namespace",
    "team",
)


def _summary_values(summary: dict) -> tuple[dict[str, Any], str]:
    """The checked column values of one summary (without the job row's) and its JSON text;
    :class:`Invalid` names what is refused."""
    if not isinstance(summary, dict):
        raise Invalid(f"summary must be a dict, got {type(summary).__name__}")
    doc, text = plain_json_text(summary, "summary")
    verdict = summary.get("verdict")
    if not isinstance(verdict, str) or not verdict:
        raise Invalid("summary has no verdict")
    values = {
        "verdict": verdict,
        "start": parse_time(summary.get("start"), "start"),
        "end": parse_time(summary.get("end"), "end"),
        "gpu_hours": number(summary.get("gpu_hours"), "gpu_hours"),
        "waste_gpu_hours": number(summary.get("waste_gpu_hours"), "waste_gpu_hours"),
        "computed_at": parse_time(summary.get("computed_at"), "computed_at") or datetime.now(timezone.utc),
        **summary_columns(doc),
    }
    return values, text


class SummaryRecords:
    """The job summaries of one :class:`~auditor.store.database.Database`."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # Built once: an operator cycle saves a summary per job (thousands), and building the
        # statement each time cost more than executing it.
        self._jobs_stmt = sa.select(JOBS).where(JOBS.c.id.in_(sa.bindparam("ids", expanding=True)))
        # The document goes in as the JSON text orjson writes (it is plain JSON by then): the
        # column type's own serializer (the standard library's) cost ~1 ms per summary.
        data = sa.bindparam("data_json", type_=sa.Text)
        upsert = db.insert(SUMMARIES).values(data=data if db.is_sqlite else sa.cast(data, JSONB))
        self._upsert = DriverStatement(
            db,
            upsert.on_conflict_do_update(index_elements=["job_id"], set_={k: upsert.excluded[k] for k in _WRITTEN}),
            times=("start", "end", "computed_at"),
            columns=("job_id", *(k for k in _WRITTEN if k != "data"), "data_json"),
        )

    def save_summary(self, job_id: int, summary: dict) -> None:
        """Store the audit-JSON object of one job, replacing the previous one.

        The indexed columns are taken from the object (``team``, ``verdict``, ``start``, ``end``,
        ``gpu_hours``, ``waste_gpu_hours``, optional ``computed_at``, and the report's fields of
        :func:`summary_columns`); cluster and namespace come from the job row, the identity the
        summary belongs to.
        """
        self.save_summaries([(job_id, summary)])

    def save_summaries(self, items: Sequence[tuple[int, dict]]) -> None:
        """:meth:`save_summary` of several jobs in one transaction, with one statement per table
        (an operator cycle saves a summary per job: thousands). A job given twice keeps the last;
        nothing is written if any summary is refused."""
        last: dict[int, dict] = {}
        for job_id, summary in items:
            last.pop(job_id, None)
            last[job_id] = summary
        if not last:
            return
        prepared: list[tuple[int, dict, dict[str, Any], str]] = []
        for job_id, summary in last.items():
            with self._db.checking(f"save summary of job {job_id}"):
                prepared.append((job_id, summary, *_summary_values(summary)))
        ids = list(last)
        where = f"save summary of job {ids[0]}" if len(ids) == 1 else f"save the summaries of {len(ids)} jobs"
        with self._db.writing(where) as conn:
            jobs: dict[int, Any] = {}
            for i in range(0, len(ids), 500):
                for row in conn.execute(self._jobs_stmt, {"ids": ids[i : i + 500]}).mappings():
                    jobs[int(row["id"])] = row
            params: list[dict[str, Any]] = []
            runs: list[tuple[JobRef, dict, datetime]] = []
            for job_id, summary, values, text in prepared:
                job = jobs.get(job_id)
                if job is None:
                    raise Invalid(f"no job with id {job_id}")
                values.update(
                    job_id=job_id,
                    cluster=job["cluster"],
                    namespace=job["namespace"],
                    team=summary.get("team") or job["team"] or "",
                    data_json=text,
                )
                params.append(values)
                runs.append((job_ref(job), summary, values["computed_at"]))
            self._upsert.executemany(conn, params)
            # the jobs' runs of their lineages, in the same transaction: the efficiency gate reads them
            record_summaries(conn, runs)

    def summaries(
        self,
        *,
        cluster: str | None = None,
        namespace: str | None = None,
        team: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[dict]:
        """Stored summaries, most wasteful first (unknown waste last).

        ``since``/``until`` select jobs whose observed span ``[start, end)`` overlaps
        ``[since, until)``; summaries without a span only appear when neither is given.
        """
        s = SUMMARIES.c
        q = sa.select(s.data)
        if cluster is not None:
            q = q.where(s.cluster == cluster)
        if namespace is not None:
            q = q.where(s.namespace == namespace)
        if team is not None:
            q = q.where(s.team == team)
        with self._db.checking("read summaries"):
            if since is not None:
                q = q.where(s.end > aware(since, "since"))
            if until is not None:
                q = q.where(s.start < aware(until, "until"))
        q = q.order_by(
            sa.case((s.waste_gpu_hours.is_(None), 1), else_=0),
            s.waste_gpu_hours.desc(),
            sa.case((s.gpu_hours.is_(None), 1), else_=0),
            s.gpu_hours.desc(),
            s.job_id,
        )
        with self._db.reading("read summaries") as conn:
            return [dict(d) for d in conn.execute(q).scalars()]

    def delete_summary(self, job_id: int) -> bool:
        """Drop the job's summary (its GPU time went to another job); True if there was one."""
        with self._db.writing(f"delete summary of job {job_id}") as conn:
            return bool(conn.execute(sa.delete(SUMMARIES).where(SUMMARIES.c.job_id == job_id)).rowcount)

    def summary(self, job_id: int) -> dict | None:
        """The stored summary of one job (for ``explain``), or None."""
        q = sa.select(SUMMARIES.c.data).where(SUMMARIES.c.job_id == job_id)
        with self._db.reading(f"read summary of job {job_id}") as conn:
            doc = conn.execute(q).scalar_one_or_none()
        return None if doc is None else dict(doc)
