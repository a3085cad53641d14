"""The web console's reads (:class:`auditor.console.ports.ConsoleReader`) on a :class:`Store`.

Every list is filtered, sorted and cut into pages by the database, so a page of the job list
costs the same at 100 or 100,000 jobs: one ``COUNT`` and one ``ORDER BY .. LIMIT`` on
``job_summaries`` joined to ``jobs`` (the indexed columns of migration 0005, never the JSON
documents), plus three ``DISTINCT`` reads for the filters' choices. Only the job page reads a
document (its own). Other modules' readers (lineages, admissions, decisions, report figures) are
reused, not rewritten, so the console shows what ``explain`` and the weekly report show.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

from auditor.console.ports import (
    SORT_KEYS,
    ActionRow,
    ClusterNow,
    DecisionRow,
    DeliveryRow,
    JobDetail,
    JobFilter,
    JobPage,
    JobRow,
    MfuSums,
    TeamWeek,
    ViolationRow,
)
from auditor.core.figures import Figures
from auditor.core.gate import LineageHistory
from auditor.core.identity import JobKey
from auditor.core.metrics import Metric
from auditor.errors import BadInput
from auditor.store.admissions import AdmissionStore
from auditor.store.decisions import ActionRow as StoredAction
from auditor.store.decisions import DecisionStore
from auditor.store.lineage import LineageHistoryReader
from auditor.store.policy_tables import violations
from auditor.store.reports import ReportStore, deliveries, mfu_sums
from auditor.store.store import Store
from auditor.store.tables import AUDIT_RUNS, BUCKETS, JOBS, SUMMARIES

_j, _s, _b, _v = JOBS.c, SUMMARIES.c, BUCKETS.c, violations.c
#: the metrics of the job page's per-GPU timelines
TIMELINE_METRICS = (Metric.GPU_UTIL, Metric.SM_ACTIVE, Metric.TENSOR_ACTIVE, Metric.DRAM_ACTIVE)

_SORT_COLUMNS: dict[str, Any] = {
    "job": _j.name,
    "namespace": _s.namespace,
    "team": _s.team,
    "verdict": _s.verdict,
    "gpu_hours": _s.gpu_hours,
    "waste_gpu_hours": _s.waste_gpu_hours,
    "sm_active": _s.sm_active,
    "tensor_active": _s.tensor_active,
    "mfu_estimate": _s.mfu_estimate,
    "recoverable_gpu_hours": _s.recoverable_gpu_hours,
    "start": _s.start,
    "end": _s.end,
}
assert set(_SORT_COLUMNS) == set(SORT_KEYS)


def _like(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere, its wildcards taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _job_row(r: Any, when: Any = lambda v: v, fresh: datetime | None = None) -> JobRow:
    """A row of :data:`_ROW_COLUMNS` (unpacked by position: a page may hold 10,000, and a Row's
    attribute lookups cost more than the rest of the conversion). Running: not ended and, with
    ``fresh``, seen since then (as :meth:`ConsoleQueries.cluster_now` counts running jobs)."""
    jid, cluster, namespace, kind, name, ended_at, team, verdict, gh, waste, sm, tensor, start, end = tuple(r)[:14]
    mfu, ref, cls, rec, seen = tuple(r)[14:19]
    running = ended_at is None and (fresh is None or (seen is not None and when(seen) >= fresh))
    return JobRow(
        jid,
        cluster,
        namespace,
        kind,
        name,
        team or "",
        verdict or "",
        gh,
        waste,
        sm,
        tensor,
        when(start),
        when(end),
        running,
        mfu,
        ref,
        cls,
        rec,
    )


def _sqlite_time(text: str | None) -> datetime | None:
    """A time SQLite holds as UTC text (:class:`~auditor.store.tables.UTCDateTime`), parsed by
    the C parser: a page of 10,000 jobs spends most of its time in SQLAlchemy's regex otherwise."""
    return None if text is None else datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def _list_columns(sqlite: bool) -> list[Any]:
    """The job list's columns; on SQLite its times come as text for :func:`_sqlite_time`."""
    if not sqlite:
        return list(_ROW_COLUMNS)
    raw = {"ended_at", "start", "end", "last_seen"}
    return [sa.type_coerce(c, sa.String).label(c.name) if c.name in raw else c for c in _ROW_COLUMNS]


_ROW_COLUMNS = (
    _j.id,
    _j.cluster,
    _j.namespace,
    _j.kind,
    _j.name,
    _j.ended_at,
    _s.team,
    _s.verdict,
    _s.gpu_hours,
    _s.waste_gpu_hours,
    _s.sm_active,
    _s.tensor_active,
    _s.start,
    _s.end,
    _s.mfu_estimate,
    _s.mfu_reference,
    _s.mfu_class,
    _s.recoverable_gpu_hours,
    _j.last_seen,
)


def _action(a: StoredAction) -> ActionRow:
    return ActionRow(
        id=a.id,
        job=f"{a.job.namespace}/{a.job.kind}/{a.job.name}",
        cluster=a.job.cluster,
        policy=a.policy,
        action=a.action,
        state=a.state,
        attempts=a.attempts,
        created_at=a.created_at,
        updated_at=a.updated_at,
        due_at=a.due_at,
        error=a.error,
        result=a.result,
    )


def _violation(r: Any) -> ViolationRow:
    return ViolationRow(
        id=r.id,
        cluster=r.cluster,
        job=f"{r.namespace}/{r.kind}/{r.name}",
        job_id=getattr(r, "job_id", None),
        policy=r.policy,
        episode=r.episode,
        opened_at=r.opened_at,
        last_seen_at=r.last_seen_at,
        next_step=r.next_step,
        last_step_at=r.last_step_at,
    )


class ConsoleQueries:
    """The console's reader on one store (thread-safe: each call is its own transaction)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # ------------------------------------------------------------------ the cluster now

    def cluster_now(self, now: datetime, *, recent: float, since: datetime) -> ClusterNow:
        """Running jobs (no end, seen within ``recent`` seconds), their GPUs, and the verdicts of
        the jobs active since ``since`` (counted in full, as the job list shows them)."""
        fresh = now - timedelta(seconds=recent)
        day = now - timedelta(days=1)
        running = sa.and_(_j.ended_at.is_(None), _j.last_seen >= fresh)
        with self.store.reading("read the cluster's state for the console") as conn:
            n_running = conn.execute(sa.select(sa.func.count()).select_from(JOBS).where(running)).scalar_one()
            docs = conn.execute(
                sa.select(_s.data).select_from(SUMMARIES.join(JOBS, _j.id == _s.job_id)).where(running)
            ).scalars()
            allocated = sum(float((d or {}).get("gpus") or 0.0) for d in docs)
            recent_gpus = {
                tuple(r)
                for r in conn.execute(
                    sa.select(_b.gpu_uuid, _b.gpu_instance).where(_b.end > fresh, _b.start <= now).distinct()
                )
            }
            day_gpus = {
                tuple(r)
                for r in conn.execute(
                    sa.select(_b.gpu_uuid, _b.gpu_instance).where(_b.end > day, _b.start <= now).distinct()
                )
            }
            by_verdict: dict[str, float] = {}
            jobs_by_verdict: dict[str, int] = {}
            fig = Figures()
            q = (
                sa.select(
                    _s.verdict,
                    sa.func.count(),
                    sa.func.coalesce(sa.func.sum(_s.gpu_hours), 0.0),
                    sa.func.sum(_s.waste_gpu_hours),
                    *mfu_sums(sa.func.coalesce(_s.gpu_hours, 0.0)),
                )
                .where(sa.or_(_s.end >= since, _s.end.is_(None)))
                .group_by(_s.verdict)
            )
            for verdict, n, hours, w, mh, mm, rec, _, refs in conn.execute(q):
                by_verdict[str(verdict)] = float(hours)
                jobs_by_verdict[str(verdict)] = int(n)
                fig.add(
                    verdict,
                    jobs=int(n),
                    gpu_hours=float(hours),
                    measured_gpu_hours=0.0,
                    idle_gpu_hours=None if w is None else float(w),
                    mfu_gpu_hours=float(mh or 0),
                    mfu_measured_gpu_hours=float(mm or 0),
                    recoverable_gpu_hours=float(rec or 0),
                    referenced_jobs=int(refs or 0),
                )
            last = conn.execute(sa.select(sa.func.max(AUDIT_RUNS.c.finished))).scalar()
        return ClusterNow(
            running_jobs=int(n_running),
            gpus_allocated=allocated,
            gpus_seen=len(recent_gpus),
            gpus_idle_seen=len(day_gpus - recent_gpus),
            gpu_hours_by_verdict=by_verdict,
            waste_gpu_hours=fig.waste_gpu_hours,
            jobs_by_verdict=jobs_by_verdict,
            last_cycle=last,
            since=since,
            gap=MfuSums(fig.mfu_gpu_hours, fig.mfu_measured_gpu_hours, fig.recoverable_gpu_hours, fig.referenced_jobs),
            headroom_gpu_hours=fig.headroom_gpu_hours,
            flagged_jobs=fig.flagged,
        )

    # ------------------------------------------------------------------ teams over weeks

    def team_weeks(self, weeks: Sequence[tuple[str, datetime, datetime]], prices: dict[str, float]) -> list[TeamWeek]:
        """Per team and week, the weekly report's figures (jobs crossing a week are split)."""
        reports = ReportStore(self.store)
        out: list[TeamWeek] = []
        for label, start, end in weeks:
            sums: dict[str, Figures] = {}
            cost: dict[str, float] = {}
            for g in reports.week_groups(start, end):
                sums.setdefault(g.team, Figures()).add_group(g)
                price = prices.get(g.gpu_model, prices.get("default"))
                cost[g.team] = cost.get(g.team, 0.0) + (g.gpu_hours * price if price is not None else 0.0)
            for team, f in sorted(sums.items()):
                out.append(
                    TeamWeek(
                        team,
                        label,
                        f.gpu_hours,
                        f.waste_gpu_hours,
                        f.jobs,
                        cost[team] if prices else None,
                        dict(f.waste_by_verdict),
                        MfuSums(f.mfu_gpu_hours, f.mfu_measured_gpu_hours, f.recoverable_gpu_hours, f.referenced_jobs),
                        measured_gpu_hours=f.measured_gpu_hours,
                        idle_gpu_hours=f.idle_gpu_hours,
                        headroom_gpu_hours=f.headroom_gpu_hours,
                    )
                )
        return out

    # ------------------------------------------------------------------ the job list

    def jobs(self, f: JobFilter) -> JobPage:
        """One page of the jobs matching ``f``, sorted by the database over all of them.

        Two steps: the ids of the page (sort key and id only, so the sort never carries a row's
        other columns, and SQLite never walks the overflow pages of the documents stored in the
        same rows; with no job-level filter no join either), then those rows by id."""
        if f.sort not in _SORT_COLUMNS:
            raise BadInput(f"sort: {f.sort!r} is not one of {', '.join(SORT_KEYS)}")
        where: list[Any] = []
        joined = f.sort == "job" or bool(f.text) or bool(f.state)
        if f.team:
            where.append(_s.team == f.team)
        if f.namespace:
            where.append(_s.namespace == f.namespace)
        if f.verdict:
            where.append(_s.verdict == f.verdict)
        if f.text:
            where.append(_j.name.like(_like(f.text), escape="\\"))
        running: Any = _j.ended_at.is_(None)
        if f.running_since is not None:
            running = sa.and_(running, _j.last_seen >= f.running_since)
        if f.state == "running":
            where.append(running)
        elif f.state == "ended":
            where.append(sa.not_(running))
        source = SUMMARIES.join(JOBS, _j.id == _s.job_id) if joined else SUMMARIES
        col = _SORT_COLUMNS[f.sort]
        order = [col.desc().nulls_last() if f.descending else col.asc().nulls_last(), _s.job_id]
        ids_q = sa.select(_s.job_id).select_from(source).where(*where).order_by(*order)
        ids_q = ids_q.offset(max(f.offset, 0)).limit(max(f.limit, 1))
        sqlite = self.store.is_sqlite
        when = _sqlite_time if sqlite else (lambda v: v)
        rows_q = sa.select(*_list_columns(sqlite)).select_from(SUMMARIES.join(JOBS, _j.id == _s.job_id))
        with self.store.reading("list jobs for the console") as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(source).where(*where)).scalar_one()
            ids = list(conn.execute(ids_q).scalars())
            found: dict[int, JobRow] = {}
            for k in range(0, len(ids), 500):
                for r in conn.execute(rows_q.where(_s.job_id.in_(ids[k : k + 500]))):
                    row = _job_row(r, when, f.running_since)
                    found[row.id] = row
            teams = conn.execute(sa.select(_s.team).distinct().order_by(_s.team)).scalars().all()
            namespaces = conn.execute(sa.select(_s.namespace).distinct().order_by(_s.namespace)).scalars().all()
            verdicts = conn.execute(sa.select(_s.verdict).distinct().order_by(_s.verdict)).scalars().all()
        rows = [found[i] for i in ids if i in found]
        return JobPage(rows, int(total), list(teams), list(namespaces), list(verdicts))

    # ------------------------------------------------------------------ one job

    def job(self, job_id: int, now: datetime) -> JobDetail | None:
        """The job's summary, per-GPU buckets of the timeline metrics, lineage, Kueue facts,
        decisions with their actions, and violations; None for an unknown id."""
        q = (
            sa.select(*_ROW_COLUMNS, _j.uid, _j.queue, _j.first_seen, _j.last_seen, _s.data)
            .select_from(JOBS.outerjoin(SUMMARIES, _j.id == _s.job_id))
            .where(_j.id == job_id)
        )
        with self.store.reading(f"read job {job_id} for the console") as conn:
            r = conn.execute(q).first()
            if r is None:
                return None
            vio = conn.execute(
                sa.select(violations)
                .where(_v.cluster == r.cluster, _v.namespace == r.namespace, _v.kind == r.kind, _v.name == r.name)
                .order_by(_v.opened_at, _v.id)
            ).all()
        wanted = set(TIMELINE_METRICS)
        buckets = [b for b in self.store.buckets(job_id) if b.metric in wanted]
        ident = JobKey(r.cluster, r.namespace, r.kind, r.name)
        ledger = DecisionStore(self.store)
        by_decision: dict[int | None, list[ActionRow]] = {}
        for a in ledger.actions(job=ident):
            by_decision.setdefault(a.decision_id, []).append(_action(a))
        decisions = [
            DecisionRow(
                id=d["id"],
                policy=d["policy"],
                mode=d["mode"],
                step=d["step"],
                decided_at=d["decided_at"],
                dry_run=bool(d["dry_run"]),
                verdict=d["verdict"],
                reason=d["reason"],
                actions=tuple(by_decision.get(d["id"], ())),
            )
            for d in ledger.decisions(job=ident)
        ]
        lineage = LineageHistoryReader(self.store).history_of_job(r.namespace, r.kind, r.name, r.cluster, now)
        return JobDetail(
            row=_job_row(r),
            uid=r.uid,
            queue=r.queue,
            first_seen=r.first_seen,
            last_seen=r.last_seen,
            ended_at=r.ended_at,
            summary=dict(r.data or {}),
            buckets=buckets,
            lineage=lineage,
            admission=AdmissionStore(self.store).facts(job_id),
            decisions=decisions,
            violations=[_violation(v) for v in vio],
        )

    # ------------------------------------------------------------------ policy, gate, deliveries

    def open_violations(self) -> list[ViolationRow]:
        """Open violations, oldest first, with the id of the job each is about (None when gone)."""
        q = (
            sa.select(violations, _j.id.label("job_id"))
            .select_from(
                violations.outerjoin(
                    JOBS,
                    sa.and_(
                        _j.cluster == _v.cluster, _j.namespace == _v.namespace, _j.kind == _v.kind, _j.name == _v.name
                    ),
                )
            )
            .where(_v.state == "open")
            .order_by(_v.opened_at, _v.id)
        )
        with self.store.reading("read open violations for the console") as conn:
            return [_violation(r) for r in conn.execute(q)]

    def lineages(self, since: datetime) -> list[LineageHistory]:
        """Every lineage seen since ``since``, with its runs and acknowledgements."""
        return LineageHistoryReader(self.store).histories(since=since)

    def actions(self, since: datetime) -> list[ActionRow]:
        """Actions created or updated since ``since``, newest first."""
        return [_action(a) for a in reversed(DecisionStore(self.store).actions(since=since))]

    def deliveries(self, since_week: str) -> list[DeliveryRow]:
        """Weekly report deliveries of ``since_week`` (``YYYY-Www``) and later, newest first."""
        d = deliveries.c
        q = sa.select(deliveries).where(d.week >= since_week).order_by(d.week.desc(), d.team, d.channel)
        with self.store.reading("read report deliveries for the console") as conn:
            return [
                DeliveryRow(
                    cluster=r.cluster,
                    week=r.week,
                    team=r.team,
                    channel=r.channel,
                    status=r.status,
                    attempts=r.attempts,
                    claimed_at=r.claimed_at,
                    sent_at=r.sent_at,
                    error=r.error,
                )
                for r in conn.execute(q)
            ]


def team_mfu(
    store: Store, *, since: datetime, cluster: str | None = None
) -> dict[str, tuple[float, float, float, int]]:
    """Per team, over the jobs seen since ``since`` (their summaries' end): GPU-hours × MFU and the
    GPU-hours of the jobs with an MFU estimate, the recoverable GPU-hours and the number of jobs with
    a reference MFU. One ``GROUP BY`` on the columns of migration 0010: the operator's ``/metrics``
    gauges (:mod:`auditor.operator_loop.fleet_metrics`) read it once per cycle."""
    mfu_h, measured, rec, _, refs = mfu_sums(sa.func.coalesce(_s.gpu_hours, 0.0))
    q = sa.select(_s.team, mfu_h, measured, rec, refs).where(_s.end >= since)
    if cluster is not None:
        q = q.where(_s.cluster == cluster)
    with store.reading("read the teams' MFU") as conn:
        rows = conn.execute(q.group_by(_s.team)).all()
    return {str(t or ""): (float(a or 0), float(b or 0), float(c or 0), int(d or 0)) for t, a, b, c, d in rows}
