"""Slack summaries of a report: one per team, one cluster-wide for admins (Block Kit).

Every user-controlled string (team, namespace, job names, advice) is escaped with
:func:`auditor.notify.slack_escape` (directly or through the block helpers), so a job named
``<!channel>`` cannot ping anyone. Numbers are the report document's, formatted as in the HTML.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from auditor.render.slack_blocks import context, fields, header, section, slack_escape, truncate
from auditor.reports.aggregate import fmt, mfu_headline, mfu_sparkline, priced

TOP_IN_SLACK = 3


def _trend_text(points: list[Mapping[str, Any]]) -> str:
    effs = [f"{fmt('ratio', p['efficiency'])} · {fmt('ratio', p['mfu'])}" if p["jobs"] else "no data" for p in points]
    return "Efficiency · MFU by week: " + " → ".join(f"{p['week'][-3:]} {e}" for p, e in zip(points, effs))


def _kpi_fields(t: Mapping[str, Any], cur: str, money: bool) -> dict:
    """The KPI fields; the waste cost only when the report has prices (never "0.00 USD")."""
    return fields(
        [
            ("GPU-hours", fmt("hours", t["gpu_hours"])),
            ("Efficiency (SM activity)", fmt("ratio", t["efficiency"])),
            ("MFU (GPU-hour-weighted)", fmt("ratio", t["mfu"])),
            (
                "Queue wait median · p90",
                f"{fmt('wait', t['queue_wait_median_s'])} · {fmt('wait', t['queue_wait_p90_s'])}",
            ),
            ("Waste GPU-hours", fmt("hours", t["waste_gpu_hours"])),
            *([("Waste cost", fmt("money", t["waste_cost"], cur))] if money else []),
            ("Recoverable GPU-hours (MFU gap)", fmt("hours", t["recoverable_gpu_hours"])),
            ("Unmeasured GPU-hours", fmt("hours", t["unmeasured_gpu_hours"])),
            ("Jobs · policy actions", f"{t['jobs']} · {t['actions_total']}"),
        ]
    )


def _job_list(title: str, jobs: list[Mapping[str, Any]], figures: Callable[[Mapping[str, Any]], str]) -> list[dict]:
    """A section listing the first :data:`TOP_IN_SLACK` of ``jobs`` with their ``figures`` and
    advice; no section without jobs."""
    if not jobs:
        return []
    lines = [
        f"• *{slack_escape(j['namespace'] + '/' + j['job'])}* — {figures(j)}\n"
        f"   {truncate(slack_escape(j.get('advice') or ''), 400)}"
        for j in jobs[:TOP_IN_SLACK]
    ]
    return [section(f"*{title}*\n" + "\n".join(lines))]


def _team_list(
    title: str, teams: list[Mapping[str, Any]], key: str, figures: Callable[[Mapping[str, Any]], str]
) -> list[dict]:
    """A section of the five teams with the most ``key``, with their ``figures``; none without teams."""
    ranked = sorted(teams, key=lambda x: (-(x[key] or 0.0), x["team"]))[:5]
    if not ranked:
        return []
    return [section(f"*{title}*\n" + "\n".join(f"• *{slack_escape(x['team'])}*: {figures(x)}" for x in ranked))]


def _mfu_text(t: Mapping[str, Any]) -> str:
    """The MFU gap's sentence and the MFU distribution as a sparkline (0 → 100 %)."""
    spark = mfu_sparkline(t["mfu_histogram"])
    dist = f"\nMFU distribution (GPU-hours per 5 % bin, 0 → 100 %): `{spark}`" if spark else ""
    return slack_escape(mfu_headline(t)) + dist


def _cost(v: Any, cur: str, money: bool) -> str:
    return f" ({fmt('money', v, cur)})" if money else ""


def team_message(report: Mapping[str, Any], team: Mapping[str, Any]) -> tuple[str, list[dict]]:
    """(fallback text, blocks) for one team's summary."""
    cur = report["prices"].get("currency", "")
    name = str(team["team"])
    text = (
        f"GPU efficiency {report['week']} for team {slack_escape(name)}: {fmt('hours', team['gpu_hours'])} GPU-h, "
        f"efficiency {fmt('ratio', team['efficiency'])}, waste {fmt('hours', team['waste_gpu_hours'])} GPU-h"
    )
    blocks: list[dict] = [header(f"GPU efficiency {report['week']} · {name}")]
    if team["note"]:
        blocks.append(section(slack_escape(team["note"])))
        blocks.append(
            context(
                f"{slack_escape(report['start'])} – {slack_escape(report['end'])} ({slack_escape(report['timezone'])})"
            )
        )
        return text, blocks
    money = priced(report)
    blocks.append(_kpi_fields(team, cur, money))
    blocks.append(section(_mfu_text(team)))
    blocks += _job_list(
        "Most wasteful jobs",
        team["top_jobs"],
        lambda j: (
            f"`{slack_escape(j['verdict'])}`, {fmt('hours', j['waste_gpu_hours'])} GPU-h wasted"
            + _cost(j["waste_cost"], cur, money)
        ),
    )
    blocks += _job_list(
        "Largest MFU gap",
        team["top_mfu_gap"],
        lambda j: (
            f"MFU {fmt('ratio', j['mfu_estimate'])} of {fmt('ratio', j['mfu_reference'])} "
            f"({slack_escape(j['mfu_class'] or '')}): {fmt('hours', j['recoverable_gpu_hours'])} GPU-h recoverable"
            + _cost(j["recoverable_cost"], cur, money)
        ),
    )
    blocks.append(context(slack_escape(_trend_text(team["trend"]))))
    blocks.append(
        context(
            f"ISO week {slack_escape(report['week'])}: {slack_escape(report['start'])} – {slack_escape(report['end'])} ({slack_escape(report['timezone'])})"
        )
    )
    return text, blocks


def cluster_message(report: Mapping[str, Any]) -> tuple[str, list[dict]]:
    """(fallback text, blocks) for the admins' cluster-wide summary: totals and the teams
    with the most waste."""
    cur = report["prices"].get("currency", "")
    t = report["total"]
    where = f" · {report['cluster']}" if report.get("cluster") else ""
    text = (
        f"GPU efficiency {report['week']}{slack_escape(where)}: {fmt('hours', t['gpu_hours'])} GPU-h, "
        f"efficiency {fmt('ratio', t['efficiency'])}, waste {fmt('hours', t['waste_gpu_hours'])} GPU-h"
    )
    money = priced(report)
    blocks: list[dict] = [
        header(f"GPU efficiency {report['week']} · cluster{where}"),
        _kpi_fields(t, cur, money),
        section(_mfu_text(t)),
    ]
    blocks += _team_list(
        "Teams with the most waste",
        [x for x in report["teams"] if x["jobs"]],
        "waste_gpu_hours",
        lambda x: (
            f"{fmt('hours', x['waste_gpu_hours'])} GPU-h wasted{_cost(x['waste_cost'], cur, money)}, "
            f"efficiency {fmt('ratio', x['efficiency'])}, unmeasured {fmt('hours', x['unmeasured_gpu_hours'])} GPU-h"
        ),
    )
    blocks += _team_list(
        "Teams with the largest MFU gap",
        [x for x in report["teams"] if (x["recoverable_gpu_hours"] or 0) > 0],
        "recoverable_gpu_hours",
        lambda x: (
            f"{fmt('hours', x['recoverable_gpu_hours'])} GPU-h recoverable{_cost(x['recoverable_cost'], cur, money)} "
            f"({x['referenced_jobs']} jobs with a reference), MFU {fmt('ratio', x['mfu'])}"
        ),
    )
    empty = [x["team"] for x in report["teams"] if not x["jobs"]]
    if empty:
        blocks.append(
            context(
                "No jobs this week: "
                + ", ".join(slack_escape(e) for e in empty[:20])
                + (" …" if len(empty) > 20 else "")
            )
        )
    blocks.append(context(slack_escape(_trend_text(t["trend"]))))
    return text, blocks
