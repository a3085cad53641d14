"""The store's side of the weekly reports: week aggregates in SQL, and the delivery ledger.

Reading a week (``[start, end)`` in UTC):

- A job whose observed span lies **inside** the week counts in full. Those are the vast
  majority; they are summed by the database (``GROUP BY team, verdict, gpu_model``), so a week
  of 100,000 jobs comes back as a few hundred rows.
- A job that **crosses** a week boundary is split by time, never counted twice. Preferred: the
  bucket rollup. Its share of the week is the busy signal's sample count in the week's buckets
  over the summary's sample count of that signal (both from the same scrapes), and its SM and
  tensor activity in the week are the means of its buckets in the week. When the rollup no
  longer holds the job's buckets (older than ``bucket_retention``), the split is proportional to
  the overlap of the summary's ``[start, end)`` with the week, with the job-level means. Each
  split job says which method it got (``split``: ``inside``, ``rollup`` or ``time``).

The summary fields these queries read (GPU model, activity, coverage, busy signal and its sample
counts; the MFU estimate, its reference and the recoverable GPU-hours) are columns of
``job_summaries`` (migrations 0005 and 0010), never parsed out of the JSON document in SQL; only
:meth:`ReportStore.advice` reads the document, for the few top jobs. A split job keeps its MFU
(a ratio of its whole run) and has its recoverable GPU-hours cut like its GPU-hours.

The deliveries ledger (table ``report_deliveries``, migration 0003) is what makes a report
go out once per team, week and channel across restarts and replicas: a row is claimed (inserted
under a unique dedup key) before the message is posted, and marked ``sent`` after.

This module uses only the store's public transactions (:meth:`~auditor.store.Store.reading`,
:meth:`~auditor.store.Store.writing`): the store keeps one transaction and one error policy for
everything, and the report queries live beside their users.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from auditor.errors import BadInput
from auditor.store.policy_tables import actions as policy_actions
from auditor.store.store import Store
from auditor.store.tables import BUCKETS, JOBS, SUMMARIES, UTCDateTime

_s = SUMMARIES.c
_b = BUCKETS.c
_jobs, _summaries, _buckets = JOBS, SUMMARIES, BUCKETS

#: The delivery ledger, as migration 0003 creates it (a test keeps the two equal).
_metadata = sa.MetaData()
deliveries = sa.Table(
    "report_deliveries",
    _metadata,
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("dedup_key", sa.String(700), nullable=False),
    sa.Column("cluster", sa.String(253), nullable=False),
    sa.Column("week", sa.String(8), nullable=False),
    sa.Column("team", sa.String(253), nullable=False),
    sa.Column("channel", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("claimed_at", UTCDateTime(), nullable=False),
    sa.Column("claimed_by", sa.String(253), nullable=False, server_default=""),
    sa.Column("sent_at", UTCDateTime(), nullable=True),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("detail", sa.JSON().with_variant(sa.dialects.postgresql.JSONB(), "postgresql"), nullable=False),
    sa.UniqueConstraint("dedup_key", name="uq_report_deliveries_dedup"),
    sa.Index("ix_report_deliveries_week", "cluster", "week"),
)
_d = deliveries.c

#: busy signals, in the order the summary prefers them
_BUSY = ("gpu_util", "gr_engine_active")
_SPLIT_METRICS = ("gpu_util", "gr_engine_active", "sm_active", "tensor_active")
_IN_CHUNK = 500  # ids per IN (...) list


@dataclass(slots=True)
class Group:
    """The sum over a set of jobs of one team, verdict and GPU model (one row of the week).

    ``measured_gpu_hours`` are the GPU-hours of jobs with a waste figure (SM activity on all
    their GPUs); the rest are ``unmeasured_gpu_hours``. ``sm_active_gpu_hours`` is measured
    GPU-hours minus waste (per GPU: hours × SM activity). ``tensor_active_gpu_hours`` sums
    GPU-hours × tensor activity over the jobs that have it. The MFU sums (issue 28):
    ``mfu_gpu_hours`` is GPU-hours × MFU estimate over ``mfu_measured_gpu_hours`` (jobs with an
    estimate: the weighted MFU is their ratio); ``recoverable_gpu_hours`` sums the MFU gap over
    the ``referenced_jobs`` whose class (or lineage) gives a reference MFU
    (``referenced_gpu_hours``).
    """

    team: str
    verdict: str
    gpu_model: str
    jobs: int
    gpu_hours: float
    measured_gpu_hours: float
    unmeasured_gpu_hours: float
    waste_gpu_hours: float
    tensor_active_gpu_hours: float
    mfu_gpu_hours: float = 0.0
    mfu_measured_gpu_hours: float = 0.0
    recoverable_gpu_hours: float = 0.0
    referenced_gpu_hours: float = 0.0
    referenced_jobs: int = 0


@dataclass(slots=True)
class MfuBin:
    """Jobs of one team whose MFU estimate falls in bin ``bin`` (``[bin, bin + 1) / MFU_BINS``)."""

    team: str
    bin: int
    jobs: int
    gpu_hours: float


#: the MFU distribution's bins: 5 % wide, the last one holding 1.0
MFU_BINS = 20


def mfu_bin(mfu: float) -> int:
    """The bin of an MFU estimate (clamped to ``0 .. MFU_BINS - 1``)."""
    return max(0, min(MFU_BINS - 1, int(mfu * MFU_BINS)))


@dataclass(slots=True)
class JobWeek:
    """One job's share of a week (after the split)."""

    job_id: int
    cluster: str
    namespace: str
    job: str
    team: str
    verdict: str
    gpu_model: str
    start: datetime
    end: datetime
    split: str  # inside | rollup | time
    fraction: float  # share of the job's GPU-hours that fell in the week
    gpu_hours: float
    sm_active: float | None
    tensor_active: float | None
    waste_gpu_hours: float | None  # None: unmeasured
    coverage: float | None
    mfu_estimate: float | None = None
    mfu_reference: float | None = None
    mfu_class: str | None = None
    recoverable_gpu_hours: float | None = None  # None: no reference (never charged)

    def group(self) -> Group:
        measured = self.waste_gpu_hours is not None
        mfu, rec = self.mfu_estimate, self.recoverable_gpu_hours
        return Group(
            team=self.team,
            verdict=self.verdict,
            gpu_model=self.gpu_model,
            jobs=1,
            gpu_hours=self.gpu_hours,
            measured_gpu_hours=self.gpu_hours if measured else 0.0,
            unmeasured_gpu_hours=0.0 if measured else self.gpu_hours,
            waste_gpu_hours=self.waste_gpu_hours or 0.0,
            tensor_active_gpu_hours=self.gpu_hours * self.tensor_active if self.tensor_active is not None else 0.0,
            mfu_gpu_hours=self.gpu_hours * mfu if mfu is not None else 0.0,
            mfu_measured_gpu_hours=self.gpu_hours if mfu is not None else 0.0,
            recoverable_gpu_hours=rec or 0.0,
            referenced_gpu_hours=self.gpu_hours if rec is not None else 0.0,
            referenced_jobs=1 if rec is not None else 0,
        )


class ReportStore:
    """Report queries and the delivery ledger over one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # ------------------------------------------------------------------ week aggregates

    def _in_cluster(self, cluster: str) -> Any:
        """``cluster = :cluster``, marked as true for most rows on SQLite. A store holds mostly
        one cluster's jobs, but the store never runs ANALYZE, and without statistics SQLite's
        planner takes an equality for selective: it walked ``ix_job_summaries_scope`` through
        every summary of the cluster (49 s for a week's report over 1.1 M summaries instead of
        2 s) rather than the week's range of ``ix_job_summaries_week``. PostgreSQL keeps its
        own statistics (autovacuum), so it gets the plain comparison."""
        cond = _s.cluster == cluster
        return sa.func.likely(cond) if self.store.is_sqlite else cond

    def _scope(self, q: sa.Select, cluster: str | None, teams: Sequence[str] | None) -> sa.Select:
        if cluster is not None:
            q = q.where(self._in_cluster(cluster))
        if teams is not None:
            q = q.where(_s.team.in_(list(teams)))
        return q

    def week_groups(
        self,
        start: datetime,
        end: datetime,
        *,
        cluster: str | None = None,
        teams: Sequence[str] | None = None,
        by_model: bool = True,
        crossing: Sequence[JobWeek] | None = None,
    ) -> list[Group]:
        """Every job overlapping ``[start, end)``, summed per (team, verdict, GPU model); jobs
        crossing the week's bounds are split (module docstring) and come as their own rows.

        ``by_model=False`` leaves the GPU model and the tensor activity out (fewer groups):
        enough for the trend, which shows hours, efficiency and waste. ``crossing``: the week's
        :meth:`crossing_jobs` when the caller has them already. Every column read here is in
        the covering index ``ix_job_summaries_week`` (migration 0005).
        """
        measured = _s.waste_gpu_hours.is_not(None)
        hours = sa.func.coalesce(_s.gpu_hours, 0.0)
        if by_model:
            model: Any = sa.func.coalesce(_s.gpu_model, "")
            tensor = _s.tensor_active
            tensor_hours: Any = sa.func.sum(sa.case((tensor.is_not(None), hours * tensor), else_=0.0))
        else:
            model, tensor_hours = sa.literal(""), sa.literal(0.0)
        q = sa.select(
            _s.team,
            _s.verdict,
            model,
            sa.func.count(),
            sa.func.sum(hours),
            sa.func.sum(sa.case((measured, hours), else_=0.0)),
            sa.func.sum(sa.case((measured, 0.0), else_=hours)),
            sa.func.sum(sa.func.coalesce(_s.waste_gpu_hours, 0.0)),
            tensor_hours,
            *mfu_sums(hours),
        ).where(_s.start >= start, _s.end <= end, _s.end > start)
        q = self._scope(q, cluster, teams).group_by(_s.team, _s.verdict, *([model] if by_model else []))
        with self.store.reading("read the week's job summaries") as conn:
            rows = conn.execute(q).all()
        out = [
            Group(
                t,
                v,
                m or "",
                int(n),
                float(gh or 0),
                float(mh or 0),
                float(uh or 0),
                float(w or 0),
                float(th or 0),
                mfu_gpu_hours=float(mfu_h or 0),
                mfu_measured_gpu_hours=float(mfu_n or 0),
                recoverable_gpu_hours=float(rec or 0),
                referenced_gpu_hours=float(ref_h or 0),
                referenced_jobs=int(ref_n or 0),
            )
            for t, v, m, n, gh, mh, uh, w, th, mfu_h, mfu_n, rec, ref_h, ref_n in rows
        ]
        if crossing is None:
            crossing = self.crossing_jobs(start, end, cluster=cluster, teams=teams)
        for j in crossing:
            grp = j.group()
            if not by_model:
                grp.gpu_model, grp.tensor_active_gpu_hours = "", 0.0
            out.append(grp)
        return out

    def _job_columns(self) -> list[Any]:
        return [
            _s.job_id,
            _s.cluster,
            _s.namespace,
            _s.job,
            _s.team,
            _s.verdict,
            sa.func.coalesce(_s.gpu_model, ""),
            _s.start,
            _s.end,
            _s.gpu_hours,
            _s.waste_gpu_hours,
            _s.sm_active,
            _s.tensor_active,
            _s.coverage,
            _s.mfu_estimate,
            _s.mfu_reference,
            _s.mfu_class,
            _s.recoverable_gpu_hours,
        ]

    def mfu_bins(
        self,
        start: datetime,
        end: datetime,
        *,
        cluster: str | None = None,
        teams: Sequence[str] | None = None,
        crossing: Sequence[JobWeek] | None = None,
    ) -> list[MfuBin]:
        """The week's jobs with an MFU estimate, counted per team and 5 % MFU bin (jobs and
        GPU-hours): the distribution behind a team's weighted MFU. Jobs inside the week are
        counted by the database (one ``GROUP BY``); crossing jobs with their share of hours."""
        mfu = _s.mfu_estimate
        # CAST truncates toward zero: the floor of a non-negative MFU × bins on both databases
        raw = sa.cast(mfu * MFU_BINS, sa.Integer)
        b = sa.case((raw >= MFU_BINS, MFU_BINS - 1), (raw < 0, 0), else_=raw)
        q = sa.select(_s.team, b, sa.func.count(), sa.func.sum(sa.func.coalesce(_s.gpu_hours, 0.0))).where(
            _s.start >= start, _s.end <= end, _s.end > start, mfu.is_not(None)
        )
        q = self._scope(q, cluster, teams).group_by(_s.team, b)
        with self.store.reading("read the week's MFU distribution") as conn:
            rows = conn.execute(q).all()
        acc: dict[tuple[str, int], MfuBin] = {}
        for team, k, n, gh in rows:
            acc[(team or "", int(k))] = MfuBin(team or "", int(k), int(n), float(gh or 0.0))
        if crossing is None:
            crossing = self.crossing_jobs(start, end, cluster=cluster, teams=teams)
        for j in crossing:
            if j.mfu_estimate is None:
                continue
            k = mfu_bin(j.mfu_estimate)
            cell = acc.setdefault((j.team, k), MfuBin(j.team, k, 0, 0.0))
            cell.jobs += 1
            cell.gpu_hours += j.gpu_hours
        return [acc[k] for k in sorted(acc)]

    def crossing_jobs(
        self, start: datetime, end: datetime, *, cluster: str | None = None, teams: Sequence[str] | None = None
    ) -> list[JobWeek]:
        """The jobs overlapping ``[start, end)`` that start before it or end after it, split."""
        return self.crossing_jobs_of([(start, end)], cluster=cluster, teams=teams)[0]

    def crossing_jobs_of(
        self,
        weeks: Sequence[tuple[datetime, datetime]],
        *,
        cluster: str | None = None,
        teams: Sequence[str] | None = None,
    ) -> list[list[JobWeek]]:
        """:meth:`crossing_jobs` of several weeks with one scan of the summaries: a job is
        read once if it crosses any of the weeks' bounds (a trend's weeks share most rows)."""
        if not weeks:
            return []
        cols = self._job_columns() + [_s.busy_signal, _s.gpu_util_samples, _s.gr_engine_active_samples]
        bounds = sorted({t for w in weeks for t in w})
        lo, hi = min(s for s, _ in weeks), max(e for _, e in weeks)
        crosses = sa.or_(*[sa.and_(_s.start < b, _s.end > b) for b in bounds])
        q = sa.select(*cols).where(_s.end > lo, _s.start < hi, crosses)
        # no ORDER BY: on SQLite it would make the planner walk the whole table in key order
        # instead of the weeks' range of the ``end`` index (the few rows are sorted here)
        q = self._scope(q, cluster, teams)
        out: list[list[JobWeek]] = []
        with self.store.reading("read the weeks' boundary jobs") as conn:
            rows = sorted(conn.execute(q).all(), key=lambda r: r[0])
            for start, end in weeks:
                mine = [r for r in rows if r[8] > start and r[7] < end and (r[7] < start or r[8] > end)]
                sums, has_buckets = self._bucket_sums(conn, [r[0] for r in mine], start, end)
                split = []
                for r in mine:
                    job_id, busy, util_n, gr_n = r[0], r[_NCOLS], r[_NCOLS + 1], r[_NCOLS + 2]
                    split.append(
                        _split(
                            _job_week(r[:_NCOLS], "inside", 1.0),
                            start,
                            end,
                            busy=busy,
                            busy_samples={"gpu_util": util_n, "gr_engine_active": gr_n},
                            sums=sums.get(job_id, {}),
                            has_buckets=job_id in has_buckets,
                        )
                    )
                out.append(split)
        return out

    def _bucket_sums(
        self, conn: sa.Connection, ids: Sequence[int], start: datetime, end: datetime
    ) -> tuple[dict[int, dict[str, tuple[float, int]]], set[int]]:
        """Per job and metric, (sum, count) of its buckets starting in the week; and which of
        the jobs still have any bucket at all."""
        sums: dict[int, dict[str, tuple[float, int]]] = {}
        present: set[int] = set()
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = list(ids[i : i + _IN_CHUNK])
            q = (
                sa.select(_b.job_id, _b.metric, sa.func.sum(_b.total), sa.func.sum(_b.count))
                .where(_b.job_id.in_(chunk), _b.start >= start, _b.start < end, _b.metric.in_(_SPLIT_METRICS))
                .group_by(_b.job_id, _b.metric)
            )
            for job_id, metric, total, count in conn.execute(q):
                sums.setdefault(job_id, {})[metric] = (float(total or 0.0), int(count or 0))
            exists = sa.select(_s.job_id).where(_s.job_id.in_(chunk), sa.exists().where(_b.job_id == _s.job_id))
            present.update(conn.execute(exists).scalars())
        return sums, present

    def week_jobs(
        self,
        start: datetime,
        end: datetime,
        *,
        cluster: str | None = None,
        teams: Sequence[str] | None = None,
        job_ids: Iterable[int] | None = None,
        crossing: Sequence[JobWeek] | None = None,
    ) -> Iterator[JobWeek]:
        """Every job overlapping the week (or those of ``job_ids``) with its share, by job id.

        ``crossing``: the week's :meth:`crossing_jobs` when the caller has them already."""
        if crossing is None:
            crossing = self.crossing_jobs(start, end, cluster=cluster, teams=teams)
        by_id = {j.job_id: j for j in crossing}
        q = sa.select(*self._job_columns()).where(_s.end > start, _s.start < end)
        q = self._scope(q, cluster, teams)
        if job_ids is not None:
            wanted = list(job_ids)
            if not wanted:
                return
            q = q.where(_s.job_id.in_(wanted))
        q = q.order_by(_s.job_id)
        with self.store.reading("read the week's jobs") as conn:
            result = conn.execution_options(yield_per=5000).execute(q)
            for r in result:
                j = by_id.get(r[0])
                yield j if j is not None else _job_week(r, "inside", 1.0)

    def top_waste_ids(
        self,
        start: datetime,
        end: datetime,
        n: int,
        *,
        cluster: str | None = None,
        teams: Sequence[str] | None = None,
        by: str = "waste_gpu_hours",
    ) -> list[int]:
        """Ids of the ``n`` most wasteful jobs *inside* the week per team (SQL window function);
        the caller merges them with the split boundary jobs. ``by="recoverable_gpu_hours"``
        ranks by the MFU gap instead (the jobs with the most recoverable GPU-hours)."""
        if n <= 0:
            return []
        col = {"waste_gpu_hours": _s.waste_gpu_hours, "recoverable_gpu_hours": _s.recoverable_gpu_hours}[by]
        rank = sa.func.row_number().over(partition_by=_s.team, order_by=(col.desc(), _s.job_id))
        # the gap list holds only jobs with some gap; the waste list every measured job, as before
        wanted = col.is_not(None) if by == "waste_gpu_hours" else col > 0
        ranked = sa.select(_s.job_id, rank.label("rk")).where(_s.start >= start, _s.end <= end, _s.end > start, wanted)
        inner = self._scope(ranked, cluster, teams).subquery()
        q = sa.select(inner.c.job_id).where(inner.c.rk <= n)
        with self.store.reading(f"rank the week's jobs by {by}") as conn:
            return [int(x) for x in conn.execute(q).scalars()]

    def advice(self, job_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """First finding (code, message) of each job: why the verdict, and what to try."""
        out: dict[int, tuple[str, str]] = {}
        if not job_ids:
            return out
        code = _s.data[("findings", 0, "code")].as_string()
        msg = _s.data[("findings", 0, "message")].as_string()
        with self.store.reading("read findings") as conn:
            for i in range(0, len(job_ids), _IN_CHUNK):
                q = sa.select(_s.job_id, code, msg).where(_s.job_id.in_(list(job_ids[i : i + _IN_CHUNK])))
                for job_id, c, m in conn.execute(q):
                    out[int(job_id)] = (c or "", m or "")
        return out

    def teams(self, start: datetime, end: datetime, *, cluster: str | None = None) -> list[str]:
        """Teams with at least one job overlapping ``[start, end)``."""
        q = sa.select(_s.team).where(_s.end > start, _s.start < end).distinct()
        if cluster is not None:
            q = q.where(self._in_cluster(cluster))
        with self.store.reading("list teams") as conn:
            return sorted(t for t in conn.execute(q).scalars() if t is not None)

    def actions(self, start: datetime, end: datetime, *, cluster: str | None = None) -> dict[str, dict[str, int]]:
        """Policy actions carried out in ``[start, end)``: team → action → count.

        Read from ``policy_actions`` (migration 0002, the policies feature; every opened store
        has it). Only actions that took effect (state ``done``) count; the team is the job's (its
        namespace when the job has none).
        """
        a = policy_actions
        with self.store.reading("read policy actions") as conn:
            team = sa.func.coalesce(sa.func.nullif(_jobs.c.team, ""), a.c.namespace)
            q = (
                sa.select(team, a.c.action, sa.func.count())
                .select_from(
                    a.outerjoin(
                        _jobs,
                        sa.and_(
                            _jobs.c.cluster == a.c.cluster,
                            _jobs.c.namespace == a.c.namespace,
                            _jobs.c.kind == a.c.kind,
                            _jobs.c.name == a.c.name,
                        ),
                    )
                )
                .where(a.c.state == "done", a.c.created_at >= start, a.c.created_at < end)
                .group_by(team, a.c.action)
            )
            if cluster is not None:
                q = q.where(a.c.cluster == cluster)
            out: dict[str, dict[str, int]] = {}
            for t, action, n in conn.execute(q):
                out.setdefault(str(t), {})[str(action)] = int(n)
            return out

    # ------------------------------------------------------------------ deliveries

    def claim(
        self,
        *,
        dedup_key: str,
        cluster: str,
        week: str,
        team: str,
        channel: str,
        now: datetime,
        holder: str,
        claim_timeout: timedelta,
        max_attempts: int,
    ) -> bool:
        """Take the right to send one delivery; False when it is sent, or another sender holds
        it (claimed less than ``claim_timeout`` ago), or it failed ``max_attempts`` times.

        Atomic on both databases: an ``INSERT .. ON CONFLICT DO NOTHING``, then, for an existing
        row, one conditional ``UPDATE`` whose row count says who won.
        """
        if len(dedup_key) > 700:
            raise BadInput(f"report delivery key too long ({len(dedup_key)} > 700 characters)")
        ins = self.store.insert(deliveries).values(
            dedup_key=dedup_key,
            cluster=cluster,
            week=week,
            team=team,
            channel=channel,
            status="claimed",
            attempts=1,
            claimed_at=now,
            claimed_by=holder,
            detail={},
        )
        claim = ins.on_conflict_do_nothing(index_elements=["dedup_key"]).returning(_d.id)
        stale = now - claim_timeout
        retake = (
            sa.update(deliveries)
            .where(
                _d.dedup_key == dedup_key,
                _d.attempts < max_attempts,
                sa.or_(_d.status == "failed", sa.and_(_d.status == "claimed", _d.claimed_at <= stale)),
            )
            .values(status="claimed", attempts=_d.attempts + 1, claimed_at=now, claimed_by=holder, error=None)
        )
        with self.store.writing(f"claim report delivery {dedup_key}") as conn:
            if conn.execute(claim).first() is not None:
                return True
            return conn.execute(retake).rowcount == 1

    def finish(
        self,
        dedup_key: str,
        *,
        ok: bool,
        now: datetime,
        holder: str,
        error: str | None,
        detail: dict,
        unconfirmed: bool = False,
    ) -> None:
        """Record the outcome of a claimed delivery (only while ``holder`` still holds it);
        ``unconfirmed`` (sent, no answer, not to be resent) is final like ``sent``."""
        values: dict[str, Any] = {
            "status": "sent" if ok else ("unconfirmed" if unconfirmed else "failed"),
            "error": error,
            "detail": json.loads(json.dumps(detail, default=str)),
        }
        if ok:
            values["sent_at"] = now
        stmt = sa.update(deliveries).where(_d.dedup_key == dedup_key, _d.claimed_by == holder, _d.status == "claimed")
        with self.store.writing(f"record report delivery {dedup_key}") as conn:
            conn.execute(stmt.values(**values))

    def deliveries(self, *, cluster: str | None = None, week: str | None = None) -> list[dict]:
        """The ledger's rows (for tests, ``doctor`` and operators), oldest first."""
        q = sa.select(deliveries).order_by(_d.id)
        if cluster is not None:
            q = q.where(_d.cluster == cluster)
        if week is not None:
            q = q.where(_d.week == week)
        with self.store.reading("read report deliveries") as conn:
            return [dict(r) for r in conn.execute(q).mappings()]


# ---------------------------------------------------------------------- splitting (pure)


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def mfu_sums(hours: Any) -> list[Any]:
    """The MFU sums of :class:`Group`, in its field order (``hours``: GPU-hours, nulls as 0):
    GPU-hours × MFU, GPU-hours with an MFU, recoverable GPU-hours, GPU-hours and jobs with a
    reference. The console's reads sum the same columns the same way."""
    mfu, rec = _s.mfu_estimate, _s.recoverable_gpu_hours
    return [
        sa.func.sum(sa.case((mfu.is_not(None), hours * mfu), else_=0.0)),
        sa.func.sum(sa.case((mfu.is_not(None), hours), else_=0.0)),
        sa.func.sum(sa.func.coalesce(rec, 0.0)),
        sa.func.sum(sa.case((rec.is_not(None), hours), else_=0.0)),
        sa.func.sum(sa.case((rec.is_not(None), 1), else_=0)),
    ]


#: the number of :meth:`ReportStore._job_columns`
_NCOLS = 18


def _job_week(r: Sequence[Any], split: str, fraction: float) -> JobWeek:
    job_id, cluster, namespace, job, team, verdict, model, start, end, gh, waste, sm, tensor, cov = r[:14]
    mfu, ref, cls, rec = r[14:_NCOLS]
    return JobWeek(
        job_id=int(job_id),
        cluster=cluster,
        namespace=namespace,
        job=job or "",
        team=team or "",
        verdict=verdict,
        gpu_model=model or "",
        start=start,
        end=end,
        split=split,
        fraction=fraction,
        gpu_hours=float(gh or 0.0) * fraction,
        sm_active=_f(sm),
        tensor_active=_f(tensor),
        waste_gpu_hours=None if waste is None else float(waste) * fraction,
        coverage=_f(cov),
        mfu_estimate=_f(mfu),
        mfu_reference=_f(ref),
        mfu_class=cls,
        recoverable_gpu_hours=None if rec is None else float(rec) * fraction,
    )


def _split(
    whole: JobWeek,
    start: datetime,
    end: datetime,
    *,
    busy: str | None,
    busy_samples: dict[str, int | None],
    sums: dict[str, tuple[float, int]],
    has_buckets: bool,
) -> JobWeek:
    """``whole`` (the job's full figures) cut down to its share of ``[start, end)``."""
    full_hours = whole.gpu_hours
    full_waste = whole.waste_gpu_hours
    full_rec = whole.recoverable_gpu_hours
    signal = busy if busy in _BUSY else next((m for m in _BUSY if busy_samples.get(m)), None)
    total_n = busy_samples.get(signal) if signal else None
    if has_buckets and signal and total_n:
        in_n = sums.get(signal, (0.0, 0))[1]
        fraction = max(0.0, min(1.0, in_n / total_n))
        whole.split = "rollup"
        sm_sum = sums.get("sm_active")
        tensor_sum = sums.get("tensor_active")
        if sm_sum and sm_sum[1]:
            whole.sm_active = sm_sum[0] / sm_sum[1]
        if tensor_sum and tensor_sum[1]:
            whole.tensor_active = tensor_sum[0] / tensor_sum[1]
        hours = full_hours * fraction
        if full_waste is None:
            waste = None
        elif sm_sum and sm_sum[1]:
            waste = hours * (1.0 - max(0.0, min(1.0, whole.sm_active or 0.0)))
        else:
            waste = full_waste * fraction
    else:
        span = (whole.end - whole.start).total_seconds()
        overlap = (min(whole.end, end) - max(whole.start, start)).total_seconds()
        fraction = max(0.0, min(1.0, overlap / span)) if span > 0 else (1.0 if start <= whole.start < end else 0.0)
        whole.split = "time"
        hours = full_hours * fraction
        waste = None if full_waste is None else full_waste * fraction
    whole.fraction = fraction
    whole.gpu_hours = hours
    whole.waste_gpu_hours = waste
    whole.recoverable_gpu_hours = None if full_rec is None else full_rec * fraction
    return whole
