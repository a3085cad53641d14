"""Kueue's admission facts per job in the store (table ``job_admissions``, migration 0008).

The operator reads each audited job's Workload every cycle (and ``audit`` with the Kubernetes API
once); :meth:`AdmissionStore.record` folds the reading into what was stored
(:func:`auditor.core.admission.merge`: the first admission survives Kueue's re-admissions), so
``explain`` and the weekly report show what Kueue said even after the Workload is gone.
Only :meth:`Store.reading` / :meth:`Store.writing` transactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from auditor.core.admission import AdmissionFacts, merge
from auditor.store.admission_tables import ADMISSIONS
from auditor.store.store import Store
from auditor.store.tables import SUMMARIES

_a = ADMISSIONS.c


def _row(job_id: int, f: AdmissionFacts, now: datetime) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "workload_name": f.workload,
        "workload_uid": f.workload_uid,
        "cluster_queue": f.cluster_queue,
        "local_queue": f.local_queue,
        "created_at": f.created,
        "quota_reserved_at": f.quota_reserved_at,
        "admitted_at": f.admitted_at,
        "queue_wait_s": f.queue_wait_s,
        "last_admitted_at": f.last_admitted_at,
        "last_wait_s": f.last_wait_s,
        "eviction_count": f.eviction_count,
        "evictions": dict(sorted(f.evictions.items())),
        "requeue_count": f.requeues,
        "last_eviction_reason": f.last_eviction_reason,
        "last_evicted_at": f.last_evicted_at,
        "pending": f.pending,
        "updated_at": now,
    }


def _facts(r: Any) -> AdmissionFacts:
    return AdmissionFacts(
        workload=r.workload_name,
        created=r.created_at,
        workload_uid=r.workload_uid,
        local_queue=r.local_queue,
        cluster_queue=r.cluster_queue,
        quota_reserved_at=r.quota_reserved_at,
        admitted_at=r.admitted_at,
        queue_wait_s=r.queue_wait_s,
        last_admitted_at=r.last_admitted_at,
        last_wait_s=r.last_wait_s,
        evictions={str(k): int(v) for k, v in (r.evictions or {}).items()},
        requeues=r.requeue_count,
        last_eviction_reason=r.last_eviction_reason,
        last_evicted_at=r.last_evicted_at,
        pending=bool(r.pending),
    )


class AdmissionStore:
    """Reads and writes ``job_admissions`` through one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def record(self, readings: Iterable[tuple[int, AdmissionFacts]], now: datetime) -> int:
        """Fold each ``(job_id, facts)`` reading into the job's stored facts; returns rows written.

        Unchanged facts are not rewritten (a cycle reads every running job's Workload again).
        """
        readings = list(readings)
        if not readings:
            return 0
        written = 0
        with self.store.writing(f"record Kueue admission facts of {len(readings)} job(s)") as conn:
            ids = [job_id for job_id, _ in readings]
            stored = {r.job_id: _facts(r) for r in conn.execute(sa.select(ADMISSIONS).where(_a.job_id.in_(ids)))}
            for job_id, reading in readings:
                before = stored.get(job_id)
                facts = merge(before, reading)
                if facts == before:
                    continue
                row = _row(job_id, facts, now)
                if before is None:
                    conn.execute(ADMISSIONS.insert(), row)
                else:
                    conn.execute(ADMISSIONS.update().where(_a.job_id == job_id), row)
                stored[job_id] = facts
                written += 1
        return written

    def facts(self, job_id: int) -> AdmissionFacts | None:
        """The stored facts of one job (None: never seen in a Kueue queue)."""
        with self.store.reading(f"read the Kueue admission facts of job {job_id}") as conn:
            r = conn.execute(sa.select(ADMISSIONS).where(_a.job_id == job_id)).first()
        return None if r is None else _facts(r)

    def week_waits(
        self,
        start: datetime,
        end: datetime,
        *,
        cluster: str | None = None,
        teams: Sequence[str] | None = None,
    ) -> dict[str, list[float]]:
        """Per team (the summary's), the queue waits of the jobs first admitted in ``[start, end)``.

        A job counts in the week Kueue first admitted it, with the wait before that admission;
        jobs whose first admission no reading saw (evicted before the first cycle) are left out.
        """
        s = SUMMARIES.c
        q = (
            sa.select(s.team, _a.queue_wait_s)
            .select_from(ADMISSIONS.join(SUMMARIES, SUMMARIES.c.job_id == _a.job_id))
            .where(_a.admitted_at >= start, _a.admitted_at < end, _a.queue_wait_s.is_not(None))
        )
        if cluster is not None:
            q = q.where(s.cluster == cluster)
        if teams is not None:
            q = q.where(s.team.in_(list(teams)))
        out: dict[str, list[float]] = {}
        with self.store.reading("read the week's Kueue queue waits") as conn:
            for team, wait in conn.execute(q.order_by(s.team, _a.queue_wait_s)):
                out.setdefault(team, []).append(float(wait))
        return out
