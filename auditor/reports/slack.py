"""Slack summaries of a report: one per team, one cluster-wide for admins (Block Kit).

Every user-controlled string (team, namespace, job names, advice) is escaped with
:func:`auditor.notify.slack_escape` (directly or through the block helpers), so a job named
``<!channel>`` cannot ping anyone. Numbers are the report document's, formatted as in the HTML.
"""

from __future__ import annotations

from typing import Any, Mapping

from auditor.render.slack_blocks import context, fields, header, section, slack_escape, truncate
from auditor.reports.aggregate import fmt, priced

TOP_IN_SLACK = 3


def _trend_text(points: list[Mapping[str, Any]]) -> str:
    effs = [fmt("ratio", p["efficiency"]) if p["jobs"] else "no data" for p in points]
    return "Efficiency by week: " + " → ".join(f"{p['week'][-3:]} {e}" for p, e in zip(points, effs))


def _kpi_fields(t: Mapping[str, Any], cur: str, money: bool) -> dict:
    """The KPI fields; the waste cost only when the report has prices (never "0.00 USD")."""
    return fields(
        [
            ("GPU-hours", fmt("hours", t["gpu_hours"])),
            ("Efficiency (SM activity)", fmt("ratio", t["efficiency"])),
            (
                "Queue wait median · p90",
                f"{fmt('wait', t['queue_wait_median_s'])} · {fmt('wait', t['queue_wait_p90_s'])}",
            ),
            ("Waste GPU-hours", fmt("hours", t["waste_gpu_hours"])),
            *([("Waste cost", fmt("money", t["waste_cost"], cur))] if money else []),
            ("Unmeasured GPU-hours", fmt("hours", t["unmeasured_gpu_hours"])),
            ("Jobs · policy actions", f"{t['jobs']} · {t['actions_total']}"),
        ]
    )


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
    if team["top_jobs"]:
        lines = []
        for j in team["top_jobs"][:TOP_IN_SLACK]:
            advice = truncate(slack_escape(j.get("advice") or ""), 400)
            lines.append(
                f"• *{slack_escape(j['namespace'] + '/' + j['job'])}* — `{slack_escape(j['verdict'])}`, "
                f"{fmt('hours', j['waste_gpu_hours'])} GPU-h wasted{_cost(j['waste_cost'], cur, money)}\n   {advice}"
            )
        blocks.append(section("*Most wasteful jobs*\n" + "\n".join(lines)))
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
    blocks: list[dict] = [header(f"GPU efficiency {report['week']} · cluster{where}"), _kpi_fields(t, cur, money)]
    teams = sorted(report["teams"], key=lambda x: (-(x["waste_gpu_hours"] or 0.0), x["team"]))
    ranked = [x for x in teams if x["jobs"]][:5]
    if ranked:
        lines = [
            f"• *{slack_escape(x['team'])}*: {fmt('hours', x['waste_gpu_hours'])} GPU-h wasted{_cost(x['waste_cost'], cur, money)}, "
            f"efficiency {fmt('ratio', x['efficiency'])}, unmeasured {fmt('hours', x['unmeasured_gpu_hours'])} GPU-h"
            for x in ranked
        ]
        blocks.append(section("*Teams with the most waste*\n" + "\n".join(lines)))
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
