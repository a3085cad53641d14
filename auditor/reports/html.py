"""The weekly report as one self-contained HTML page.

Self-contained: charts are inline PNGs (``data:`` URIs), the style is inline, there are no
scripts and no external links for assets, so the file can be mailed, attached to a ticket or
opened from a CI artifact. Readable on a phone: a fluid layout, KPI tiles that wrap, wide
tables scroll sideways inside their own box. Every number is the report document's value,
formatted by :func:`auditor.reports.aggregate.fmt`; each figure cell carries ``data-k`` (the
document key) so tests can check the page against the JSON; the MFU gap's sentence is marked
``data-h`` (a text, not a figure).
"""

from __future__ import annotations

from typing import Any, Mapping

import jinja2
from markupsafe import Markup

from auditor.reports import charts
from auditor.reports.aggregate import MFU_BINS, VERDICTS, fmt, lineage_note, mfu_headline, priced, shown_figures

_CSS = """
:root{--fg:#1d1d1f;--mut:#666;--bd:#e3e3e3;--bg2:#f5f6f8}
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);margin:0 auto;max-width:1320px;padding:1rem;line-height:1.4}
h1{font-size:1.5rem;margin:.2rem 0} h2{font-size:1.2rem;margin:1.6rem 0 .5rem;border-bottom:1px solid var(--bd);padding-bottom:.2rem}
h3{font-size:1.05rem;margin:1.2rem 0 .4rem}
.sub{color:var(--mut);margin:.1rem 0 .8rem;font-size:.9rem}
.kpis{display:grid;grid-template-columns:repeat(auto-fill,minmax(9.5rem,1fr));gap:.6rem;margin:.8rem 0}
.kpi{background:var(--bg2);border-radius:8px;padding:.55rem .8rem}
.kpi b{display:block;font-size:1.25rem;font-variant-numeric:tabular-nums}
.kpi span{color:var(--mut);font-size:.8rem}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;margin:.5rem 0}
table{border-collapse:collapse;width:100%;font-size:.85rem}
th,td{border-bottom:1px solid var(--bd);padding:.3rem .45rem;text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
th{background:#fafafa;position:sticky;top:0;white-space:normal;vertical-align:bottom} th[data-k]{white-space:nowrap} .l{text-align:left}
td.l{white-space:normal;overflow-wrap:break-word} td.job{min-width:11rem}
td.advice{white-space:normal;text-align:left;min-width:18rem;max-width:40rem;font-size:.8rem;color:#333}
.nw{white-space:nowrap}
.v{color:#fff;border-radius:4px;padding:.05rem .35rem;font-size:.75rem;white-space:nowrap}
figure{margin:.8rem 0} figure img{width:100%;max-width:760px;height:auto;display:block} figcaption{color:var(--mut);font-size:.8rem}
.note{background:#fff8e1;border-left:4px solid #f9a825;padding:.5rem .8rem;margin:.6rem 0}
.team{border-top:2px solid var(--bd);margin-top:1.5rem}
.gap{background:#e8f5e9;border-left:4px solid #2e7d32;padding:.5rem .8rem;margin:.6rem 0}
.hist{display:inline-flex;align-items:flex-end;gap:1px;height:1.6rem;width:10.5rem;border-bottom:1px solid #999;vertical-align:middle}
.hist i{display:block;flex:1;background:#2e7d32;min-height:0}
@media (max-width:600px){body{padding:.6rem}.kpi b{font-size:1.1rem}h1{font-size:1.25rem}}
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>{{ css }}</style></head><body>
<h1>{{ title }}</h1>
<p class="sub">ISO week <b data-k="week">{{ r.week }}</b> · {{ r.start }} – {{ r.end }} ({{ r.timezone }}, {{ r.hours_in_week }} h){% if r.cluster %} · cluster {{ r.cluster }}{% endif %} · generated {{ r.generated_at }}{% if r.store is defined and r.store %} from store <span data-k="store">{{ r.store }}</span>{% endif %}</p>
{% macro kpis(t) -%}
<div class="kpis">
{% for key, label, kind in figures %}<div class="kpi"><b data-k="{{ key }}">{{ f(kind, t[key]) }}</b><span>{{ label|nw }}</span></div>{% endfor %}
<div class="kpi"><b data-k="actions_total">{{ t.actions_total }}</b><span>policy actions</span></div>
</div>
<p class="gap" data-h="mfu_headline">{{ headline(t) }}</p>
{%- endmacro %}
{% macro hist(t) -%}
{% set bars = hist_bars(t.mfu_histogram) %}{% if bars %}<span class="hist" role="img" aria-label="GPU-hours per 5 % MFU bin, 0 to 100 %" title="GPU-hours per 5 % MFU bin, 0 % left, 100 % right">{% for h, tip in bars %}<i style="height:{{ h }}%" title="{{ tip }}"></i>{% endfor %}</span>{% else %}n/a{% endif %}
{%- endmacro %}
{% macro mfu_row(t) -%}<td data-k="mfu">{{ f("ratio", t.mfu) }}</td><td class="l">{{ hist(t) }}</td><td data-n="mfu_jobs">{{ t.mfu_histogram|sum(attribute="jobs") }}</td><td data-k="referenced_jobs">{{ t.referenced_jobs }}</td><td data-k="recoverable_gpu_hours">{{ f("hours", t.recoverable_gpu_hours) }}</td>{%- endmacro %}
{% macro mfu_head() -%}<th>MFU</th><th class="l">distribution (0 → 100 %)</th><th>jobs with MFU</th><th>with a reference</th><th>{{ "recoverable GPU-h"|nw }}</th>{%- endmacro %}
{% macro gap(t) -%}
{% if t.top_mfu_gap %}<div class="scroll"><table data-table="top_mfu_gap">
<tr><th class="l">job</th>{% if show_team %}<th class="l">team</th>{% endif %}<th>{{ "GPU-h"|nw }}</th><th>MFU</th><th>reference</th><th class="l">class</th><th>{{ "recoverable GPU-h"|nw }}</th>{% if priced %}<th>recoverable cost</th>{% endif %}<th class="l">verdict</th><th class="l">why, and what to try</th></tr>
{% for j in t.top_mfu_gap %}<tr data-job="{{ j.namespace }}/{{ j.job }}"><td class="l job">{{ j.namespace }}/<wbr>{{ j.job }}{% if j.split != "inside" %} <small>({{ f("ratio", j.week_fraction) }} in week)</small>{% endif %}{% if "lineage" in j %} <small data-k="lineage">{{ lineage_note(j) }}</small>{% endif %}</td>
{% if show_team %}<td class="l">{{ j.team }}</td>{% endif %}<td data-k="gpu_hours">{{ f("hours", j.gpu_hours) }}</td><td data-k="mfu_estimate">{{ f("ratio", j.mfu_estimate) }}</td><td data-k="mfu_reference">{{ f("ratio", j.mfu_reference) }}</td><td class="l" data-k="mfu_class">{{ j.mfu_class or "" }}</td>
<td data-k="recoverable_gpu_hours">{{ f("hours", j.recoverable_gpu_hours) }}</td>{% if priced %}<td data-k="recoverable_cost">{{ f("money", j.recoverable_cost) }}</td>{% endif %}
<td class="l"><span class="v" style="background:{{ color(j.verdict) }}">{{ j.verdict }}</span></td><td class="advice">{{ j.advice or "" }}</td></tr>
{% endfor %}</table></div>{% else %}<p class="sub">No job below its reference MFU.</p>{% endif %}
{%- endmacro %}
{% macro top(t) -%}
{% if t.top_jobs %}<div class="scroll"><table data-table="top_jobs">
<tr><th class="l">job</th>{% if show_team %}<th class="l">team</th>{% endif %}<th>{{ "GPU-h"|nw }}</th><th>SM</th><th>tensor</th><th>{{ "waste GPU-h"|nw }}</th>{% if priced %}<th>waste cost</th>{% endif %}<th class="l">verdict</th><th class="l">why, and what to try</th></tr>
{% for j in t.top_jobs %}<tr data-job="{{ j.namespace }}/{{ j.job }}"><td class="l job">{{ j.namespace }}/<wbr>{{ j.job }}{% if j.split != "inside" %} <small title="share of the job in this week, split by {{ j.split }}">({{ f("ratio", j.week_fraction) }} in week)</small>{% endif %}{% if "lineage" in j %} <small data-k="lineage">{{ lineage_note(j) }}</small>{% endif %}</td>
{% if show_team %}<td class="l">{{ j.team }}</td>{% endif %}<td data-k="gpu_hours">{{ f("hours", j.gpu_hours) }}</td><td data-k="sm_active">{{ f("ratio", j.sm_active) }}</td><td data-k="tensor_active">{{ f("ratio", j.tensor_active) }}</td>
<td data-k="waste_gpu_hours">{{ f("hours", j.waste_gpu_hours) }}</td>{% if priced %}<td data-k="waste_cost">{{ f("money", j.waste_cost) }}</td>{% endif %}
<td class="l"><span class="v" style="background:{{ color(j.verdict) }}">{{ j.verdict }}</span></td><td class="advice">{{ j.advice or "" }}</td></tr>
{% endfor %}</table></div>{% else %}<p class="sub">No job with a waste figure.</p>{% endif %}
{%- endmacro %}
{% macro verdict_row(t) -%}{% for v in verdicts %}<td data-k="verdicts.{{ v }}">{{ t.verdicts.get(v, 0) }}</td>{% endfor %}{%- endmacro %}

<section data-team="{{ r.total.team }}">
{% if r.total.note %}<p class="note">{{ r.total.note }}</p>{% endif %}
{{ kpis(r.total) }}
<p>Efficiency is the GPU-hour-weighted <b>SM activity</b> of the measured jobs: the share of allocated GPU time in
which the SMs had work. “GPU utilization” only says that <i>some</i> kernel ran. Waste = measured GPU-hours ×
(1 − SM activity). GPU-hours without SM telemetry are <b>unmeasured</b>: shown on their own, never counted as waste or as efficient.
<b>MFU</b> is the model FLOPs over the precision's dense tensor peak (a MIG slice: its share), weighted by GPU-hours over the
jobs with tensor activity (without it a job has no MFU: n/a). <b>Recoverable GPU-hours</b> are the MFU gap: what the same work
would not have needed at its workload class's reference MFU (or its lineage's best run); counted apart from waste and never added to it (the gap also holds idle time).{% if r.prices.default or r.prices.per_model %} Costs at {{ price_text }} per GPU-hour.{% endif %}</p>
{% for c in charts %}<figure><img alt="{{ c.alt }}" src="data:image/png;base64,{{ c.png }}"><figcaption>{{ c.caption }}</figcaption></figure>{% endfor %}
{% if r.scope == "cluster" %}
<h2>Teams</h2>
<div class="scroll"><table data-table="teams">
<tr><th class="l">team</th>{% for key, label, kind in figures %}<th>{{ label|nw }}</th>{% endfor %}<th>actions</th></tr>
{% for t in r.teams %}<tr data-team="{{ t.team }}"><td class="l">{{ t.team }}</td>{% if t.jobs %}{% for key, label, kind in figures %}<td data-k="{{ key }}">{{ f(kind, t[key]) }}</td>{% endfor %}{% else %}<td data-k="no_data" colspan="{{ figures|length }}" class="l">no data</td>{% endif %}<td data-k="actions_total">{{ t.actions_total }}</td></tr>
{% endfor %}<tr data-team="{{ r.total.team }}"><th class="l">total</th>{% for key, label, kind in figures %}<th data-k="{{ key }}">{{ f(kind, r.total[key]) }}</th>{% endfor %}<th data-k="actions_total">{{ r.total.actions_total }}</th></tr>
</table></div>
<h2>MFU by team</h2>
<div class="scroll"><table data-table="mfu"><tr><th class="l">team</th>{{ mfu_head() }}</tr>
{% for t in r.teams %}<tr data-team="{{ t.team }}"><td class="l">{{ t.team }}</td>{{ mfu_row(t) }}</tr>{% endfor %}
<tr data-team="{{ r.total.team }}"><th class="l">total</th>{{ mfu_row(r.total) }}</tr></table></div>
<h2>Jobs by verdict</h2>
<div class="scroll"><table data-table="verdicts"><tr><th class="l">team</th>{% for v in verdicts %}<th><span class="v" style="background:{{ color(v) }}">{{ v }}</span></th>{% endfor %}</tr>
{% for t in r.teams %}<tr data-team="{{ t.team }}"><td class="l">{{ t.team }}</td>{{ verdict_row(t) }}</tr>{% endfor %}
<tr data-team="{{ r.total.team }}"><th class="l">total</th>{{ verdict_row(r.total) }}</tr></table></div>
<h2>Most wasteful jobs</h2>
{{ top(r.total) }}
<h2>Largest MFU gap</h2>
{{ gap(r.total) }}
{% else %}
<h2>MFU</h2>
<div class="scroll"><table data-table="mfu"><tr>{{ mfu_head() }}</tr>
<tr data-team="{{ r.total.team }}">{{ mfu_row(r.total) }}</tr></table></div>
<h2>Jobs by verdict</h2>
<div class="scroll"><table data-table="verdicts"><tr>{% for v in verdicts %}<th><span class="v" style="background:{{ color(v) }}">{{ v }}</span></th>{% endfor %}</tr>
<tr data-team="{{ r.total.team }}">{{ verdict_row(r.total) }}</tr></table></div>
<h2>Most wasteful jobs</h2>
{{ top(r.total) }}
<h2>Largest MFU gap</h2>
{{ gap(r.total) }}
{% endif %}
{% if r.total.actions %}<h3>Policy actions taken</h3><p>{% for a, n in r.total.actions.items() %}{{ a }}: <b>{{ n }}</b>{% if not loop.last %} · {% endif %}{% endfor %}</p>{% endif %}
<h2>Trend</h2>
<div class="scroll"><table data-table="trend"><tr><th class="l">week</th><th>{{ "GPU-hours"|nw }}</th><th>efficiency</th><th>MFU</th><th>{{ "waste GPU-h"|nw }}</th><th>{{ "recoverable GPU-h"|nw }}</th><th>{{ "unmeasured GPU-h"|nw }}</th></tr>
{% for p in r.total.trend %}<tr data-week="{{ p.week }}"><td class="l">{{ p.week }}</td>{% if p.jobs %}<td data-k="gpu_hours">{{ f("hours", p.gpu_hours) }}</td><td data-k="efficiency">{{ f("ratio", p.efficiency) }}</td><td data-k="mfu">{{ f("ratio", p.mfu) }}</td>
<td data-k="waste_gpu_hours">{{ f("hours", p.waste_gpu_hours) }}</td><td data-k="recoverable_gpu_hours">{{ f("hours", p.recoverable_gpu_hours) }}</td><td data-k="unmeasured_gpu_hours">{{ f("hours", p.unmeasured_gpu_hours) }}</td>{% else %}<td data-k="no_data" colspan="6" class="l">no data</td>{% endif %}</tr>{% endfor %}
</table></div>
</section>
{% if r.scope == "cluster" and per_team %}
<h2>Per team</h2>
{% for t in r.teams %}<section class="team" data-team="{{ t.team }}" id="team-{{ loop.index }}">
<h3>{{ t.team }}</h3>
{% if t.note %}<p class="note">{{ t.note }}</p>{% else %}{{ kpis(t) }}<p>MFU distribution: {{ hist(t) }}</p>{{ top(t) }}{{ gap(t) }}{% endif %}
</section>{% endfor %}
{% endif %}
<p class="sub">gpu-auditor weekly report · verdicts: docs/verdicts.md · figures: docs/reports.md</p>
</body></html>
"""

_env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=False)


def _no_break_in_words(label: str) -> Markup:
    """A header that wraps only between words: "waste GPU-h" never breaks as "waste GPU-" / "h"."""
    return Markup(" ").join(Markup('<span class="nw">{}</span>').format(w) if "-" in w else w for w in label.split(" "))


_env.filters["nw"] = _no_break_in_words
_tpl = _env.from_string(_TEMPLATE)


def _price_text(prices: Mapping[str, Any]) -> str:
    cur = prices.get("currency", "")
    parts = [f"{m}: {fmt('money', p, cur)}" for m, p in prices.get("per_model", {}).items()]
    parts.append(f"{'other GPUs' if parts else 'all GPUs'}: {fmt('money', prices.get('default', 0.0), cur)}")
    return ", ".join(parts)


def hist_bars(hist: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The MFU distribution as 20 bars (height: the bin's share of the largest bin's GPU-hours,
    as a CSS percentage; tooltip: the bin, its jobs and GPU-hours); [] without any job with an MFU."""
    cells: list[tuple[float, int]] = [(0.0, 0)] * MFU_BINS
    for b in hist:
        k = min(MFU_BINS - 1, max(0, round(float(b["lo"]) * MFU_BINS)))
        cells[k] = (cells[k][0] + float(b.get("gpu_hours") or 0.0), cells[k][1] + int(b.get("jobs") or 0))
    top = max(h for h, _ in cells)
    if not any(n for _, n in cells):
        return []
    return [
        (
            f"{100 * h / top:.0f}" if top > 0 else "0",
            f"MFU {5 * k}–{5 * (k + 1)} %: {n} jobs, {fmt('hours', h)} GPU-h",
        )
        for k, (h, n) in enumerate(cells)
    ]


def render_html(
    report: Mapping[str, Any], *, title: str | None = None, with_charts: bool = True, per_team: bool = True
) -> str:
    """The page for one report document (cluster scope: every team; team scope: one)."""
    cur = report["prices"].get("currency", "")
    total = report["total"]
    scope_name = "cluster" if report["scope"] == "cluster" else f"team {total['team']}"
    title = title or f"GPU efficiency {report['week']} · {scope_name}"
    figs: list[dict[str, str]] = []
    if with_charts:
        if report["scope"] == "cluster" and report["teams"]:
            figs.append(
                {
                    "png": charts.hours_by_team(report["teams"]),
                    "alt": "bar chart: SM-active, wasted and unmeasured GPU-hours per team",
                    "caption": "Where each team's GPU-hours went: SM-active, wasted (SMs idle) and unmeasured.",
                }
            )
        figs.append(
            {
                "png": charts.trend(total["trend"]),
                "alt": "chart: GPU-hours and efficiency over the last weeks",
                "caption": "GPU-hours per week (SM-active, wasted, unmeasured), efficiency (line) and MFU (dashed).",
            }
        )
        # one team's page keeps to the trend (its verdict counts are a table row): a chart
        # costs ~0.1-0.3 s, and a week's reports render one page per team
        rows = report["teams"] if report["scope"] == "cluster" else []
        if any(r["jobs"] for r in rows):
            figs.append(
                {
                    "png": charts.verdicts_by_team(rows),
                    "alt": "bar chart: jobs by verdict per team",
                    "caption": "Jobs active in the week, by verdict.",
                }
            )
    return _tpl.render(
        title=title,
        css=_CSS,
        r=report,
        figures=shown_figures(report),
        priced=priced(report),
        verdicts=VERDICTS,
        charts=figs,
        show_team=report["scope"] == "cluster",
        per_team=per_team,
        price_text=_price_text(report["prices"]),
        f=lambda kind, v: fmt(kind, v, cur),
        color=lambda v: charts.VERDICT_COLORS.get(v, "#999"),
        lineage_note=lambda j: lineage_note(j).strip(" ()"),
        headline=mfu_headline,
        hist_bars=hist_bars,
    )
