"""The lineage tables (migration 0009) and the one write the summary store makes into them.

Separate from :mod:`auditor.store.lineage` (the gate's reader and the acknowledgement log) so
that :meth:`auditor.store.store.Store.save_summary` can record each job's run of its lineage in
the transaction that saves its summary, without importing the module that imports the store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from auditor.core.gate import LineageRun
from auditor.core.identity import split_job
from auditor.core.lineage import LineageKey
from auditor.core.lineage import lineage_of_summary as core_lineage_of_summary
from auditor.core.model import JobRef
from auditor.store.tables import JSONDoc, UTCDateTime

_md = sa.MetaData()

lineages = sa.Table(
    "lineages",
    _md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("cluster", sa.String(253), nullable=False),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("lineage", sa.String(253), nullable=False),
    sa.Column("team", sa.String(253), nullable=False, server_default=""),
    sa.Column("first_seen", UTCDateTime, nullable=False),
    sa.Column("last_seen", UTCDateTime, nullable=False),
    sa.UniqueConstraint("cluster", "namespace", "lineage", name="uq_lineages_identity"),
)
lineage_runs = sa.Table(
    "lineage_runs",
    _md,
    sa.Column("lineage_id", sa.Integer, sa.ForeignKey("lineages.id", ondelete="CASCADE"), nullable=False),
    sa.Column("job_kind", sa.String(253), nullable=False),
    sa.Column("job_name", sa.String(253), nullable=False),
    sa.Column("job_uid", sa.String(64), nullable=False),
    sa.Column("verdict", sa.String(64), nullable=False),
    sa.Column("findings", JSONDoc, nullable=False),
    sa.Column("start", UTCDateTime, nullable=True),
    sa.Column("end", UTCDateTime, nullable=True),
    sa.Column("gpu_hours", sa.Float, nullable=True),
    sa.Column("waste_gpu_hours", sa.Float, nullable=True),
    sa.Column("final", sa.Boolean, nullable=False),
    sa.Column("recorded_at", UTCDateTime, nullable=False),
    # migration 0010 (issue 28): the run's MFU estimate, whose best earlier value is the
    # lineage-best reference of the lineage's later runs
    sa.Column("mfu_estimate", sa.Float, nullable=True),
    sa.PrimaryKeyConstraint("lineage_id", "job_kind", "job_name", "job_uid", name="pk_lineage_runs"),
    sa.Index("ix_lineage_runs_start", "lineage_id", "start"),
    sa.Index("ix_lineage_runs_job", "job_name", "job_kind"),
)
lineage_acks = sa.Table(
    "lineage_acks",
    _md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("lineage_id", sa.Integer, sa.ForeignKey("lineages.id", ondelete="CASCADE"), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("by", sa.String(253), nullable=False),
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Column("until", UTCDateTime, nullable=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("via", sa.String(32), nullable=False),
    sa.Column("link_id", sa.String(128), nullable=True, unique=True),
    sa.Index("ix_lineage_acks_lineage", "lineage_id", "at"),
    sa.Index("ix_lineage_acks_at", "at"),
)

#: the tables of this module (schema comparison in tests)
TABLES: tuple[sa.Table, ...] = (lineages, lineage_runs, lineage_acks)


def _insert(conn: sa.Connection) -> Any:
    return sqlite_dialect.insert if conn.dialect.name == "sqlite" else pg_dialect.insert


#: (dialect, with team) → the lineage upsert; (dialect,) → the run upsert: built once, as a cycle
#: records a run per job (thousands) and building a statement cost more than executing it
_STATEMENTS: dict[tuple, Any] = {}


def _lineage_upsert(conn: sa.Connection, with_team: bool) -> Any:
    key = ("lineage", conn.dialect.name, with_team)
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        ins = _insert(conn)(lineages)
        greatest = sa.func.max if conn.dialect.name == "sqlite" else sa.func.greatest
        update: dict[str, Any] = {"last_seen": greatest(lineages.c.last_seen, ins.excluded.last_seen)}
        if with_team:
            update["team"] = ins.excluded.team
        stmt = _STATEMENTS[key] = ins.on_conflict_do_update(
            index_elements=["cluster", "namespace", "lineage"], set_=update
        )
    return stmt


_LINEAGE_ID = sa.select(lineages.c.id).where(
    lineages.c.cluster == sa.bindparam("k_cluster"),
    lineages.c.namespace == sa.bindparam("k_namespace"),
    lineages.c.lineage == sa.bindparam("k_lineage"),
)


def lineage_id_of(conn: sa.Connection, key: LineageKey, now: datetime, team: str = "") -> int:
    """The lineage's row id, created (or its ``last_seen``/team advanced) on the way."""
    conn.execute(_lineage_upsert(conn, bool(team)), _lineage_row(key, team, now))
    found = conn.execute(
        _LINEAGE_ID, {"k_cluster": key.cluster, "k_namespace": key.namespace, "k_lineage": key.lineage}
    )
    return int(found.scalar_one())


def _lineage_row(key: LineageKey, team: str, now: datetime) -> dict[str, Any]:
    """The ``lineages`` upsert's parameters: the lineage seen at ``now`` (by ``team``, if named)."""
    return {
        "cluster": key.cluster,
        "namespace": key.namespace,
        "lineage": key.lineage,
        "team": team,
        "first_seen": now,
        "last_seen": now,
    }


def is_lineage(key: LineageKey) -> sa.ColumnElement[bool]:
    return sa.and_(
        lineages.c.cluster == key.cluster,
        lineages.c.namespace == key.namespace,
        lineages.c.lineage == key.lineage,
    )


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def run_of(job: JobRef, summary: Mapping[str, Any]) -> LineageRun:
    """The run a job's audit-JSON summary makes of it (verdict, findings' codes, span)."""
    codes = tuple(str(f.get("code")) for f in summary.get("findings") or () if isinstance(f, Mapping) and f.get("code"))
    return LineageRun(
        job=job.job,
        verdict=str(summary.get("verdict") or ""),
        start=_time(summary.get("start")),
        end=_time(summary.get("end")),
        uid=job.uid,
        findings=codes,
        gpu_hours=_float(summary.get("gpu_hours")),
        waste_gpu_hours=_float(summary.get("waste_gpu_hours")),
        final=bool(summary.get("final")),
    )


def lineage_of_summary(job: JobRef, summary: Mapping[str, Any]) -> LineageKey:
    """The lineage of the job's summary (:func:`auditor.core.lineage.lineage_of_summary`), by the
    job row's identity (the store's, not the document's, cluster and name)."""
    return core_lineage_of_summary({**summary, "cluster": job.cluster, "namespace": job.namespace, "job": job.job})


def record_run(
    conn: sa.Connection,
    key: LineageKey,
    run: LineageRun,
    now: datetime,
    *,
    team: str = "",
    mfu: float | None = None,
) -> None:
    """Store ``run`` under ``key`` in ``conn``'s transaction, replacing an earlier record of the job."""
    conn.execute(_run_upsert(conn), _run_values(lineage_id_of(conn, key, now, team), run, now, mfu))


def _run_values(lineage_id: int, run: LineageRun, now: datetime, mfu: float | None = None) -> dict[str, Any]:
    """The ``lineage_runs`` row of ``run`` (with its MFU estimate, ``mfu``)."""
    kind, name = split_job(run.job)
    return {
        "lineage_id": lineage_id,
        "job_kind": kind,
        "job_name": name,
        "job_uid": run.uid or "",
        "verdict": run.verdict,
        "findings": list(run.findings),
        "start": run.start,
        "end": run.end,
        "gpu_hours": run.gpu_hours,
        "waste_gpu_hours": run.waste_gpu_hours,
        "final": run.final,
        "recorded_at": now,
        "mfu_estimate": mfu,
    }


_RUN_KEY = ("lineage_id", "job_kind", "job_name", "job_uid")


def _run_upsert(conn: sa.Connection) -> Any:
    key = ("run", conn.dialect.name)
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        ins = _insert(conn)(lineage_runs)
        stmt = _STATEMENTS[key] = ins.on_conflict_do_update(
            index_elements=list(_RUN_KEY),
            set_={c.name: ins.excluded[c.name] for c in lineage_runs.columns if c.name not in _RUN_KEY},
        )
    return stmt


def record_summary(conn: sa.Connection, job: JobRef, summary: Mapping[str, Any], now: datetime) -> LineageKey:
    """Record the job's latest verdict as its run of its lineage (``Store.save_summary`` calls it)."""
    key = lineage_of_summary(job, summary)
    team = str(summary.get("team") or job.team or "")
    record_run(conn, key, run_of(job, summary), now, team=team, mfu=_float(summary.get("mfu_estimate")))
    return key


def record_summaries(conn: sa.Connection, items: Sequence[tuple[JobRef, Mapping[str, Any], datetime]]) -> None:
    """:func:`record_summary` of several jobs, in order, with three statements in all: the
    lineages' upserts (one executemany), their ids (one read per 500 lineages), the runs' upserts
    (one executemany). The same rows as one call per job: the lineage's team follows the last
    summary that named one, its ``last_seen`` the latest, each job's run the last."""
    if not items:
        return
    lineage_rows: list[dict[str, Any]] = []
    planned: list[tuple[LineageKey, LineageRun, datetime, float | None]] = []
    for job, summary, now in items:
        key = lineage_of_summary(job, summary)
        team = str(summary.get("team") or job.team or "")
        lineage_rows.append(_lineage_row(key, team, now))
        planned.append((key, run_of(job, summary), now, _float(summary.get("mfu_estimate"))))
    conn.execute(_lineage_upsert_any(conn), lineage_rows)
    ids = _lineage_ids(
        conn, sorted({k for k, _r, _n, _m in planned}, key=lambda k: (k.cluster, k.namespace, k.lineage))
    )
    runs: dict[tuple, dict[str, Any]] = {}
    for key, run, now, mfu in planned:
        values = _run_values(ids[key], run, now, mfu)
        rk = tuple(values[c] for c in _RUN_KEY)
        runs.pop(rk, None)
        runs[rk] = values
    conn.execute(_run_upsert(conn), list(runs.values()))


def _lineage_upsert_any(conn: sa.Connection) -> Any:
    """The lineage upsert of :func:`lineage_id_of` for rows with and without a team in one
    executemany: a row's team replaces the stored one only where it is not empty."""
    key = ("lineage-any", conn.dialect.name)
    stmt = _STATEMENTS.get(key)
    if stmt is None:
        ins = _insert(conn)(lineages)
        greatest = sa.func.max if conn.dialect.name == "sqlite" else sa.func.greatest
        stmt = _STATEMENTS[key] = ins.on_conflict_do_update(
            index_elements=["cluster", "namespace", "lineage"],
            set_={
                "last_seen": greatest(lineages.c.last_seen, ins.excluded.last_seen),
                "team": sa.case((ins.excluded.team != "", ins.excluded.team), else_=lineages.c.team),
            },
        )
    return stmt


#: a run on too little data to judge says nothing about what its lineage can reach
_NO_VERDICT = "insufficient_data"
#: lineages read per statement
_BEST_GROUP = 500


def lineage_best_mfu(conn: sa.Connection, items: Sequence[tuple[LineageKey, JobRef]]) -> dict[int, float]:
    """By position in ``items``: the best MFU estimate of the *other* runs of the job's lineage
    that started before the job's own recorded run (every other run when the job has none yet);
    positions without such a run are left out (:func:`auditor.core.mfu.reference_for`'s
    ``lineage_best``).

    Runs judged ``insufficient_data``, runs without a start and runs without a positive estimate
    do not count. Read per 500 lineages in three statements: their ids, the runs that set a new
    best when they started (a window function: a lineage of thousands of runs gives a handful,
    and the best before any instant is the best of those before it), and the jobs' own runs."""
    ids = _lineage_ids(conn, sorted({k for k, _j in items}, key=lambda k: (k.cluster, k.namespace, k.lineage)))
    names: dict[int, set[str]] = {}
    for key, job in items:
        if key in ids:
            names.setdefault(ids[key], set()).add(split_job(job.job)[1])
    wanted = sorted(names)
    records: dict[int, list[tuple[datetime, tuple[str, str, str], float]]] = {}
    own: dict[tuple[int, str, str, str], datetime | None] = {}
    r = lineage_runs.c
    for i in range(0, len(wanted), _BEST_GROUP):
        part = wanted[i : i + _BEST_GROUP]
        # in the order of ix_lineage_runs_start (lineage, start): no sort; runs that started
        # together are in either order, and only a later start is ever compared with them
        before = sa.func.max(r.mfu_estimate).over(partition_by=r.lineage_id, order_by=r.start, rows=(None, -1))
        runs = (
            sa.select(r.lineage_id, r.job_kind, r.job_name, r.job_uid, r.start, r.mfu_estimate, before.label("before"))
            .where(r.lineage_id.in_(part), r.mfu_estimate > 0, r.start.is_not(None), r.verdict != _NO_VERDICT)
            .subquery()
        )
        best = sa.select(runs).where(sa.or_(runs.c.before.is_(None), runs.c.mfu_estimate > runs.c.before))
        for lid, kind, name, uid, start, mfu, _before in conn.execute(best):
            records.setdefault(lid, []).append((start, (kind, name, uid), float(mfu)))
        mine = sa.select(r.lineage_id, r.job_kind, r.job_name, r.job_uid, r.start).where(
            r.lineage_id.in_(part), r.job_name.in_(sorted(set().union(*(names[lid] for lid in part))))
        )
        for lid, kind, name, uid, start in conn.execute(mine):
            own[(lid, kind, name, uid)] = start
    out: dict[int, float] = {}
    for n, (key, job) in enumerate(items):
        lid = ids.get(key)
        if lid is None or lid not in records:
            continue
        kind, name = split_job(job.job)
        me = (kind, name, job.uid or "")
        since = own.get((lid, *me))
        earlier = [mfu for start, who, mfu in records[lid] if who != me and (since is None or start < since)]
        if earlier:
            out[n] = max(earlier)
    return out


def _lineage_ids(conn: sa.Connection, keys: Sequence[LineageKey]) -> dict[LineageKey, int]:
    """The row ids of the ``keys`` that are stored, one read per 500."""
    ids: dict[LineageKey, int] = {}
    for i in range(0, len(keys), 500):
        part = keys[i : i + 500]
        q = sa.select(lineages.c.id, lineages.c.cluster, lineages.c.namespace, lineages.c.lineage).where(
            lineages.c.cluster.in_(sorted({k.cluster for k in part})),
            lineages.c.namespace.in_(sorted({k.namespace for k in part})),
            lineages.c.lineage.in_(sorted({k.lineage for k in part})),
        )
        for lid, cluster, namespace, lineage in conn.execute(q):
            ids[LineageKey(cluster, namespace, lineage)] = int(lid)
    return ids
