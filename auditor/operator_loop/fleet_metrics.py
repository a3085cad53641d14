"""Per-team and cluster series on the operator's ``/metrics``: labels team, verdict, cluster,
action, state — never a job or a pod, so the number of series is bounded by teams × verdicts.

Two kinds, both written by the leader only (a standby exports none, so a sum over replicas
counts each hour once):

- counters accrued by each cycle (``gpu_auditor_gpu_hours_total`` …): a job's GPU-hours inside
  the cycle's window (its GPUs × its observed span in the window), and of those the hours
  without SM activity. ``increase(…[7d])`` is then a team's week, in Grafana or a recording
  rule, without the operator keeping any history; ``policy_actions_total`` counts the cycle's
  actions by outcome.
- gauges of the store's state at the cycle's end (:func:`auditor.store.status_queries.operator_status`:
  one ``GROUP BY`` per figure): jobs and efficiency of the jobs seen in the last hour by team,
  open violations, acknowledgements in force, report deliveries by status; and the gate's held
  Jobs, read from its controller at scrape time.

The MFU (issue 28) follows the same two kinds: ``gpu_auditor_mfu_gpu_hours_total`` (GPU-hours ×
MFU estimate) over ``gpu_auditor_mfu_measured_gpu_hours_total`` (GPU-hours of jobs with an
estimate) is a team's GPU-hour-weighted MFU over any range, and
``gpu_auditor_recoverable_gpu_hours_total`` accrues the MFU gap (the cycle's GPU-hours ×
max(0, 1 − MFU / reference), jobs with a reference only) beside the waste counter, never in it;
the gauges ``gpu_auditor_team_mfu`` and ``gpu_auditor_team_recoverable_gpu_hours`` say the same
of the team's jobs seen in the last hour (a team without an estimate, or without a reference,
has no sample: unknown, never 0).

Teams are labels from the cluster: past :data:`MAX_TEAMS` (by GPU-hours), the rest are summed
under ``team="_other"`` so a flood of namespaces cannot flood Prometheus.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from auditor.core.figures import Figures
from auditor.core.job_summary import JobSummary

log = logging.getLogger(__name__)

#: the most teams exported by name; the others are summed as ``_other``
MAX_TEAMS = 200
OTHER = "_other"
#: a job counts as "now" when its last sample is this recent at the cycle's end
RECENT = timedelta(hours=1)


def _overlap_hours(summary: Any, start: datetime, end: datetime) -> float:
    """GPU-hours of ``summary`` inside ``[start, end)``: its GPUs × its observed span there."""
    if summary.gpus is None or summary.start is None or summary.end is None:
        return 0.0
    seconds = (min(summary.end, end) - max(summary.start, start)).total_seconds()
    return max(seconds, 0.0) / 3600.0 * float(summary.gpus)


def _outcome(result: Any) -> str:
    if isinstance(result, dict):
        if result.get("skipped"):
            return "skipped"
        if isinstance(result.get("state"), str):
            return str(result["state"])
        if result.get("error") or result.get("ok") is False:
            return "failed"
    return "done"


class _Snapshot(Collector):
    """The gauges of the last cycle's store read, served as they were (no store read per scrape)."""

    def __init__(self, held: Callable[[], int | None]) -> None:
        self._lock = threading.Lock()
        self._families: list[GaugeMetricFamily] = []
        #: the gate's held Jobs now, or None without a running gate (set by the operator)
        self.held = held
        self.cluster = ""

    def replace(self, families: list[GaugeMetricFamily]) -> None:
        with self._lock:
            self._families = families

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            yield from self._families
        held = self.held()
        if held is not None:
            g = GaugeMetricFamily(
                "gpu_auditor_gate_held_jobs",
                "Jobs the efficiency gate holds now (its controller's view)",
                labels=["cluster"],
            )
            g.add_metric([self.cluster], held)
            yield g


class FleetMetrics:
    """The per-team and cluster series, in the operator's registry."""

    def __init__(self, registry: CollectorRegistry, *, held: Callable[[], int | None] = lambda: None) -> None:
        labels = ["cluster", "team", "verdict"]
        self.gpu_hours = Counter(
            "gpu_auditor_gpu_hours",
            "GPU-hours audited, by team and verdict (accrued per cycle)",
            labels,
            registry=registry,
        )
        self.waste_hours = Counter(
            "gpu_auditor_waste_gpu_hours",
            "GPU-hours with idle SMs (jobs with SM data), by team and verdict: waste is the flagged verdicts' "
            '(verdict!~"healthy|insufficient_data"), the healthy ones\' is headroom (docs/figures.md)',
            labels,
            registry=registry,
        )
        self.measured_hours = Counter(
            "gpu_auditor_sm_measured_gpu_hours",
            "GPU-hours of jobs with SM activity data: the denominator of efficiency",
            ["cluster", "team"],
            registry=registry,
        )
        self.mfu_hours = Counter(
            "gpu_auditor_mfu_gpu_hours",
            "GPU-hours x MFU estimate (relative to the precision's dense tensor peak) of jobs with an estimate: "
            "the numerator of the GPU-hour-weighted MFU",
            ["cluster", "team"],
            registry=registry,
        )
        self.mfu_measured_hours = Counter(
            "gpu_auditor_mfu_measured_gpu_hours",
            "GPU-hours of jobs with an MFU estimate (tensor activity): the denominator of the weighted MFU",
            ["cluster", "team"],
            registry=registry,
        )
        self.recoverable_hours = Counter(
            "gpu_auditor_recoverable_gpu_hours",
            "GPU-hours the MFU gap costs: hours x max(0, 1 - MFU / reference) of jobs whose workload class "
            "or lineage gives a reference MFU, by team and verdict (a separate loss from waste)",
            labels,
            registry=registry,
        )
        self.actions = Counter(
            "gpu_auditor_policy_actions",
            "Policy actions carried out by cycles, by action and outcome (done, skipped, failed, waiting)",
            ["cluster", "action", "outcome"],
            registry=registry,
        )
        self.snapshot = _Snapshot(held)
        registry.register(self.snapshot)
        self._teams: set[str] = set()

    def _team(self, team: str) -> str:
        if team in self._teams or len(self._teams) < MAX_TEAMS:
            self._teams.add(team)
            return team
        return OTHER

    def observe_cycle(self, cluster: str, window: Any, summaries: Iterable[Any], decisions: Iterable[Any]) -> None:
        """Accrue the cycle's GPU-hours and count its actions."""
        self.snapshot.cluster = cluster
        if window is not None:
            for s in sorted(summaries, key=lambda s: -(s.gpu_hours or 0.0)):
                hours = _overlap_hours(s, window.start, window.end)
                if hours <= 0:
                    continue
                team, verdict = self._team(s.team or ""), s.verdict.value
                self.gpu_hours.labels(cluster, team, verdict).inc(hours)
                sm = s.means.sm_active
                if sm is not None:
                    self.measured_hours.labels(cluster, team).inc(hours)
                    self.waste_hours.labels(cluster, team, verdict).inc(hours * (1.0 - min(max(sm, 0.0), 1.0)))
                self._observe_mfu(cluster, team, verdict, hours, s)
        for d in decisions:
            for action in d.actions:
                if action in d.results:
                    self.actions.labels(cluster, action, _outcome(d.results[action])).inc()

    def _observe_mfu(self, cluster: str, team: str, verdict: str, hours: float, s: JobSummary) -> None:
        """Accrue the cycle's MFU sums and MFU gap of one job (``hours``: its GPU-hours in the window)."""
        mfu, ref = s.mfu_estimate, s.mfu_reference
        if mfu is None:
            return
        mfu = min(max(float(mfu), 0.0), 1.0)
        self.mfu_hours.labels(cluster, team).inc(hours * mfu)
        self.mfu_measured_hours.labels(cluster, team).inc(hours)
        if ref is not None and ref > 0:
            self.recoverable_hours.labels(cluster, team, verdict).inc(hours * max(0.0, 1.0 - mfu / float(ref)))

    def observe_store(self, store: Any, cluster: str, now: datetime, *, since: datetime) -> None:
        """Refresh the gauges from the store (the cycle's end); a failed read keeps the last ones."""
        from auditor.store.console_queries import team_mfu
        from auditor.store.status_queries import operator_status

        try:
            st = operator_status(store, now=now, since=since, recent_since=now - RECENT, cluster=cluster)
            mfu = team_mfu(store, since=now - RECENT, cluster=cluster)
        except Exception as exc:  # noqa: BLE001 - metrics never fail a cycle
            log.warning("per-team metrics: could not read the store: %s", exc)
            return
        self.snapshot.replace(families(st, cluster, self._team) + mfu_families(mfu, cluster, self._team))


def families(st: Any, cluster: str, team_of: Callable[[str], str]) -> list[GaugeMetricFamily]:
    """The gauges of one :class:`~auditor.store.status_queries.StatusCounts`."""
    jobs = GaugeMetricFamily(
        "gpu_auditor_team_jobs",
        "Jobs seen in the last hour, by team and verdict",
        labels=["cluster", "team", "verdict"],
    )
    eff = GaugeMetricFamily(
        "gpu_auditor_team_efficiency",
        "SM activity of the team's jobs seen in the last hour, weighted by GPU-hours (jobs with SM data; docs/figures.md)",
        labels=["cluster", "team"],
    )
    per_team: dict[tuple[str, str], int] = {}
    sums: dict[str, Figures] = {}
    for (team, verdict), (n, hours, waste, with_sm) in st.jobs.items():
        key = (team_of(team), verdict)
        per_team[key] = per_team.get(key, 0) + n
        sums.setdefault(key[0], Figures()).add(
            verdict, jobs=n, gpu_hours=hours, measured_gpu_hours=with_sm, idle_gpu_hours=waste
        )
    for (team, verdict), n in sorted(per_team.items()):
        jobs.add_metric([cluster, team, verdict], n)
    for team, f in sorted(sums.items()):
        if f.efficiency is not None:  # the same figure as status, the report and the console
            eff.add_metric([cluster, team], f.efficiency)
    out = [jobs, eff]
    for name, doc, labels, values in (
        ("gpu_auditor_open_violations", "Open policy violations, by policy", ["policy"], _by(st.open_violations, 1)),
        ("gpu_auditor_lineage_acks", "Acknowledgements and snoozes in force, by kind", ["kind"], st.acks_active),
        (
            "gpu_auditor_policy_action_states",
            "Policy actions of the last 7 days by action and state as the store holds them (failed: a delivery or action that failed)",
            ["action", "state"],
            st.actions,
        ),
        (
            "gpu_auditor_report_deliveries",
            "Weekly report deliveries of the last 7 days, by channel and status (sent, failed, claimed)",
            ["channel", "status"],
            st.deliveries,
        ),
    ):
        g = GaugeMetricFamily(name, doc, labels=["cluster", *labels])
        for key, n in sorted(values.items()):
            g.add_metric([cluster, *(key if isinstance(key, tuple) else (key,))], n)
        out.append(g)
    return out


def mfu_families(
    per_team: dict[str, tuple[float, float, float, int]], cluster: str, team_of: Callable[[str], str]
) -> list[GaugeMetricFamily]:
    """The MFU gauges of the team's jobs seen in the last hour, from :func:`auditor.store.console_queries.team_mfu`
    (team → GPU-hours × MFU, GPU-hours with an MFU, recoverable GPU-hours, jobs with a reference)."""
    mfu = GaugeMetricFamily(
        "gpu_auditor_team_mfu",
        "MFU estimate of the team's jobs seen in the last hour, weighted by GPU-hours (jobs with tensor activity; "
        "relative to the precision's dense tensor peak)",
        labels=["cluster", "team"],
    )
    gap = GaugeMetricFamily(
        "gpu_auditor_team_recoverable_gpu_hours",
        "Recoverable GPU-hours (the MFU gap at the workload class's reference MFU) of the team's jobs seen in the "
        "last hour that have a reference",
        labels=["cluster", "team"],
    )
    sums: dict[str, list[float]] = {}
    for team, values in per_team.items():
        acc = sums.setdefault(team_of(team), [0.0, 0.0, 0.0, 0.0])
        for i, v in enumerate(values):
            acc[i] += v
    for team, (mfu_h, measured, rec, refs) in sorted(sums.items()):
        if measured > 0:
            mfu.add_metric([cluster, team], mfu_h / measured)
        if refs:
            gap.add_metric([cluster, team], rec)
    return [mfu, gap]


def _by(counts: dict[tuple[str, str], int], index: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, n in counts.items():
        out[key[index]] = out.get(key[index], 0) + n
    return out
