"""What the operator is doing, as counts read from the store: ``gpu-auditor status`` prints
them and the operator's ``/metrics`` exports them (per team, verdict, action — never per job).

Each figure is one ``GROUP BY`` query, so the cost is bounded by the number of teams, policies
and action kinds, not by the number of jobs (10,000 jobs: one index range scan per figure).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from auditor.core import figures
from auditor.store.lineage_tables import lineage_acks, lineages
from auditor.store.policy_tables import actions, violations
from auditor.store.reports import deliveries
from auditor.store.store import Store
from auditor.store.tables import SUMMARIES

#: verdicts that say a job wastes its GPUs: one definition for every surface (auditor/core/figures.py)
FLAGGED = figures.FLAGGED


@dataclass
class StatusCounts:
    """The store's view of the operator at ``now``."""

    #: the latest audit run (``audit_runs`` row as a dict), or None before the first
    last_run: dict | None = None
    #: jobs seen since ``recent_since`` by (team, verdict): their count, GPU-hours, waste GPU-hours
    #: (None when none of them has SM data: missing is never 0), GPU-hours of those with SM data
    jobs: dict[tuple[str, str], tuple[int, float, float | None, float]] = field(default_factory=dict)
    #: open policy violations by (namespace, policy)
    open_violations: dict[tuple[str, str], int] = field(default_factory=dict)
    #: policy actions created or updated since ``since`` by (action, state)
    actions: dict[tuple[str, str], int] = field(default_factory=dict)
    #: alerts recorded as skipped since ``since`` by (namespace, why)
    undelivered: dict[tuple[str, str], int] = field(default_factory=dict)
    #: acknowledgements and snoozes in force at ``now``, by kind
    acks_active: dict[str, int] = field(default_factory=dict)
    #: report deliveries by (channel, status) of the weeks claimed since ``since``
    deliveries: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def flagged_jobs(self) -> int:
        return sum(row[0] for (_, v), row in self.jobs.items() if v in FLAGGED)


def operator_status(
    store: Store, *, now: datetime, since: datetime, recent_since: datetime, cluster: str | None = None
) -> StatusCounts:
    """The counts of :class:`StatusCounts`, for one cluster (None: every cluster in the store)."""
    out = StatusCounts()
    runs = store.runs(limit=1)
    out.last_run = runs[0] if runs else None
    s = SUMMARIES.c
    v, a, d = violations.c, actions.c, deliveries.c
    with store.reading("read the operator's status") as conn:

        def scoped(q: Any, col: Any) -> Any:
            return q if cluster is None else q.where(col == cluster)

        measured = sa.func.sum(sa.case((s.waste_gpu_hours.is_not(None), s.gpu_hours), else_=0.0))
        q = sa.select(
            s.team, s.verdict, sa.func.count(), sa.func.sum(s.gpu_hours), sa.func.sum(s.waste_gpu_hours), measured
        ).where(s.end >= recent_since)
        for team, verdict, n, hours, waste, with_sm in conn.execute(scoped(q, s.cluster).group_by(s.team, s.verdict)):
            out.jobs[(team or "", verdict)] = (
                int(n),
                float(hours or 0.0),
                None if waste is None else float(waste),
                float(with_sm or 0.0),
            )
        q = sa.select(v.namespace, v.policy, sa.func.count()).where(v.state == "open")
        for ns, policy, n in conn.execute(scoped(q, v.cluster).group_by(v.namespace, v.policy)):
            out.open_violations[(ns, policy)] = int(n)
        q = sa.select(a.action, a.state, sa.func.count()).where(a.updated_at >= since)
        for action, state, n in conn.execute(scoped(q, a.cluster).group_by(a.action, a.state)):
            out.actions[(action, state)] = int(n)
        # the reason of a skipped alert is in its result document: few rows (skipped notifies
        # since ``since``), counted here rather than in SQL's JSON dialects
        q = sa.select(a.namespace, a.result).where(a.updated_at >= since, a.state == "skipped", a.action == "notify")
        why: Counter[tuple[str, str]] = Counter()
        for ns, result in conn.execute(scoped(q, a.cluster)):
            why[(ns, str((result or {}).get("why") or "skipped"))] += 1
        out.undelivered = dict(why)
        la, lg = lineage_acks.c, lineages.c
        q = (
            sa.select(la.kind, sa.func.count())
            .select_from(lineage_acks.join(lineages, la.lineage_id == lg.id))
            .where(sa.or_(la.until.is_(None), la.until > now))
        )
        for kind, n in conn.execute(scoped(q, lg.cluster).group_by(la.kind)):
            out.acks_active[kind] = int(n)
        q = sa.select(d.channel, d.status, sa.func.count()).where(d.claimed_at >= since)
        for channel, status, n in conn.execute(scoped(q, d.cluster).group_by(d.channel, d.status)):
            out.deliveries[(channel, status)] = int(n)
    return out
