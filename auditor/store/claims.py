"""GPU claims (table ``gpu_pod_owners``): which jobs hold a pod's GPU time, settled on write.

GPU time is owned once: when a job's bucket write finds another job of the same cluster holding
the same pod's GPU time (the pod was audited under another identity), one job keeps it and the
other's buckets there are deleted (see :meth:`auditor.store.Store.replace_buckets`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from auditor.core.model import Bucket
from auditor.store.database import Database
from auditor.store.driver import DriverStatement
from auditor.store.spans import earlier, later
from auditor.store.tables import AGGREGATES, BUCKETS, JOBS, POD_OWNERS


@dataclass(frozen=True, slots=True)
class Displaced:
    """GPU time two jobs held, settled by a write (see :meth:`Store.replace_buckets`): job
    ``job_id`` lost ``buckets`` rows of pod ``namespace/pod`` to job ``owner``, which keeps them.
    ``job_id`` is the writing job itself when it yielded (a guess against a resolved identity)."""

    job_id: int
    namespace: str
    pod: str
    buckets: int
    owner: int


class GpuClaims:
    """The pod owners of one :class:`~auditor.store.database.Database`, on the bucket write's transaction."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._upsert_owners = DriverStatement(db, self._make_upsert_owner(), times=("first_start", "last_start"))
        o = POD_OWNERS.c
        self._rivals_stmt = (
            sa.select(o.job_id, o.pod_namespace, o.pod_name, o.first_start, o.last_start, JOBS.c.uid)
            .join(JOBS, JOBS.c.id == o.job_id)
            .where(
                o.cluster == cluster_of(sa.bindparam("job_id")),
                o.job_id != sa.bindparam("job_id"),
                o.pod_name.in_(sa.bindparam("names", expanding=True)),
            )
            .order_by(o.job_id, o.pod_namespace, o.pod_name)
        )
        # the span's times as the driver returns them, and the column type's own conversion
        dialect = db.engine.dialect
        raw = sa.String() if db.is_sqlite else sa.DateTime(timezone=True)
        self._raw_span = (sa.type_coerce(o.first_start, raw), sa.type_coerce(o.last_start, raw))
        self._time_from_db = o.first_start.type.dialect_impl(dialect).result_processor(dialect, None) or (lambda v: v)

    def _make_upsert_owner(self) -> sa.Executable:
        """The ``gpu_pod_owners`` upsert (executemany), widening the stored span of starts."""
        stmt = self._db.insert(POD_OWNERS).values(
            {
                "cluster": cluster_of(sa.bindparam("job_id")),
                **{c: sa.bindparam(c) for c in ("pod_namespace", "pod_name", "job_id", "first_start", "last_start")},
            }
        )
        ex, o = stmt.excluded, POD_OWNERS.c
        return stmt.on_conflict_do_update(
            index_elements=["cluster", "pod_namespace", "pod_name", "job_id"],
            set_={
                "first_start": earlier(ex.first_start, o.first_start),
                "last_start": later(ex.last_start, o.last_start),
            },
        )

    def claim_many(self, conn: Connection, items: Sequence[tuple[int, PodSpans]]) -> list[list[Displaced]] | None:
        """:meth:`claim` of several jobs with one owners' executemany and one rivals' read per 500
        pod names; what moved, per job in ``items``' order. None, having written nothing, where
        two of the jobs claim the same pod (the caller then claims them one at a time, in order).

        The same as one :meth:`claim` per job in order: the jobs hold different pods, so no
        job's claim changes what another's finds.
        """
        claimed: dict[tuple[str, str], int] = {}
        for job_id, spans in items:
            for key in spans:
                if claimed.setdefault(key, job_id) != job_id:
                    return None
        ids = [job_id for job_id, _s in items]
        jobs: dict[int, tuple[str, bool]] = {}
        j = JOBS.c
        for i in range(0, len(ids), 500):
            q = sa.select(j.id, j.cluster, j.uid).where(j.id.in_(ids[i : i + 500]))
            jobs.update({int(job_id): (cluster, uid is not None) for job_id, cluster, uid in conn.execute(q)})
        self._upsert_owners.executemany(
            conn,
            (
                {"pod_namespace": ns, "pod_name": pod, "job_id": job_id, "first_start": lo, "last_start": hi}
                for job_id, spans in items
                for (ns, pod), (lo, hi, _) in spans.items()
            ),
        )
        # A steady cycle finds only its own claims: their times stay as the driver gives them,
        # and only a rival's are converted.
        o = POD_OWNERS.c
        from_db = self._time_from_db
        namespaces: dict[str, set[str]] = {}
        for ns, pod in claimed:
            namespaces.setdefault(pod, set()).add(ns)
        names = sorted(namespaces)
        clusters = sorted({cluster for cluster, _ in jobs.values()})
        first_start, last_start = self._raw_span
        found: dict[int, list[tuple]] = {}
        for i in range(0, len(names), 500):
            part = names[i : i + 500]
            owners: Any = (
                sa.select(o.cluster, o.job_id, o.pod_namespace, o.pod_name, first_start, last_start, JOBS.c.uid)
                .join(JOBS, JOBS.c.id == o.job_id)
                .where(
                    o.cluster.in_(clusters),
                    o.pod_namespace.in_(sorted(set().union(*(namespaces[n] for n in part)))),
                    o.pod_name.in_(part),
                )
            )
            for cluster, other, ns, pod, first, last, uid in conn.execute(owners):
                mine = claimed.get((ns, pod))
                if mine is None or mine == other or jobs[mine][0] != cluster:
                    continue
                found.setdefault(mine, []).append((other, ns, pod, from_db(first), from_db(last), uid))
        out: list[list[Displaced]] = []
        for job_id, spans in items:
            rivals = sorted(found.get(job_id, ()), key=lambda r: (r[0], r[1], r[2]))
            out.append(self._settle(conn, job_id, spans, rivals, resolved=jobs[job_id][1]))
        return out

    def claim(self, conn: Connection, job_id: int, spans: PodSpans) -> list[Displaced]:
        """Record the job as an owner of its pods' GPU time, and settle it with any other job
        holding the same time (see :meth:`replace_buckets`), on the write's transaction.

        The common case (no other owner) costs one executemany and one indexed read per call.
        A job that does not exist fails the bucket write before (its foreign key).
        """
        self._upsert_owners.executemany(
            conn,
            (
                {"pod_namespace": ns, "pod_name": pod, "job_id": job_id, "first_start": lo, "last_start": hi}
                for (ns, pod), (lo, hi, _) in spans.items()
            ),
        )
        rivals: list[tuple] = []
        names = sorted({pod for _, pod in spans})
        for i in range(0, len(names), 500):
            rivals.extend(conn.execute(self._rivals_stmt, {"job_id": job_id, "names": names[i : i + 500]}).all())
        return self._settle(conn, job_id, spans, rivals, resolved=None)

    def _settle(
        self, conn: Connection, job_id: int, spans: dict, rivals: Sequence[tuple], *, resolved: bool | None
    ) -> list[Displaced]:
        """Settle the job's claim with each rival owner of its pods (``(job, namespace, pod,
        first start, last start, uid)`` in job, namespace, pod order); ``resolved``: whether the
        job has a uid, None to read it when a rival needs it."""
        out: list[Displaced] = []
        for other, ns, pod, first, last, other_uid in rivals:
            span = spans.get((ns, pod))
            if span is None or last < span[0] or first > span[1]:
                continue
            if resolved is None:
                resolved = conn.execute(sa.select(JOBS.c.uid).where(JOBS.c.id == job_id)).scalar_one() is not None
            # a guess (``Pod/<name>``, no uid) never replaces what the API said the pod belongs to
            loser, winner = (job_id, other) if (other_uid is not None and not resolved) else (other, job_id)
            moved = self._drop_shared(conn, loser, winner, ns, pod, span)
            if moved:
                out.append(Displaced(loser, ns, pod, moved, winner))
        return out

    def _drop_shared(
        self,
        conn: Connection,
        loser: int,
        winner: int,
        ns: str,
        pod: str,
        span: tuple[datetime, datetime, set[tuple[str, str]]],
    ) -> int:
        """Delete ``loser``'s buckets of the pod that ``winner`` holds too (same GPU and start,
        within this write's span of the pod); return how many. Its aggregate goes with them, and
        its ownership of the pod when none are left."""
        lo, hi, gpus = span
        b, o = BUCKETS.c, POD_OWNERS.c
        w = BUCKETS.alias("w")
        moved = 0
        for uuid, instance in sorted(gpus):
            held = sa.exists().where(
                w.c.job_id == winner,
                w.c.start == b.start,
                w.c.pod_namespace == ns,
                w.c.pod_name == pod,
                w.c.gpu_uuid == uuid,
                w.c.gpu_instance == instance,
            )
            moved += (
                conn.execute(
                    sa.delete(BUCKETS).where(
                        b.job_id == loser,
                        b.start >= lo,
                        b.start <= hi,
                        b.pod_namespace == ns,
                        b.pod_name == pod,
                        b.gpu_uuid == uuid,
                        b.gpu_instance == instance,
                        held,
                    )
                ).rowcount
                or 0
            )
        if moved:
            conn.execute(sa.delete(AGGREGATES).where(AGGREGATES.c.job_id == loser))
            left = conn.execute(
                sa.select(b.start).where(b.job_id == loser, b.pod_namespace == ns, b.pod_name == pod).limit(1)
            ).first()
            if left is None:
                conn.execute(sa.delete(POD_OWNERS).where(o.job_id == loser, o.pod_namespace == ns, o.pod_name == pod))
        return moved


#: per pod of a write, ``(namespace, name)``: its first and last bucket start, and its GPU keys
#: ``(uuid, instance or "")``
PodSpans = dict[tuple[str, str], tuple[datetime, datetime, set[tuple[str, str]]]]


def spans_of(buckets: Sequence[Bucket]) -> PodSpans:
    """The :data:`PodSpans` of a write's buckets."""
    spans: PodSpans = {}
    for bk in buckets:
        key = (bk.pod.namespace, bk.pod.pod)
        span = spans.get(key)
        if span is None:
            spans[key] = (bk.start, bk.start, {(bk.gpu.uuid, bk.gpu.instance or "")})
        else:
            span[2].add((bk.gpu.uuid, bk.gpu.instance or ""))
            if bk.start < span[0] or bk.start > span[1]:
                spans[key] = (min(span[0], bk.start), max(span[1], bk.start), span[2])
    return spans


def cluster_of(job_id: Any) -> Any:
    """The cluster of the job ``job_id`` (SQL scalar subquery): pods are named per cluster."""
    return sa.select(JOBS.c.cluster).where(JOBS.c.id == job_id).scalar_subquery()
