"""Week aggregates → the report document (the JSON every format renders). Pure: no I/O.

The document is the single source of every number: HTML, CSV, Markdown and Slack all format
the same rounded values (:func:`fmt_hours`, :func:`fmt_ratio`, :func:`fmt_money`), so a figure
reads the same in every format. Definitions (docs/reports.md has the user-facing version):

- ``gpu_hours``: GPU-hours allocated in the week (MIG slices as fractions, shared GPUs divided).
- ``measured_gpu_hours`` / ``unmeasured_gpu_hours``: GPU-hours of jobs with / without a waste
  figure (no SM activity, or SM activity on only part of the job's GPUs). Missing is never zero:
  unmeasured hours are neither efficient nor wasted, they are their own column.
- ``sm_active_gpu_hours``: measured GPU-hours × SM activity (per GPU); ``efficiency`` is
  ``sm_active_gpu_hours / measured_gpu_hours`` (the GPU-hour-weighted SM activity), null when
  nothing was measured.
- ``waste_gpu_hours``: the flagged jobs' (auditor/core/figures.py: a wasteful verdict) measured
  GPU-hours × (1 − SM activity); ``headroom_gpu_hours`` the same for ``healthy`` jobs, never
  called waste; ``flagged_jobs`` counts the flagged jobs. ``waste_cost`` prices the waste, and
  ``cost`` prices all allocated GPU-hours, at the GPU model's price per GPU-hour. The per-job
  ``waste_gpu_hours`` of a top-list entry is that job's idle-SM share; the "most wasteful" list
  holds flagged jobs only.
- ``tensor_active_gpu_hours``: GPU-hours × tensor-pipe activity, over jobs that report it.
- ``mfu``: the GPU-hour-weighted MFU estimate of the jobs that have one (``mfu_gpu_hours`` over
  ``mfu_measured_gpu_hours``), relative to each precision's dense tensor peak (a MIG slice: the
  slice's share); jobs without tensor activity have no estimate and are left out, never counted
  as 0. ``mfu_histogram``: those jobs per 5 % MFU bin (jobs and GPU-hours), the distribution
  behind the weighted figure.
- ``recoverable_gpu_hours``: the MFU gap, summed over the ``referenced_jobs`` whose workload class
  (or lineage's own best run) gives a reference MFU: ``gpu_hours × max(0, 1 − mfu / reference)``,
  the GPU-hours the same work would not have needed at the reference. A second kind of loss,
  never added to waste: waste is time the SMs sat idle, the gap is busy time spent below the
  reference. ``recoverable_cost`` prices it.
- ``queue_wait_median_s`` / ``queue_wait_p90_s``: over the ``admitted_jobs`` that Kueue first
  admitted in the week, the time from their Workload's creation to that admission (Kueue's
  ``Admitted`` condition); null when none was admitted through a Kueue queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from auditor.core.admission import format_wait, quantile
from auditor.core.figures import Figures, counted_waste, is_flagged
from auditor.core.job_summary import rfc3339
from auditor.core.model import Verdict
from auditor.errors import BadInput

SCHEMA = "gpu-auditor/weekly-report"
SCHEMA_VERSION = 1
VERDICTS: tuple[str, ...] = tuple(v.value for v in Verdict)
#: name used for the whole cluster in deliveries and files
ALL_TEAMS = "*"

#: the MFU distribution's bins (as :data:`auditor.store.reports.MFU_BINS`): 5 % wide
MFU_BINS = 20

HOURS_DIGITS = 3
RATIO_DIGITS = 4
MONEY_DIGITS = 2
WAIT_DIGITS = 1


@dataclass(frozen=True)
class Prices:
    """Price of one GPU-hour per GPU model (``default`` for models not listed; 0: no costs)."""

    per_model: Mapping[str, float] = field(default_factory=dict)
    default: float = 0.0
    currency: str = "USD"

    def __post_init__(self) -> None:
        for model, price in {**self.per_model, "default": self.default}.items():
            if not isinstance(price, (int, float)) or isinstance(price, bool) or price < 0 or price != price:
                raise BadInput(f"reports.prices: price of {model!r} must be a non-negative number, got {price!r}")

    def of(self, model: str) -> float:
        """Price per GPU-hour of ``model``; a job on several models gets the default."""
        return float(self.per_model.get(model, self.default))

    def as_json(self) -> dict[str, Any]:
        return {"currency": self.currency, "default": self.default, "per_model": dict(sorted(self.per_model.items()))}


def _round(v: float | None, nd: int) -> float | None:
    if v is None:
        return None
    r = round(float(v), nd)
    return 0.0 if r == 0 else r  # no "-0.0"


@dataclass
class Totals:
    """Running sums for one team (or the cluster) in one week: :class:`~auditor.core.figures.Figures`
    (the one definition of waste, headroom, efficiency, MFU and the gap) plus the report's costs,
    tensor hours, verdict counts and MFU bins."""

    figures: Figures = field(default_factory=Figures)
    tensor_active_gpu_hours: float = 0.0
    cost: float = 0.0
    waste_cost: float = 0.0
    recoverable_cost: float = 0.0
    referenced_gpu_hours: float = 0.0
    verdicts: dict[str, int] = field(default_factory=dict)
    #: MFU bin → [jobs, GPU-hours]
    mfu_bins: dict[int, list[float]] = field(default_factory=dict)

    @property
    def jobs(self) -> int:
        return self.figures.jobs

    @property
    def gpu_hours(self) -> float:
        return self.figures.gpu_hours

    @property
    def waste_gpu_hours(self) -> float:
        return self.figures.waste_gpu_hours

    @property
    def recoverable_gpu_hours(self) -> float:
        return self.figures.recoverable_gpu_hours

    @property
    def referenced_jobs(self) -> int:
        return self.figures.referenced_jobs

    def add(self, g: Any, prices: Prices) -> None:
        """Add one :class:`auditor.store.reports.Group` (or anything with its fields)."""
        price = prices.of(g.gpu_model)
        self.figures.add_group(g)
        self.tensor_active_gpu_hours += g.tensor_active_gpu_hours
        self.cost += g.gpu_hours * price
        self.waste_cost += counted_waste(g.verdict, g.waste_gpu_hours) * price
        self.recoverable_cost += g.recoverable_gpu_hours * price
        self.referenced_gpu_hours += g.referenced_gpu_hours
        self.verdicts[g.verdict] = self.verdicts.get(g.verdict, 0) + g.jobs

    def add_bin(self, b: Any) -> None:
        """Add one :class:`auditor.store.reports.MfuBin` (jobs and GPU-hours of one MFU bin)."""
        cell = self.mfu_bins.setdefault(int(b.bin), [0, 0.0])
        cell[0] += b.jobs
        cell[1] += b.gpu_hours

    def as_json(self) -> dict[str, Any]:
        f = self.figures
        return {
            "jobs": f.jobs,
            "flagged_jobs": f.flagged,
            "gpu_hours": _round(f.gpu_hours, HOURS_DIGITS),
            "measured_gpu_hours": _round(f.measured_gpu_hours, HOURS_DIGITS),
            "unmeasured_gpu_hours": _round(f.unmeasured_gpu_hours, HOURS_DIGITS),
            "sm_active_gpu_hours": _round(f.sm_active_gpu_hours, HOURS_DIGITS),
            "tensor_active_gpu_hours": _round(self.tensor_active_gpu_hours, HOURS_DIGITS),
            "efficiency": _round(f.efficiency, RATIO_DIGITS),
            "waste_gpu_hours": _round(f.waste_gpu_hours, HOURS_DIGITS),
            "headroom_gpu_hours": _round(f.headroom_gpu_hours, HOURS_DIGITS),
            "cost": _round(self.cost, MONEY_DIGITS),
            "waste_cost": _round(self.waste_cost, MONEY_DIGITS),
            "mfu": _round(f.mfu, RATIO_DIGITS),
            "mfu_measured_gpu_hours": _round(f.mfu_measured_gpu_hours, HOURS_DIGITS),
            # no job with a reference: the gap is not known, not 0
            "recoverable_gpu_hours": _round(self.recoverable_gpu_hours, HOURS_DIGITS) if self.referenced_jobs else None,
            "recoverable_cost": _round(self.recoverable_cost, MONEY_DIGITS) if self.referenced_jobs else None,
            "referenced_jobs": self.referenced_jobs,
            "referenced_gpu_hours": _round(self.referenced_gpu_hours, HOURS_DIGITS),
            "mfu_histogram": [
                {
                    "lo": _round(k / MFU_BINS, RATIO_DIGITS),
                    "hi": _round((k + 1) / MFU_BINS, RATIO_DIGITS),
                    "jobs": int(n),
                    "gpu_hours": _round(h, HOURS_DIGITS),
                }
                for k, (n, h) in sorted(self.mfu_bins.items())
            ],
            "verdicts": {v: self.verdicts.get(v, 0) for v in _verdict_order(self.verdicts)},
        }


def _verdict_order(seen: Mapping[str, int]) -> list[str]:
    return list(VERDICTS) + sorted(v for v in seen if v not in VERDICTS)


#: the figures of a totals object, in table order: (key, label, kind)
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "int"),
    ("gpu_hours", "GPU-hours", "hours"),
    ("sm_active_gpu_hours", "SM-active GPU-h", "hours"),
    ("tensor_active_gpu_hours", "tensor-active GPU-h", "hours"),
    ("efficiency", "efficiency", "ratio"),
    ("queue_wait_median_s", "queue wait median", "wait"),
    ("queue_wait_p90_s", "queue wait p90", "wait"),
    ("waste_gpu_hours", "waste GPU-h", "hours"),
    ("headroom_gpu_hours", "healthy jobs' headroom GPU-h", "hours"),
    ("waste_cost", "waste cost", "money"),
    ("mfu", "MFU", "ratio"),
    ("recoverable_gpu_hours", "recoverable GPU-h", "hours"),
    ("recoverable_cost", "recoverable cost", "money"),
    ("unmeasured_gpu_hours", "unmeasured GPU-h", "hours"),
    ("cost", "cost", "money"),
)


def priced(report: Mapping[str, Any]) -> bool:
    """Whether the report has prices: without any, its costs are not figures (a "0.00 USD" would
    read as free GPUs), so the renderings leave their columns out; the JSON keeps the fields."""
    p = report.get("prices") or {}
    return bool(p.get("default") or any((p.get("per_model") or {}).values()))


def shown_figures(report: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """:data:`FIGURES` as a rendering shows them: the money ones only when :func:`priced`."""
    return FIGURES if priced(report) else tuple(f for f in FIGURES if f[2] != "money")


def fmt_hours(v: float | None) -> str:
    return "–" if v is None else f"{v:,.{HOURS_DIGITS}f}".replace(",", " ")


def fmt_ratio(v: float | None) -> str:
    """A ratio as a percentage with the digits the document keeps (0.4567 → 45.67 %)."""
    return "–" if v is None else f"{v * 100:.{RATIO_DIGITS - 2}f} %"


def fmt_money(v: float | None, currency: str = "") -> str:
    if v is None:
        return "–"
    s = f"{v:,.{MONEY_DIGITS}f}".replace(",", " ")
    return f"{s} {currency}".strip()


def fmt(kind: str, v: Any, currency: str = "") -> str:
    """Format a document value of ``kind`` (int, hours, ratio, money) for people."""
    if kind == "int":
        return "–" if v is None else str(int(v))
    if kind == "hours":
        return fmt_hours(v)
    if kind == "ratio":
        return fmt_ratio(v)
    if kind == "money":
        return fmt_money(v, currency)
    if kind == "wait":
        return format_wait(v)
    return "–" if v is None else str(v)


# ---------------------------------------------------------------------- building


@dataclass
class WeekData:
    """What the store returned for one week: groups, policy actions, ranked jobs."""

    week: str
    start: datetime
    end: datetime
    groups: Sequence[Any]
    actions: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: JobWeek rows that are candidates for the top lists, with (code, message) advice
    top_candidates: Sequence[Any] = ()
    advice: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    #: per team, the Kueue queue waits (seconds) of the jobs first admitted in the week
    queue_waits: Mapping[str, Sequence[float]] = field(default_factory=dict)
    #: per top-list job id, its lineage's history (:func:`lineage_brief`) when it has one
    lineages: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    #: the jobs with an MFU estimate per team and MFU bin (:class:`auditor.store.reports.MfuBin`)
    mfu_bins: Sequence[Any] = ()


def queue_wait(waits: Sequence[float]) -> dict[str, Any]:
    """The queue-wait figures of a team (or the cluster): jobs admitted, median and p90 wait."""
    return {
        "admitted_jobs": len(waits),
        "queue_wait_median_s": _round(quantile(waits, 0.5), WAIT_DIGITS),
        "queue_wait_p90_s": _round(quantile(waits, 0.9), WAIT_DIGITS),
    }


def job_json(j: Any, prices: Prices, advice: tuple[str, str] | None) -> dict[str, Any]:
    """One job's in-week figures (the per-job CSV row and a top-list entry)."""
    price = prices.of(j.gpu_model)
    waste, rec = j.waste_gpu_hours, j.recoverable_gpu_hours
    return {
        "cluster": j.cluster,
        "namespace": j.namespace,
        "job": j.job,
        "team": j.team,
        "gpu_model": j.gpu_model or None,
        "verdict": j.verdict,
        "start": rfc3339(j.start),
        "end": rfc3339(j.end),
        "split": j.split,
        "week_fraction": _round(j.fraction, RATIO_DIGITS),
        "gpu_hours": _round(j.gpu_hours, HOURS_DIGITS),
        "sm_active": _round(j.sm_active, RATIO_DIGITS),
        "tensor_active": _round(j.tensor_active, RATIO_DIGITS),
        "coverage": _round(j.coverage, RATIO_DIGITS),
        "waste_gpu_hours": _round(waste, HOURS_DIGITS),
        "waste_cost": None if waste is None else _round(waste * price, MONEY_DIGITS),
        "mfu_estimate": _round(j.mfu_estimate, RATIO_DIGITS),
        "mfu_reference": _round(j.mfu_reference, RATIO_DIGITS),
        "mfu_class": j.mfu_class,
        "recoverable_gpu_hours": _round(rec, HOURS_DIGITS),
        "recoverable_cost": None if rec is None else _round(rec * price, MONEY_DIGITS),
        "finding": advice[0] if advice else None,
        "advice": advice[1] if advice else None,
    }


def top_json(j: Any, prices: Prices, data: WeekData) -> dict[str, Any]:
    """A top-list entry: the job's figures, and its lineage's history when it has one (the gate
    judges re-submissions by it; the per-job CSV keeps its columns)."""
    out = job_json(j, prices, data.advice.get(j.job_id))
    lineage = data.lineages.get(j.job_id)
    if lineage is not None:
        out["lineage"] = dict(lineage)
    return out


def _top(jobs: Iterable[Any], n: int, by: str = "waste_gpu_hours") -> list[Any]:
    """The ``n`` jobs with the most ``by``: waste (flagged jobs only: a healthy job's idle-SM share
    is headroom, not waste, auditor/core/figures.py), or recoverable GPU-hours (jobs with some)."""
    if by == "waste_gpu_hours":
        ranked = [j for j in jobs if j.waste_gpu_hours is not None and is_flagged(j.verdict)]
    else:
        ranked = [j for j in jobs if getattr(j, by) is not None and getattr(j, by) > 0]
    ranked.sort(key=lambda j: (-getattr(j, by), j.job_id))
    return ranked[:n]


def build_report(
    current: WeekData,
    history: Sequence[WeekData],
    *,
    timezone: str,
    prices: Prices,
    generated_at: datetime,
    cluster: str | None = None,
    teams: Sequence[str] | None = None,
    top_n: int = 10,
    scope: str = "cluster",
) -> dict[str, Any]:
    """The report document for ``current`` with the trend over ``history`` (oldest first).

    ``teams`` lists the teams to report on; a team without jobs gets an honest empty entry
    (``jobs: 0``, efficiency null, a note), never a missing one. ``scope`` is ``cluster`` (the
    ``total`` is the whole cluster) or ``team`` (one team's report; ``total`` is that team).
    """
    weeks = list(history) + [current]
    names = sorted(set(teams) if teams is not None else {g.team for w in weeks for g in w.groups})

    def totals_by_team(data: WeekData) -> tuple[dict[str, Totals], Totals]:
        per: dict[str, Totals] = {t: Totals() for t in names}
        whole = Totals()
        for g in data.groups:
            if g.team in per:
                per[g.team].add(g, prices)
                whole.add(g, prices)
        for b in data.mfu_bins:
            if b.team in per:
                per[b.team].add_bin(b)
                whole.add_bin(b)
        return per, whole

    per_week = [totals_by_team(w) for w in weeks]

    def trend(team: str | None) -> list[dict[str, Any]]:
        out = []
        for w, (per, whole) in zip(weeks, per_week):
            t = (whole if team is None else per[team]).as_json()
            # A week without a recorded job has no figures: "no data", never 0 GPU-hours
            # (before the tool ran, or while it was down, nothing was measured).
            has = bool(t["jobs"])
            out.append(
                {
                    "week": w.week,
                    "jobs": t["jobs"],
                    "gpu_hours": t["gpu_hours"] if has else None,
                    "efficiency": t["efficiency"] if has else None,
                    "waste_gpu_hours": t["waste_gpu_hours"] if has else None,
                    "unmeasured_gpu_hours": t["unmeasured_gpu_hours"] if has else None,
                    "mfu": t["mfu"] if has else None,
                    "recoverable_gpu_hours": t["recoverable_gpu_hours"] if has else None,
                }
            )
        return out

    def actions_of(team: str | None) -> dict[str, int]:
        if team is not None:
            return dict(sorted(current.actions.get(team, {}).items()))
        acc: dict[str, int] = {}
        for t in names:
            for a, n in current.actions.get(t, {}).items():
                acc[a] = acc.get(a, 0) + n
        return dict(sorted(acc.items()))

    per_now, whole_now = per_week[-1]
    candidates = [j for j in current.top_candidates if j.team in per_now]
    team_docs = []
    for t in names:
        doc = {"team": t, **per_now[t].as_json(), **queue_wait(current.queue_waits.get(t, ()))}
        acts = actions_of(t)
        doc["actions"] = acts
        doc["actions_total"] = sum(acts.values())
        mine = [j for j in candidates if j.team == t]
        doc["top_jobs"] = [top_json(j, prices, current) for j in _top(mine, top_n)]
        doc["top_mfu_gap"] = [top_json(j, prices, current) for j in _top(mine, top_n, "recoverable_gpu_hours")]
        doc["trend"] = trend(t)
        doc["note"] = None if doc["jobs"] else f"No jobs of team {t} were recorded in {current.week}."
        team_docs.append(doc)
    total = {
        "team": ALL_TEAMS if scope == "cluster" else (names[0] if len(names) == 1 else ALL_TEAMS),
        **whole_now.as_json(),
        **queue_wait([w for t in names for w in current.queue_waits.get(t, ())]),
    }
    acts = actions_of(None)
    total["actions"] = acts
    total["actions_total"] = sum(acts.values())
    total["top_jobs"] = [top_json(j, prices, current) for j in _top(candidates, top_n)]
    total["top_mfu_gap"] = [top_json(j, prices, current) for j in _top(candidates, top_n, "recoverable_gpu_hours")]
    total["trend"] = trend(None)
    if scope == "team" and len(team_docs) == 1:
        total["note"] = team_docs[0]["note"]
    else:
        total["note"] = None if total["jobs"] else f"No jobs were recorded in {current.week}."
    return {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "scope": scope,
        "week": current.week,
        "timezone": timezone,
        "start": rfc3339(current.start),
        "end": rfc3339(current.end),
        "hours_in_week": round((current.end - current.start).total_seconds() / 3600.0, 3),
        "cluster": cluster,
        "generated_at": rfc3339(generated_at),
        "prices": prices.as_json(),
        "top_n": top_n,
        "total": total,
        "teams": team_docs,
    }


def team_view(report: Mapping[str, Any], team: str) -> dict[str, Any]:
    """One team's report cut from a cluster report (the same numbers; ``scope: team``)."""
    for t in report["teams"]:
        if t["team"] == team:
            return {**report, "scope": "team", "total": t, "teams": [t]}
    raise BadInput(f"team {team!r} is not in the {report['week']} report")


def mfu_headline(t: Mapping[str, Any]) -> str:
    """The MFU gap in one sentence, beside waste and never added to it (every rendering says it
    the same way): "At their class's reference MFU these 3 jobs would have needed 12.5 fewer
    GPU-hours ...". Never added because they overlap: a job's gap is measured over all of its
    GPU-hours, the idle ones included (``gpu_hours × (1 − mfu / reference)``)."""
    n = int(t.get("referenced_jobs") or 0)
    waste = fmt_hours(t.get("waste_gpu_hours"))
    if not n:
        return (
            "No job had a reference MFU (no workload class with a reference, no lineage history): "
            f"no recoverable GPU-hours are claimed. Waste (flagged jobs' SMs idle): {waste} GPU-h."
        )
    jobs = "this job" if n == 1 else f"these {n} jobs"
    return (
        f"At their class's reference MFU {jobs} would have needed {fmt_hours(t.get('recoverable_gpu_hours'))} fewer "
        f"GPU-hours (the MFU gap, of {fmt_hours(t.get('referenced_gpu_hours'))} GPU-h with a reference). "
        f"Waste (flagged jobs' SMs idle, {waste} GPU-h) is counted apart and never added to it: the gap also holds a job's idle time."
    )


#: the eight levels of a text sparkline, lowest first
_SPARK = "▁▂▃▄▅▆▇█"


def mfu_sparkline(hist: Sequence[Mapping[str, Any]]) -> str:
    """The MFU distribution as 20 characters, one per 5 % bin from 0 to 100 %, the height
    the bin's share of GPU-hours (a space: no job there); "" without any job with an MFU."""
    hours = [0.0] * MFU_BINS
    for b in hist:
        k = min(MFU_BINS - 1, max(0, round(float(b["lo"]) * MFU_BINS)))
        hours[k] += float(b.get("gpu_hours") or 0.0)
    top = max(hours)
    if top <= 0:
        return ""
    return "".join(" " if h <= 0 else _SPARK[min(7, int(h / top * 7.999))] for h in hours)


def lineage_note(job: Mapping[str, Any]) -> str:
    """`` (lineage ml/train: 5 runs, 3 low_sm_efficiency; acknowledged by alice)`` for a top-list
    entry with a lineage history, else ''."""
    lin = job.get("lineage")
    if not lin:
        return ""
    flagged = ", ".join(f"{n} {v}" for v, n in lin["verdicts"].items() if v != "healthy")
    ack = f"; acknowledged by {lin['acknowledged_by']}" if lin.get("acknowledged_by") else ""
    return f" (lineage {lin['lineage']}: {lin['runs']} runs" + (f", {flagged}" if flagged else "") + f"{ack})"
