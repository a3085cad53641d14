"""The report document as JSON, CSV (per team, per job) and Markdown.

CSV cells hold the document's values as they are (ratios 0–1, hours, money; empty for null),
so a spreadsheet sums exactly what the JSON says, except that a text cell a spreadsheet would run
as a formula (a team label ``=HYPERLINK(...)``) is written with a leading ``'``
(:class:`auditor.render.safe_text.CsvWriter`); Markdown uses the same human formatting as
the HTML page. The team CSV ends with the total row (``row`` = ``total``).
"""

from __future__ import annotations

import io
import json
from typing import Any, Iterable, Mapping, TextIO

from auditor.render.safe_text import CsvWriter
from auditor.reports.aggregate import VERDICTS, fmt, lineage_note, priced, shown_figures

TEAM_COLUMNS: tuple[str, ...] = (
    "row",
    "week",
    "team",
    "jobs",
    "gpu_hours",
    "measured_gpu_hours",
    "unmeasured_gpu_hours",
    "sm_active_gpu_hours",
    "tensor_active_gpu_hours",
    "efficiency",
    "waste_gpu_hours",
    "cost",
    "waste_cost",
    "actions_total",
) + tuple(f"verdict_{v}" for v in VERDICTS)

JOB_COLUMNS: tuple[str, ...] = (
    "week",
    "cluster",
    "team",
    "namespace",
    "job",
    "gpu_model",
    "verdict",
    "start",
    "end",
    "split",
    "week_fraction",
    "gpu_hours",
    "sm_active",
    "tensor_active",
    "coverage",
    "waste_gpu_hours",
    "waste_cost",
)


def to_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def _cell(v: Any) -> Any:
    return "" if v is None else v


def _team_row(kind: str, week: str, t: Mapping[str, Any]) -> list[Any]:
    out = [kind, week]
    for c in TEAM_COLUMNS[2:]:
        if c.startswith("verdict_"):
            out.append(t["verdicts"].get(c[len("verdict_") :], 0))
        else:
            out.append(_cell(t[c]))
    return out


def teams_csv(report: Mapping[str, Any]) -> str:
    """One row per team, then the total row."""
    buf = io.StringIO()
    w = CsvWriter(buf)
    w.writerow(TEAM_COLUMNS)
    if report["scope"] == "cluster":
        for t in report["teams"]:
            w.writerow(_team_row("team", report["week"], t))
    w.writerow(_team_row("total", report["week"], report["total"]))
    return buf.getvalue()


def write_jobs_csv(out: TextIO, week: str, jobs: Iterable[Mapping[str, Any]]) -> int:
    """Stream per-job rows (from :func:`auditor.reports.service.iter_jobs`); returns the count."""
    w = CsvWriter(out)
    w.writerow(JOB_COLUMNS)
    n = 0
    for j in jobs:
        w.writerow([week] + [_cell(j.get(c)) for c in JOB_COLUMNS[1:]])
        n += 1
    return n


def _md_escape(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def to_markdown(report: Mapping[str, Any]) -> str:
    cur = report["prices"].get("currency", "")
    t = report["total"]
    scope = "cluster" if report["scope"] == "cluster" else f"team {t['team']}"
    lines = [
        f"# GPU efficiency {report['week']} · {_md_escape(scope)}",
        "",
        f"ISO week {report['week']}: {report['start']} – {report['end']} ({report['timezone']}, {report['hours_in_week']} h)"
        + (f", cluster {_md_escape(report['cluster'])}" if report["cluster"] else "")
        + f". Generated {report['generated_at']}"
        + (f" from store {_md_escape(report['store'])}." if report.get("store") else "."),
        "",
    ]
    if t["note"]:
        lines += [f"> {_md_escape(t['note'])}", ""]
    figures, money = shown_figures(report), priced(report)
    for key, label, kind in figures:
        lines.append(f"- **{label}**: {fmt(kind, t[key], cur)}")
    lines.append(
        f"- **policy actions**: {t['actions_total']}"
        + (" (" + ", ".join(f"{a}: {n}" for a, n in t["actions"].items()) + ")" if t["actions"] else "")
    )
    lines.append("")
    if report["scope"] == "cluster":
        lines += [
            "## Teams",
            "",
            "| team | " + " | ".join(lbl for _, lbl, _ in figures) + " | actions |",
            "|---|" + "---:|" * (len(figures) + 1),
        ]
        for name, row in [(_md_escape(x["team"]), x) for x in report["teams"]] + [("**total**", t)]:
            cells = (
                [fmt(kind, row[key], cur) for key, _, kind in figures]
                if row["jobs"] or row is t
                else ["no data"] + [""] * (len(figures) - 1)
            )
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['actions_total']} |")
        lines.append("")
    lines += ["## Jobs by verdict", "", "| team | " + " | ".join(VERDICTS) + " |", "|---|" + "---:|" * len(VERDICTS)]
    rows = list(report["teams"]) if report["scope"] == "cluster" else []
    for row in rows + [t]:
        name = "total" if row is t else _md_escape(row["team"])
        lines.append(f"| {name} | " + " | ".join(str(row["verdicts"].get(v, 0)) for v in VERDICTS) + " |")
    lines += ["", "## Most wasteful jobs", ""]
    if t["top_jobs"]:
        lines += [
            "| job | team | GPU-h | SM | tensor | waste GPU-h | "
            + ("waste cost | " if money else "")
            + "verdict | why, and what to try |",
            "|---|---|---:|---:|---:|---:|" + ("---:|" if money else "") + "---|---|",
        ]
        for j in t["top_jobs"]:
            lines.append(
                f"| {_md_escape(j['namespace'] + '/' + j['job'] + lineage_note(j))} | {_md_escape(j['team'])} | {fmt('hours', j['gpu_hours'])} | "
                f"{fmt('ratio', j['sm_active'])} | {fmt('ratio', j['tensor_active'])} | {fmt('hours', j['waste_gpu_hours'])} | "
                + (f"{fmt('money', j['waste_cost'], cur)} | " if money else "")
                + f"{j['verdict']} | {_md_escape(j['advice'] or '')} |"
            )
    else:
        lines.append("No job with a waste figure.")
    lines += [
        "",
        "## Trend",
        "",
        "| week | GPU-hours | efficiency | waste GPU-h | unmeasured GPU-h |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in t["trend"]:
        if not p["jobs"]:
            lines.append(f"| {p['week']} | no data | | | |")
            continue
        lines.append(
            f"| {p['week']} | {fmt('hours', p['gpu_hours'])} | {fmt('ratio', p['efficiency'])} | {fmt('hours', p['waste_gpu_hours'])} | "
            f"{fmt('hours', p['unmeasured_gpu_hours'])} |"
        )
    return "\n".join(lines) + "\n"
