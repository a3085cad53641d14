"""Generate a week's report document from the store: the queries, then :mod:`.aggregate`.

Cost: one ``GROUP BY`` per week (this one and the four of the trend), one ranked query for the
top jobs, the split of the jobs crossing the week's bounds, and the policy actions. The per-job
rows (the per-job CSV) are streamed separately by :func:`iter_jobs`, never held in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterator, Mapping, Sequence

from auditor.core.identity import split_job
from auditor.render.lineage import has_history, lineage_brief
from auditor.reports.aggregate import Prices, WeekData, build_report, job_json
from auditor.reports.weeks import IsoWeek, zone
from auditor.store.admissions import AdmissionStore
from auditor.store.lineage import LineageHistoryReader
from auditor.store.reports import ReportStore
from auditor.store.store import Store

TREND_WEEKS = 4
#: the ranking of the second top list: the MFU gap
_GAP = "recoverable_gpu_hours"


@dataclass(frozen=True)
class ReportOptions:
    """What a report needs beyond the week: time zone, prices, list sizes, known teams."""

    timezone: str = "UTC"
    prices: Prices = field(default_factory=Prices)
    top_n: int = 10
    trend_weeks: int = TREND_WEEKS
    #: teams that always get a report, with or without jobs (besides every team seen lately)
    teams: tuple[str, ...] = ()
    cluster: str | None = None


def _week_data(
    rs: ReportStore,
    week: IsoWeek,
    opts: ReportOptions,
    teams: Sequence[str] | None,
    *,
    detail: bool,
    crossing: Sequence[Any],
) -> WeekData:
    start, end = week.bounds(zone(opts.timezone))
    groups = rs.week_groups(start, end, cluster=opts.cluster, teams=teams, by_model=detail, crossing=crossing)
    if not detail:
        return WeekData(str(week), start, end, groups)
    # the two top lists: the most waste (SMs idle) and the largest MFU gap (recoverable GPU-hours)
    inside_top = set(rs.top_waste_ids(start, end, opts.top_n, cluster=opts.cluster, teams=teams))
    inside_top |= set(rs.top_waste_ids(start, end, opts.top_n, cluster=opts.cluster, teams=teams, by=_GAP))
    inside = list(
        rs.week_jobs(start, end, cluster=opts.cluster, teams=teams, job_ids=sorted(inside_top), crossing=crossing)
    )
    candidates = inside + [j for j in crossing if j.waste_gpu_hours is not None or j.recoverable_gpu_hours]
    # only the jobs that can make a top list need their findings
    by_team: dict[str, list[Any]] = {}
    for j in candidates:
        by_team.setdefault(j.team, []).append(j)
    keep: dict[int, Any] = {}
    for lst in by_team.values():
        wasted = sorted((j for j in lst if j.waste_gpu_hours is not None), key=lambda j: (-j.waste_gpu_hours, j.job_id))
        gap = sorted(
            (j for j in lst if (j.recoverable_gpu_hours or 0) > 0), key=lambda j: (-j.recoverable_gpu_hours, j.job_id)
        )
        keep.update((j.job_id, j) for j in wasted[: opts.top_n] + gap[: opts.top_n])
    kept = sorted(keep.values(), key=lambda j: j.job_id)
    advice = rs.advice([j.job_id for j in kept])
    actions = rs.actions(start, end, cluster=opts.cluster)
    waits = AdmissionStore(rs.store).week_waits(start, end, cluster=opts.cluster, teams=teams)
    lineages = lineage_briefs(rs.store, kept, end)
    bins = rs.mfu_bins(start, end, cluster=opts.cluster, teams=teams, crossing=crossing)
    return WeekData(str(week), start, end, groups, actions, kept, advice, waits, lineages, bins)


def lineage_briefs(store: Store, jobs: Sequence[Any], now: datetime) -> dict[int, dict[str, Any]]:
    """The lineage history of each top-list job whose lineage has one (other runs or
    acknowledgements), as of the week's end: two indexed reads per job, for ``top_n`` jobs a team."""
    reader = LineageHistoryReader(store)
    out: dict[int, dict[str, Any]] = {}
    for j in jobs:
        try:
            kind, name = split_job(str(j.job))
        except ValueError:  # a summary stored without its job (before 0005's columns): no lineage to look up
            continue
        history = reader.history_of_job(j.namespace, kind, name, j.cluster, now)
        if history is not None and has_history(history):
            out[j.job_id] = lineage_brief(history, now)
    return out


def generate(
    store: Store,
    week: IsoWeek,
    *,
    now: datetime,
    options: ReportOptions | None = None,
    team: str | None = None,
) -> dict[str, Any]:
    """The report document of ``week``: every team (and the cluster total), or one ``team``.

    Teams reported: those with jobs in this week or the trend's weeks, plus ``options.teams``;
    with ``team`` just that one, with or without jobs (an empty report says so).
    """
    opts = options or ReportOptions()
    rs = ReportStore(store)
    only = [team] if team is not None else None
    tz = zone(opts.timezone)
    weeks = [week.shift(-k) for k in range(opts.trend_weeks, -1, -1)]  # oldest first, this week last
    crossing = rs.crossing_jobs_of([w.bounds(tz) for w in weeks], cluster=opts.cluster, teams=only)
    history = [_week_data(rs, w, opts, only, detail=False, crossing=c) for w, c in zip(weeks[:-1], crossing[:-1])]
    current = _week_data(rs, week, opts, only, detail=True, crossing=crossing[-1])
    if team is not None:
        names: list[str] = [team]
    else:
        # every team with a job in this week or a trend week (their groups are at hand)
        names = sorted({g.team for w in [*history, current] for g in w.groups} | set(opts.teams))
    return build_report(
        current,
        history,
        timezone=opts.timezone,
        prices=opts.prices,
        generated_at=now,
        cluster=opts.cluster,
        teams=names,
        top_n=opts.top_n,
        scope="team" if team is not None else "cluster",
    )


def iter_jobs(
    store: Store, week: IsoWeek, *, options: ReportOptions | None = None, team: str | None = None
) -> Iterator[dict[str, Any]]:
    """Every job of the week with its in-week share, as per-job rows (streamed, by job id)."""
    opts = options or ReportOptions()
    start, end = week.bounds(zone(opts.timezone))
    rs = ReportStore(store)
    for j in rs.week_jobs(start, end, cluster=opts.cluster, teams=[team] if team is not None else None):
        yield job_json(j, opts.prices, None)


def options_from(settings: Any | None = None, **overrides: Any) -> ReportOptions:
    """:class:`ReportOptions` from the operator's ``reports`` settings section (or a mapping).

    Reads ``timezone``, ``prices`` (model → price; key ``default``), ``currency``, ``top_n``,
    ``teams`` when the section has them; missing keys keep the defaults, so this works with
    the settings of any version.
    """

    def get(key: str, default: Any) -> Any:
        if settings is None:
            return default
        if isinstance(settings, Mapping):
            return settings.get(key, default)
        return getattr(settings, key, default)

    raw_prices = dict(get("prices", {}) or {})
    default_price = float(raw_prices.pop("default", 0.0) or 0.0)
    values: dict[str, Any] = {
        "timezone": get("timezone", "UTC") or "UTC",
        "prices": Prices(
            {str(k): float(v) for k, v in raw_prices.items()}, default_price, str(get("currency", "USD") or "USD")
        ),
        "top_n": int(get("top_n", 10)),
        "teams": tuple(get("teams", ()) or ()),
    }
    values.update(overrides)
    zone(values["timezone"])  # fail early on a bad zone
    return ReportOptions(**values)
