"""Retention: delete what has aged out of the store, for one cluster (or all) at a time.

Several clusters may share one store (DESIGN.md, "At scale"), each with its own operator and
its own ``store.retention`` settings; so a prune touches only the rows of the cluster it is
given and never another cluster's. ``cluster=None`` is the explicit "every cluster" of the
``gpu-auditor store prune --all-clusters`` command.

What goes, table by table (``b`` = ``now - retention.buckets``, ``s`` = ``now - retention.summaries``):

- ``gpu_buckets``: buckets that ended at or before ``b``, except those a running job's
  cumulative summary has not folded in yet (at or after its aggregate's ``through``, while the
  job has no ``ended_at``): the operator folds them on its next cycle, and deleting them first
  would drop them from the job's summary.
- ``gpu_pod_owners``: a job's ownership of a pod once none of its buckets of that pod is left
  (the store's own rule when another job takes a pod's GPU time over).
- ``job_summaries``: summaries whose job span ended at or before ``s`` (without a span: by
  ``computed_at``).
- ``job_aggregates``: those of jobs that ended at or before ``b`` (no cycle updates them again;
  the final summary stays), and those of jobs that go themselves.
- ``jobs``: jobs last seen at or before ``s`` with no bucket and no summary left.
- ``audit_runs``: runs finished at or before ``s``, but never the newest successful operator
  cycle of a cluster (its cursor: where the next cycle continues).
- ``policy_actions`` / ``policy_decisions`` / ``policy_violations``: the escalation record, by
  violation episode: an episode that closed (or, still open, last fired) at or before ``s`` goes
  with its decisions and actions once all of them are older than ``s`` and none is unfinished
  (claimed, waiting for a requeue's reactivation, reactivating). An open ladder keeps its
  history, so its dedup keys still stop a replayed step.
- ``report_deliveries``: the ledger rows claimed at or before ``s``, and never sooner than
  :data:`DELIVERY_FLOOR`: a week's delivery is due only until the next week's, so a row older
  than that can no longer stop a second sending.

Every predicate is chosen so that deleting table by table in this order removes exactly what a
count of each table on the untouched store finds: ``dry_run`` reports those counts and deletes
nothing, and the counts of a real prune are the same. One prune is one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from auditor.errors import BadInput
from auditor.store.decisions import DONE, FAILED, SKIPPED
from auditor.store.policy_tables import actions, decisions, violations
from auditor.store.reports import deliveries
from auditor.store.store import Store
from auditor.store.tables import AGGREGATES, AUDIT_RUNS, BUCKETS, JOBS, POD_OWNERS, SUMMARIES
from auditor.store.values import aware

_jobs, _buckets, _summaries, _runs, _aggregates, _owners = JOBS, BUCKETS, SUMMARIES, AUDIT_RUNS, AGGREGATES, POD_OWNERS

#: the ``detail.origin`` of an operator cycle's run (auditor.operator_loop.cycle.ORIGIN)
OPERATOR_ORIGIN = "operator"
#: action states after which nothing more happens to an action
FINAL_STATES = (DONE, FAILED, SKIPPED)
#: report deliveries are kept at least this long, whatever the retention (see the module doc)
DELIVERY_FLOOR = timedelta(days=14)

#: the tables a prune touches, in the order it deletes from them
TABLE_ORDER = (
    "gpu_buckets",
    "gpu_pod_owners",
    "job_summaries",
    "job_aggregates",
    "jobs",
    "audit_runs",
    "policy_actions",
    "policy_decisions",
    "policy_violations",
    "report_deliveries",
)


@dataclass(frozen=True)
class Retention:
    """How long the store keeps things: ``buckets`` for the rollup (and the aggregates of
    ended jobs), ``summaries`` for everything kept per job (summaries, jobs, audit runs, the
    escalation record, report deliveries)."""

    buckets: timedelta
    summaries: timedelta

    def __post_init__(self) -> None:
        for label, value in (("buckets", self.buckets), ("summaries", self.summaries)):
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise BadInput(f"store.retention.{label} must be positive, got {value}")

    @classmethod
    def from_settings(cls, settings: Any) -> "Retention":
        """From a :class:`~auditor.settings.Settings` (``store.retention``)."""
        r = settings.store.retention
        return cls(buckets=r.buckets, summaries=r.summaries)


@dataclass(frozen=True)
class PruneResult:
    """Rows deleted (or, with ``dry_run``, that would be) per table, in :data:`TABLE_ORDER`."""

    cluster: str | None
    now: datetime
    retention: Retention
    dry_run: bool
    deleted: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.deleted.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "now": self.now.isoformat(),
            "dry_run": self.dry_run,
            "bucket_cutoff": (self.now - self.retention.buckets).isoformat(),
            "summary_cutoff": (self.now - self.retention.summaries).isoformat(),
            "deleted": dict(self.deleted),
            "total": self.total,
        }


def prune(
    store: Store, now: datetime, retention: Retention, *, cluster: str | None, dry_run: bool = False
) -> PruneResult:
    """Delete (``dry_run``: count) what has aged out at ``now`` for ``cluster`` (None: every cluster).

    Raises :class:`~auditor.errors.StoreError` when the database fails; nothing is deleted then.
    """
    with store.checking("apply retention"):
        aware(now, "now")
    if cluster is not None and (not isinstance(cluster, str) or not cluster):
        raise BadInput(f"cluster must be a non-empty name or None (every cluster), got {cluster!r}")
    steps = _steps(
        now - retention.buckets, now - retention.summaries, now - max(retention.summaries, DELIVERY_FLOOR), cluster
    )
    deleted: dict[str, int] = {}
    what = "count what retention would delete" if dry_run else "apply retention"
    with store.reading(what) if dry_run else store.writing(what) as conn:
        for name, table, where in steps:
            if dry_run:
                deleted[name] = int(
                    conn.execute(sa.select(sa.func.count()).select_from(table).where(where)).scalar_one()
                )
            else:
                deleted[name] = int(conn.execute(sa.delete(table).where(where)).rowcount or 0)
    return PruneResult(cluster, now, retention, dry_run, deleted)


# ---------------------------------------------------------------------- predicates


def _steps(b_cut: datetime, s_cut: datetime, d_cut: datetime, cluster: str | None) -> list[tuple[str, sa.Table, Any]]:
    """(table name, table, WHERE of the rows to delete), in deletion order."""

    def scoped(col: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
        return sa.true() if cluster is None else col == cluster

    # Each EXISTS refers only to the query right around it: SQLAlchemy correlates no further out.

    def bucket_goes(b: Any) -> sa.ColumnElement[bool]:
        j, running, a = _jobs.alias(), _jobs.alias(), _aggregates.alias()
        unfolded = sa.and_(
            sa.exists().where(running.c.id == b.c.job_id, running.c.ended_at.is_(None)),
            sa.exists().where(a.c.job_id == b.c.job_id, a.c.through <= b.c.start),
        )
        return sa.and_(b.c.end <= b_cut, sa.exists().where(j.c.id == b.c.job_id, scoped(j.c.cluster)), ~unfolded)

    def owner_goes(o: Any) -> sa.ColumnElement[bool]:
        b = _buckets.alias()
        return sa.and_(
            scoped(o.c.cluster),
            ~sa.exists().where(
                b.c.job_id == o.c.job_id,
                b.c.pod_namespace == o.c.pod_namespace,
                b.c.pod_name == o.c.pod_name,
                ~bucket_goes(b),
            ),
        )

    def summary_goes(s: Any) -> sa.ColumnElement[bool]:
        return sa.and_(
            scoped(s.c.cluster),
            sa.or_(
                sa.and_(s.c.end.is_not(None), s.c.end <= s_cut), sa.and_(s.c.end.is_(None), s.c.computed_at <= s_cut)
            ),
        )

    def job_goes(j: Any) -> sa.ColumnElement[bool]:
        b, s = _buckets.alias(), _summaries.alias()
        return sa.and_(
            scoped(j.c.cluster),
            j.c.last_seen <= s_cut,
            ~sa.exists().where(b.c.job_id == j.c.id, ~bucket_goes(b)),
            ~sa.exists().where(s.c.job_id == j.c.id, ~summary_goes(s)),
        )

    def aggregate_goes(a: Any) -> sa.ColumnElement[bool]:
        j = _jobs.alias()
        ended = sa.and_(j.c.ended_at.is_not(None), j.c.ended_at <= b_cut)
        return sa.exists().where(j.c.id == a.c.job_id, scoped(j.c.cluster), sa.or_(ended, job_goes(j)))

    def run_goes(r: Any) -> sa.ColumnElement[bool]:
        k = _runs.alias()
        k_cluster = k.c.detail["cluster"].as_string()
        cursors = (  # each cluster's newest successful cycle: one pass over the runs, not one per run
            sa.select(sa.func.max(k.c.id))
            .where(k.c.detail["origin"].as_string() == OPERATOR_ORIGIN, k.c.status.like("ok%"), k_cluster.is_not(None))
            .group_by(k_cluster)
        )
        return sa.and_(r.c.finished <= s_cut, scoped(r.c.detail["cluster"].as_string()), r.c.id.not_in(cursors))

    # The escalation record has no index on its links (decision → violation, action → decision),
    # so its rules are sets computed once (uncorrelated IN), never a subquery per row.
    def live(x: Any) -> sa.ColumnElement[bool]:
        """An action something may still happen to, or that happened recently."""
        return sa.or_(x.c.state.not_in(FINAL_STATES), x.c.updated_at > s_cut)

    x1, d1, v1, d3 = actions.alias(), decisions.alias(), violations.alias(), decisions.alias()
    live_decisions = sa.select(x1.c.decision_id).where(live(x1), x1.c.decision_id.is_not(None))
    busy_violations = sa.select(d1.c.violation_id).where(  # a recent decision, or one with a live action
        d1.c.violation_id.is_not(None), sa.or_(d1.c.decided_at > s_cut, d1.c.id.in_(live_decisions))
    )

    def violation_goes(v: Any) -> sa.ColumnElement[bool]:
        return sa.and_(
            scoped(v.c.cluster),
            sa.func.coalesce(v.c.closed_at, v.c.last_seen_at) <= s_cut,
            v.c.id.not_in(busy_violations),
        )

    kept_violations = sa.select(v1.c.id).where(~violation_goes(v1))

    def decision_goes(d: Any) -> sa.ColumnElement[bool]:
        return sa.and_(
            scoped(d.c.cluster),
            d.c.decided_at <= s_cut,
            d.c.id.not_in(live_decisions),
            sa.or_(d.c.violation_id.is_(None), d.c.violation_id.not_in(kept_violations)),
        )

    kept_decisions = sa.select(d3.c.id).where(~decision_goes(d3))

    def action_goes(x: Any) -> sa.ColumnElement[bool]:
        return sa.and_(
            scoped(x.c.cluster),
            ~live(x),
            sa.or_(x.c.decision_id.is_(None), x.c.decision_id.not_in(kept_decisions)),
        )

    delivery_goes = sa.and_(
        scoped(deliveries.c.cluster), sa.func.coalesce(deliveries.c.sent_at, deliveries.c.claimed_at) <= d_cut
    )

    steps = [
        ("gpu_buckets", _buckets, bucket_goes(_buckets)),
        ("gpu_pod_owners", _owners, owner_goes(_owners)),
        ("job_summaries", _summaries, summary_goes(_summaries)),
        ("job_aggregates", _aggregates, aggregate_goes(_aggregates)),
        ("jobs", _jobs, job_goes(_jobs)),
        ("audit_runs", _runs, run_goes(_runs)),
        ("policy_actions", actions, action_goes(actions)),
        ("policy_decisions", decisions, decision_goes(decisions)),
        ("policy_violations", violations, violation_goes(violations)),
        ("report_deliveries", deliveries, delivery_goes),
    ]
    assert tuple(name for name, _, _ in steps) == TABLE_ORDER
    return steps
