"""The ``jobs`` table: one row per top-level job, unique per cluster/namespace/kind/name.

A job's row is its identity in the store: buckets, aggregates and summaries hang off its id.
Its span (``first_seen``/``last_seen``) only ever widens, and its end (``ended_at``) is the
operator's record of when it finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from auditor.core.model import JobRef
from auditor.errors import BadInput
from auditor.store.database import Database
from auditor.store.driver import DriverStatement
from auditor.store.spans import earlier, later
from auditor.store.tables import BUCKETS, JOBS
from auditor.store.values import Invalid, aware


class JobRecords:
    """The jobs of one :class:`~auditor.store.database.Database`."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._upsert_job_stmt = self._make_upsert_job()

    def _make_upsert_job(self) -> sa.Executable:
        """``INSERT .. ON CONFLICT DO UPDATE .. RETURNING id``, built once (building is the slow part)."""
        stmt = self._db.insert(JOBS).values(
            {
                c: sa.bindparam(c)
                for c in ("cluster", "namespace", "kind", "name", "uid", "team", "queue", "first_seen", "last_seen")
            }
        )
        ex, j = stmt.excluded, JOBS.c
        upsert = stmt.on_conflict_do_update(
            index_elements=["cluster", "namespace", "kind", "name"],
            set_={
                "first_seen": earlier(ex.first_seen, j.first_seen),
                "last_seen": later(ex.last_seen, j.last_seen),
                "uid": sa.func.coalesce(ex.uid, j.uid),
                "team": sa.case((ex.team != "", ex.team), else_=j.team),
                "queue": sa.func.coalesce(ex.queue, j.queue),
            },
        )
        # executemany: the ids are read after
        self._upsert_jobs = DriverStatement(self._db, upsert, times=("first_seen", "last_seen"))
        return upsert.returning(j.id)

    def upsert_jobs(self, items: Sequence[tuple[JobRef, datetime, datetime]]) -> list[int]:
        """:meth:`upsert_job` of several jobs in one transaction (one executemany, then their ids
        in one read per 500); the ids in ``items``' order."""
        if not items:
            return []
        params = []
        for job, first_seen, last_seen in items:
            params.append(self._job_params(job, first_seen, last_seen))
        j = JOBS.c
        found: dict[tuple[str, str, str, str], int] = {}
        with self._db.writing(f"save {len(items)} jobs") as conn:
            self._upsert_jobs.executemany(conn, params)
            for i in range(0, len(params), 500):
                part = params[i : i + 500]
                q = sa.select(j.id, j.cluster, j.namespace, j.kind, j.name).where(
                    j.cluster.in_(sorted({p["cluster"] for p in part})),
                    j.namespace.in_(sorted({p["namespace"] for p in part})),
                    j.name.in_(sorted({p["name"] for p in part})),
                )
                for job_id, *key in conn.execute(q):
                    found[tuple(key)] = int(job_id)
        return [found[(p["cluster"], p["namespace"], p["kind"], p["name"])] for p in params]

    def _job_params(self, job: JobRef, first_seen: datetime, last_seen: datetime) -> dict[str, Any]:
        with self._db.checking(f"save job {job.key}"):
            aware(first_seen, "first_seen")
            aware(last_seen, "last_seen")
        return {
            "cluster": job.cluster,
            "namespace": job.namespace,
            "kind": job.kind,
            "name": job.name,
            "uid": job.uid,
            "team": job.team or "",
            "queue": job.queue,
            "first_seen": min(first_seen, last_seen),
            "last_seen": max(first_seen, last_seen),
        }

    def upsert_job(self, job: JobRef, first_seen: datetime, last_seen: datetime) -> int:
        """Insert the job or update it, and return its id.

        ``first_seen``/``last_seen`` only ever widen the stored span (an audit of an older window
        must not make a job look younger). ``uid``, ``team`` and ``queue`` take the new values when
        they are known (a recreated job gets a new uid; a relabelled one a new team).
        """
        params = self._job_params(job, first_seen, last_seen)
        with self._db.writing(f"save job {job.key}") as conn:
            job_id = conn.execute(self._upsert_job_stmt, params).scalar_one()
            return int(job_id)

    def find_job(self, namespace: str, kind: str, name: str, cluster: str | None = None) -> tuple[int, JobRef] | None:
        """Look a job up by ``namespace/Kind/name`` (kind case-insensitive, as users type it).

        Without ``cluster`` and with the same job in several clusters sharing this store, the
        answer would be a guess: that is :class:`BadInput` naming the clusters.
        """
        q = sa.select(JOBS).where(
            JOBS.c.namespace == namespace,
            JOBS.c.name == name,
            sa.func.lower(JOBS.c.kind) == kind.lower(),
        )
        if cluster is not None:
            q = q.where(JOBS.c.cluster == cluster)
        with self._db.reading(f"find job {namespace}/{kind}/{name}") as conn:
            rows = conn.execute(q.order_by(JOBS.c.cluster, JOBS.c.id)).mappings().all()
        if not rows:
            return None
        exact = [r for r in rows if r["kind"] == kind]
        rows = exact or rows
        if len({r["cluster"] for r in rows}) > 1:
            clusters = ", ".join(sorted({r["cluster"] for r in rows}))
            raise BadInput(f"job {namespace}/{kind}/{name} exists in several clusters ({clusters}): name the cluster")
        r = rows[0]
        return int(r["id"]), job_ref(r)

    def job_count(self, cluster: str | None = None) -> int:
        """How many jobs the store holds (in ``cluster`` when given): 0 tells a command that it
        reads the wrong store (or one no audit has written yet), not that nothing ran."""
        q = sa.select(sa.func.count()).select_from(JOBS)
        if cluster is not None:
            q = q.where(JOBS.c.cluster == cluster)
        with self._db.reading("count jobs") as conn:
            return int(conn.execute(q).scalar_one())

    def jobs_of_pod(self, namespace: str, pod: str, cluster: str | None = None) -> list[tuple[int, JobRef]]:
        """The jobs whose stored buckets come from pod ``namespace/pod`` (a pod name reused by
        later jobs gives several), newest first.

        Only the jobs of that namespace are searched, each through the bucket key's ``job_id``
        prefix (stopping at its first bucket of the pod): the rollup of other namespaces is never read.
        """
        b, j = BUCKETS.c, JOBS.c
        has_pod = sa.exists().where(b.job_id == j.id, b.pod_namespace == namespace, b.pod_name == pod)
        q = sa.select(JOBS).where(j.namespace == namespace, has_pod)
        if cluster is not None:
            q = q.where(j.cluster == cluster)
        with self._db.reading(f"find the jobs of pod {namespace}/{pod}") as conn:
            rows = conn.execute(q.order_by(j.last_seen.desc(), j.id.desc())).mappings().all()
        return [(int(r["id"]), job_ref(r)) for r in rows]

    def job(self, job_id: int) -> JobRef | None:
        """The job stored under ``job_id``, or None."""
        with self._db.reading(f"read job {job_id}") as conn:
            row = conn.execute(sa.select(JOBS).where(JOBS.c.id == job_id)).mappings().first()
        return None if row is None else job_ref(row)

    def open_jobs(self, cluster: str) -> list[tuple[int, JobRef, datetime, datetime]]:
        """Jobs of ``cluster`` without an end: ``(id, job, first_seen, last_seen)``."""
        j = JOBS.c
        q = sa.select(JOBS).where(j.cluster == cluster, j.ended_at.is_(None)).order_by(j.id)
        with self._db.reading(f"read open jobs of cluster {cluster}") as conn:
            return [
                (int(row["id"]), job_ref(row), row["first_seen"], row["last_seen"])
                for row in conn.execute(q).mappings()
            ]

    def set_job_ended(self, job_id: int, ended_at: datetime | None) -> None:
        """Record when a job ended (None: it runs again, e.g. new pods under the same name)."""
        with self._db.checking(f"mark job {job_id} ended"):
            if ended_at is not None:
                aware(ended_at, "ended_at")
        stmt = sa.update(JOBS).where(JOBS.c.id == job_id).values(ended_at=ended_at)
        with self._db.writing(f"mark job {job_id} ended") as conn:
            if conn.execute(stmt).rowcount == 0:
                raise Invalid(f"no job with id {job_id}")


def job_ref(r: Any) -> JobRef:
    return JobRef(
        cluster=r["cluster"],
        namespace=r["namespace"],
        kind=r["kind"],
        name=r["name"],
        uid=r["uid"],
        team=r["team"],
        queue=r["queue"],
    )
