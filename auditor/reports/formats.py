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
from typing import Any, Callable, Iterable, Mapping, TextIO

from auditor.render.safe_text import CsvWriter
from auditor.reports.aggregate import VERDICTS, fmt, lineage_note, mfu_headline, mfu_sparkline, priced, shown_figures

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
    "headroom_gpu_hours",
    "cost",
    "waste_cost",
    "mfu",
    "mfu_measured_gpu_hours",
    "recoverable_gpu_hours",
    "recoverable_cost",
    "referenced_jobs",
    "referenced_gpu_hours",
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
    "mfu_estimate",
    "mfu_reference",
    "mfu_class",
    "recoverable_gpu_hours",
    "recoverable_cost",
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


def _md_jobs(
    title: str, jobs: list[Mapping[str, Any]], figures: list[tuple[str, Callable[[Mapping[str, Any]], str]]], empty: str
) -> list[str]:
    """A top list: job, team, the ``figures`` (right-aligned), verdict and advice; ``empty`` without jobs."""
    out = ["", f"## {title}", ""]
    if not jobs:
        return out + [empty]
    out += [
        "| job | team | " + "".join(f"{h} | " for h, _ in figures) + "verdict | why, and what to try |",
        "|---|---|" + "---:|" * len(figures) + "---|---|",
    ]
    for j in jobs:
        out.append(
            f"| {_md_escape(j['namespace'] + '/' + j['job'] + lineage_note(j))} | {_md_escape(j['team'])} | "
            + "".join(f"{cell(j)} | " for _, cell in figures)
            + f"{j['verdict']} | {_md_escape(j['advice'] or '')} |"
        )
    return out


def rows_of(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The team rows a table lists above its total (none in a team's own report)."""
    return list(report["teams"]) if report["scope"] == "cluster" else []


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
    lines += ["", f"> {_md_escape(mfu_headline(t))}", ""]
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
    lines += [
        "## MFU by team",
        "",
        "MFU: model FLOPs over the precision's dense tensor peak (a MIG slice: its share), weighted by "
        "GPU-hours over the jobs with tensor activity (others have none: n/a). Distribution: GPU-hours per "
        "5 % MFU bin, 0 % at the left, 100 % at the right.",
        "",
        "| team | MFU | distribution (0 → 100 %) | jobs with MFU | with a reference | recoverable GPU-h |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for row in rows_of(report) + [t]:
        name = "total" if row is t else _md_escape(row["team"])
        spark = mfu_sparkline(row["mfu_histogram"])
        n_mfu = sum(b["jobs"] for b in row["mfu_histogram"])
        lines.append(
            f"| {name} | {fmt('ratio', row['mfu'])} | {'`' + spark + '`' if spark else 'n/a'} | {n_mfu} | "
            f"{row['referenced_jobs']} | {fmt('hours', row['recoverable_gpu_hours'])} |"
        )
    lines += [""]
    lines += ["## Jobs by verdict", "", "| team | " + " | ".join(VERDICTS) + " |", "|---|" + "---:|" * len(VERDICTS)]
    for row in rows_of(report) + [t]:
        name = "total" if row is t else _md_escape(row["team"])
        lines.append(f"| {name} | " + " | ".join(str(row["verdicts"].get(v, 0)) for v in VERDICTS) + " |")
    lines += _md_jobs(
        "Most wasteful jobs",
        t["top_jobs"],
        [
            ("GPU-h", lambda j: fmt("hours", j["gpu_hours"])),
            ("SM", lambda j: fmt("ratio", j["sm_active"])),
            ("tensor", lambda j: fmt("ratio", j["tensor_active"])),
            ("waste GPU-h", lambda j: fmt("hours", j["waste_gpu_hours"])),
            *([("waste cost", lambda j: fmt("money", j["waste_cost"], cur))] if money else []),
        ],
        "No job with a waste figure.",
    )
    lines += _md_jobs(
        "Largest MFU gap",
        t["top_mfu_gap"],
        [
            ("GPU-h", lambda j: fmt("hours", j["gpu_hours"])),
            ("MFU", lambda j: fmt("ratio", j["mfu_estimate"])),
            ("reference (class)", lambda j: f"{fmt('ratio', j['mfu_reference'])} ({_md_escape(j['mfu_class'] or '')})"),
            ("recoverable GPU-h", lambda j: fmt("hours", j["recoverable_gpu_hours"])),
            *([("recoverable cost", lambda j: fmt("money", j["recoverable_cost"], cur))] if money else []),
        ],
        "No job below its reference MFU.",
    )
    lines += [
        "",
        "## Trend",
        "",
        "| week | GPU-hours | efficiency | MFU | waste GPU-h | recoverable GPU-h | unmeasured GPU-h |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in t["trend"]:
        if not p["jobs"]:
            lines.append(f"| {p['week']} | no data | | | | | |")
            continue
        lines.append(
            f"| {p['week']} | {fmt('hours', p['gpu_hours'])} | {fmt('ratio', p['efficiency'])} | {fmt('ratio', p['mfu'])} | "
            f"{fmt('hours', p['waste_gpu_hours'])} | {fmt('hours', p['recoverable_gpu_hours'])} | "
            f"{fmt('hours', p['unmeasured_gpu_hours'])} |"
        )
    return "\n".join(lines) + "\n"
