"""A small self-contained HTML page of audit summaries (the ``demo`` report).

Self-contained on purpose: the charts are PNGs inlined as ``data:`` URIs (matplotlib, Agg
backend), the style is inline, and nothing is fetched from anywhere, so the file can be mailed
or opened from a CI artifact. Values are escaped by Jinja2's autoescaping.
"""

from __future__ import annotations

import base64
import io
from collections import defaultdict
from datetime import datetime
from typing import Any, Sequence

import jinja2

from auditor.core.figures import gpus_text, is_flagged, of_jobs
from auditor.core.job_summary import JobSummary
from auditor.core.model import Verdict
from auditor.render import METRIC_COLORS, VERDICT_COLORS
from auditor.render.table import MFU_NA, notes

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title>
<style>
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;color:#222;padding:0 1rem}
h1{margin-bottom:.2rem} .sub{color:#666;margin-top:0}
.kpis{display:flex;gap:1rem;margin:1rem 0;flex-wrap:wrap}
.kpi{background:#f5f5f5;border-radius:8px;padding:.7rem 1rem;min-width:9rem}
.kpi b{display:block;font-size:1.5rem}
table{border-collapse:collapse;width:100%;font-size:.9rem;margin:1rem 0}
th,td{border-bottom:1px solid #e0e0e0;padding:.35rem .5rem;text-align:right;vertical-align:top}
th{background:#fafafa} td.l,th.l{text-align:left}
.v{color:#fff;border-radius:4px;padding:.1rem .4rem;font-size:.8rem;white-space:nowrap}
details{margin:.4rem 0 .8rem 0} summary{cursor:pointer}
.f{margin:.3rem 0 .3rem 1rem} .code{font-family:monospace;background:#eee;padding:0 .3rem;border-radius:3px}
.ev{font-family:monospace;font-size:.75rem;color:#555;white-space:pre-wrap;margin-left:1rem}
img{max-width:100%}
</style></head><body>
<h1>{{ title }}</h1>
<p class="sub">Window {{ window_start }} – {{ window_end }} · generated {{ generated }}{% if source %} · {{ source }}{% endif %}</p>
<div class="kpis">
<div class="kpi"><b>{{ summaries|length }}</b>jobs</div>
<div class="kpi"><b>{{ "%.1f"|format(total_hours) }}</b>GPU-hours</div>
<div class="kpi"><b>{{ "%.1f"|format(waste_hours) }}</b>waste GPU-hours (flagged jobs' idle SMs)</div>
{% if referenced %}<div class="kpi"><b>{{ "%.1f"|format(recoverable_hours) }}</b>GPU-hours recoverable at the reference MFU</div>{% endif %}
<div class="kpi"><b>{{ flagged }}</b>jobs to look at (flagged: a wasteful verdict, in this window)</div>
</div>
<p>“GPU utilization” only says that <i>some</i> kernel was running; <b>SM activity</b> says how much of the GPU
did work. Jobs are sorted by wasted GPU-hours (allocated GPU-hours × (1 − SM activity)).</p>
<p><b>MFU≈</b> is the estimated share of the dense tensor-core peak of the precision in use (bf16, FP8 or TF32;
on a MIG slice, of the slice's share), n/a where the tensor cores do no work. A job whose workload class (or
whose lineage's best earlier run) gives a <b>reference MFU</b> is charged the <b>recoverable GPU-hours</b> of
its MFU gap: GPU-hours × (1 − MFU / reference){% if referenced %}: at their reference MFU, these
{{ referenced }} job{{ "s" if referenced != 1 }} would have needed {{ "%.1f"|format(recoverable_hours) }} fewer
GPU-hours{% endif %}.</p>
{% for chart in charts %}<figure><img alt="{{ chart.alt }}" src="data:image/png;base64,{{ chart.png }}"><figcaption>{{ chart.caption }}</figcaption></figure>{% endfor %}
<h2>Verdicts</h2>
<table><tr><th class="l">namespace</th><th class="l">job</th><th class="l">team</th><th>GPUs</th><th>GPU-h</th>
<th>util</th><th>SM</th><th>tensor</th><th>DRAM</th><th>MFU≈</th><th>reference MFU</th><th>coverage</th><th>waste GPU-h</th>
<th>recoverable GPU-h</th><th class="l">verdict</th><th class="l">notes</th></tr>
{% for s in summaries %}<tr><td class="l">{{ s.namespace }}</td><td class="l">{{ s.job }}</td><td class="l">{{ s.team }}</td>
<td>{{ gpus(s.gpus) }}</td><td>{{ num(s.gpu_hours) }}</td><td>{{ pct(s.gpu_util if s.gpu_util is not none else s.gr_engine_active) }}</td>
<td>{{ pct(s.sm_active) }}</td><td>{{ pct(s.tensor_active) }}</td><td>{{ pct(s.dram_active) }}</td><td>{{ mfu(s) }}</td>
<td>{{ pct(s.mfu_reference) }}{% if s.mfu_class %} ({{ s.mfu_class }}){% endif %}</td>
<td>{{ pct(s.coverage) }}</td><td>{{ num(s.waste_gpu_hours) }}</td><td>{{ num(s.recoverable_gpu_hours) }}</td>
<td class="l"><span class="v" style="background:{{ color(s.verdict) }}">{{ s.verdict }}</span></td><td class="l">{{ note(s) }}</td></tr>
{% endfor %}</table>
<h2>Findings</h2>
{% for s in summaries %}<details{% if s.verdict not in ("healthy",) %} open{% endif %}><summary><b>{{ s.namespace }}/{{ s.job }}</b> —
<span class="v" style="background:{{ color(s.verdict) }}">{{ s.verdict }}</span> ({{ gpus(s.gpus) }} GPU{{ "s" if s.gpus != 1 }}, {{ s.start }} – {{ s.end }})</summary>
{% for f in s.findings %}<div class="f"><span class="code">{{ f.code }}</span> {{ f.message }}<div class="ev">{{ ev(f.evidence) }}</div></div>{% endfor %}
{% if s.per_gpu|length > 1 %}<table><tr><th class="l">pod</th><th class="l">GPU</th><th>util</th><th>SM</th><th>tensor</th><th>DRAM</th><th>coverage</th><th class="l">verdict</th></tr>
{% for g in s.per_gpu %}<tr><td class="l">{{ g.pod }}</td><td class="l">{{ g.hostname }} #{{ g.gpu }}{% if g.mig_instance %} MIG {{ g.mig_profile }}{% endif %}</td>
<td>{{ pct(g.gpu_util if g.gpu_util is not none else g.gr_engine_active) }}</td><td>{{ pct(g.sm_active) }}</td><td>{{ pct(g.tensor_active) }}</td>
<td>{{ pct(g.dram_active) }}</td><td>{{ pct(g.coverage) }}</td><td class="l">{{ g.verdict }}</td></tr>{% endfor %}</table>{% endif %}
</details>
{% endfor %}
<p class="sub">Finding codes are documented in docs/findings.md; verdict rules and thresholds in docs/verdicts.md.</p>
</body></html>
"""


def _pct(v: object) -> str:
    return "–" if v is None else f"{float(v) * 100:.1f}%"  # type: ignore[arg-type]


def _num(v: object) -> str:
    return "–" if v is None else f"{float(v):.2f}"  # type: ignore[arg-type]


def _mfu(doc: dict) -> str:
    """The MFU cell: ``n/a`` where the estimate means nothing (no tensor-core work:
    :func:`auditor.render.table.mfu_means_nothing`)."""
    if doc.get("mfu_estimate") is not None and doc.get("verdict") == Verdict.NO_TENSOR_CORES.value:
        return MFU_NA
    return _pct(doc.get("mfu_estimate"))


def _ev(evidence: object) -> str:
    import json

    return json.dumps(evidence, sort_keys=True, default=str)


def _png(fig: object) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")  # type: ignore[attr-defined]
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _busy(s: JobSummary) -> float | None:
    """Utilization as the page shows it: GPU_UTIL, else the profiling engine-active ratio."""
    return s.means.gpu_util if s.means.gpu_util is not None else s.means.gr_engine_active


def charts(summaries: Sequence[JobSummary]) -> list[dict[str, str]]:
    """The page's charts as base64 PNGs: utilization vs SM activity per job, waste per team."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[dict[str, str]] = []
    if not summaries:
        return out
    labels = [f"{s.namespace}/{s.job}" for s in summaries]
    series = [
        ("GPU utilization", [_busy(s) for s in summaries], METRIC_COLORS["gpu_util"]),
        ("SM activity", [s.means.sm_active for s in summaries], METRIC_COLORS["sm_active"]),
        ("tensor activity", [s.means.tensor_active for s in summaries], METRIC_COLORS["tensor_active"]),
    ]
    n = len(summaries)
    fig, ax = plt.subplots(figsize=(10, 0.45 * n + 1.2))
    h = 0.26
    for k, (name, values, color) in enumerate(series):
        ys = [i + (k - 1) * h for i in range(n)]
        xs = [(v or 0.0) * 100 for v in values]
        ax.barh(ys, xs, height=h, label=name, color=color)
        for y, v in zip(ys, values):
            if v is None:
                ax.text(1, y, "no data", va="center", fontsize=7, color="#777")
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 105)
    ax.set_xlabel("% (job mean)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    ax.set_title("GPU utilization hides idle SMs: utilization vs SM and tensor activity", pad=22)
    fig.tight_layout()
    out.append(
        {
            "png": _png(fig),
            "alt": "bar chart: GPU utilization, SM activity and tensor activity per job",
            "caption": "A job at 100 % utilization can have almost no SM activity (low_sm_efficiency).",
        }
    )
    plt.close(fig)

    gap = [s for s in summaries if s.mfu_reference is not None and s.mfu_estimate is not None]
    if gap:
        out.append(_mfu_chart(plt, gap))

    by_team: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in summaries:
        if s.waste_gpu_hours is not None and is_flagged(s.verdict.value):
            by_team[s.team or s.namespace][s.verdict.value] += s.waste_gpu_hours
    if by_team:
        teams = sorted(by_team, key=lambda t: -sum(by_team[t].values()))
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(teams) + 1.2))
        left = [0.0] * len(teams)
        for verdict, color in VERDICT_COLORS.items():
            vals = [by_team[t].get(verdict, 0.0) for t in teams]
            if any(vals):
                ax.barh(range(len(teams)), vals, left=left, color=color, label=verdict)
                left = [a + b for a, b in zip(left, vals)]
        ax.set_yticks(range(len(teams)), teams)
        ax.invert_yaxis()
        ax.set_xlabel("waste GPU-hours (flagged jobs' idle SMs)")
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title("Wasted GPU-hours per team, by verdict")
        fig.tight_layout()
        out.append(
            {
                "png": _png(fig),
                "alt": "bar chart: wasted GPU-hours per team",
                "caption": "Waste = allocated GPU-hours × (1 − SM activity) of the flagged jobs; healthy jobs and jobs "
                "without SM data are left out.",
            }
        )
        plt.close(fig)
    return out


def _mfu_chart(plt: Any, summaries: Sequence[JobSummary]) -> dict[str, str]:
    """Each job with a reference: its MFU against the reference, and the GPU-hours of the gap."""
    labels = [f"{s.namespace}/{s.job}" for s in summaries]
    n = len(summaries)
    fig, ax = plt.subplots(figsize=(10, 0.45 * n + 1.2))
    ys = list(range(n))
    ax.barh(ys, [(s.mfu_reference or 0.0) * 100 for s in summaries], height=0.6, color="#e0e0e0", label="reference")
    ax.barh(
        ys,
        [(s.mfu_estimate or 0.0) * 100 for s in summaries],
        height=0.35,
        color=METRIC_COLORS["tensor_active"],
        label="MFU",
    )
    for y, s in zip(ys, summaries):
        ax.text(
            max(s.mfu_reference or 0.0, s.mfu_estimate or 0.0) * 100 + 1,
            y,
            f"{s.recoverable_gpu_hours or 0.0:.1f} GPU-h recoverable ({s.mfu_class})",
            va="center",
            fontsize=7,
            color="#555",
        )
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the dense tensor peak of the precision in use")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("MFU against the reference of the job's class (or lineage)")
    fig.tight_layout()
    chart = {
        "png": _png(fig),
        "alt": "bar chart: MFU against the reference MFU per job, with the recoverable GPU-hours",
        "caption": "Recoverable GPU-hours = GPU-hours × (1 − MFU / reference): what the same work would not have needed.",
    }
    plt.close(fig)
    return chart


def _notes(doc: dict) -> str:
    return notes(str(f.get("code")) for f in doc.get("findings") or [] if isinstance(f, dict))


def render_html(
    summaries: Sequence[JobSummary],
    *,
    title: str,
    generated_at: datetime,
    window_start: str,
    window_end: str,
    source: str = "",
    with_charts: bool = True,
) -> str:
    """The whole page as one string: the figures are read from the typed summaries, the
    tables render each summary's audit JSON (the documented shape the page shows)."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.globals.update(
        gpus=gpus_text, pct=_pct, num=_num, ev=_ev, note=_notes, mfu=_mfu, color=lambda v: VERDICT_COLORS.get(v, "#999")
    )
    tpl = env.from_string(_TEMPLATE)
    total = sum(s.gpu_hours or 0.0 for s in summaries)
    fig = of_jobs(summaries)
    waste, flagged = fig.waste_gpu_hours, fig.flagged
    gaps = [s.recoverable_gpu_hours for s in summaries if s.recoverable_gpu_hours is not None]
    return tpl.render(
        title=title,
        summaries=[s.to_json() for s in summaries],
        generated=generated_at.isoformat(timespec="seconds"),
        window_start=window_start,
        window_end=window_end,
        source=source,
        total_hours=total,
        waste_hours=waste,
        flagged=flagged,
        referenced=len(gaps),
        recoverable_hours=sum(gaps),
        charts=charts(summaries) if with_charts else [],
    )
