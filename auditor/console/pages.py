"""The console's pages as HTML text: one function per page, values in, a document out.

Pure rendering: the values come from :mod:`auditor.console.ports` (read by the app), ``now``
is passed in, and every value from the store passes through :func:`~auditor.console.svg.esc`
(names, reasons and evidence come from the cluster and may hold markup). Verdict colours are
:data:`auditor.render.VERDICT_COLORS`, as on the static pages and in the reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from auditor.console import svg
from auditor.console.ports import (
    ActionRow,
    ClusterNow,
    DeliveryRow,
    JobDetail,
    JobFilter,
    JobPage,
    MfuSums,
    TeamWeek,
    ViolationRow,
)
from auditor.console.svg import esc
from auditor.core.acklink import ACK_LABEL, DEFAULT_SNOOZE, snooze_label
from auditor.core.figures import gpu_name, gpus_text, natural_key
from auditor.core.gate import GateDecision, LineageHistory
from auditor.core.job_snooze import JobSnooze
from auditor.core.model import Bucket
from auditor.render import METRIC_COLORS, VERDICT_COLORS

NAV = (
    ("", "Cluster"),
    ("teams", "Teams"),
    ("jobs", "Jobs"),
    ("policy", "Policy"),
    ("gate", "Gate"),
    ("deliveries", "Deliveries"),
)
#: the job list's columns: (sort key or "", header)
JOB_COLUMNS = (
    ("job", "job"),
    ("team", "team"),
    ("verdict", "verdict"),
    ("gpu_hours", "GPU-h"),
    ("waste_gpu_hours", "waste GPU-h"),
    ("sm_active", "SM"),
    ("tensor_active", "tensor"),
    ("mfu_estimate", "MFU"),
    ("recoverable_gpu_hours", "recoverable GPU-h"),
    ("start", "start"),
    ("end", "end"),
    ("", "state"),
)


@dataclass(frozen=True, slots=True)
class Step:
    """One rung of a policy's escalation ladder, as the policy page explains it."""

    actions: tuple[str, ...]
    after: timedelta
    cooldown: timedelta


@dataclass(frozen=True, slots=True)
class Writes:
    """What the job page needs to offer acknowledging: the form's token and who will be recorded."""

    token: str
    user: str


def t(value: datetime | None) -> str:
    """A time as the console prints it (UTC, minutes)."""
    return "" if value is None else value.isoformat(" ", "minutes")[:16]


def hours(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def span(d: timedelta) -> str:
    """A duration in the largest whole unit that fits (3d, 4h, 30m, 0m)."""
    s = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}" + (f"{(s % size) // 3600}h" if unit == "d" and s % size >= 3600 else "")
    return f"{s}s"


def verdict(v: str) -> str:
    color = VERDICT_COLORS.get(v, "#999")
    return f'<span class="verdict" style="background:{color}">{esc(v or "none")}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "", empty: str = "none") -> str:
    """A table of cells already escaped (``rows``); ``headers`` are escaped here."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">{esc(empty)}</td></tr>'
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def layout(base: str, active: str, title: str, body: str, now: datetime, *, writes: bool) -> str:
    nav = "".join(
        f'<a href="{base}/{path}"{" class=active" if path == active else ""}>{esc(name)}</a>' for path, name in NAV
    )
    mode = "writes enabled" if writes else "read-only"
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · gpu-auditor</title>"
        f'<link rel=stylesheet href="{base}/static/console.css">'
        f'<script defer src="{base}/static/console.js"></script></head><body>'
        f'<header><span class="brand">gpu-auditor</span><nav>{nav}</nav>'
        f'<span class="meta">{esc(mode)} · {esc(t(now))} UTC</span></header>'
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>"
    )


def job_link(base: str, job_id: int | None, label: str) -> str:
    return esc(label) if job_id is None else f'<a href="{base}/jobs/{job_id}">{esc(label)}</a>'


# ---------------------------------------------------------------------- cluster


def gap_sentence(gap: MfuSums, waste: float) -> str:
    """The MFU gap beside waste, never added to it (the weekly report's headline, in the console's units)."""
    referenced = gap.referenced_jobs
    if not referenced:
        return (
            "No job had a reference MFU (no workload class with a reference, no lineage history): "
            f"no recoverable GPU-hours are claimed. Waste (flagged jobs' SMs idle): {hours(waste)} GPU-h."
        )
    jobs = "this job" if referenced == 1 else f"these {referenced:,} jobs"
    return (
        f"At their class's reference MFU {jobs} would have needed {hours(gap.recoverable_gpu_hours)} fewer GPU-hours "
        f"(the MFU gap). Waste (flagged jobs' SMs idle, {hours(waste)} GPU-h) is counted apart and never added to it: "
        "the gap also holds a job's idle time."
    )


def cluster(base: str, c: ClusterNow, teams: Sequence[TeamWeek], week: str) -> str:
    total = sum(c.gpu_hours_by_verdict.values())
    tiles = [
        ("running jobs", f"{c.running_jobs:,}"),
        ("GPUs allocated", f"{c.gpus_allocated:,.0f}"),
        ("GPUs reporting now", f"{c.gpus_seen:,}"),
        ("GPUs idle (seen today, no job now)", f"{c.gpus_idle_seen:,}"),
        (f"GPU-hours since {t(c.since)}", hours(total)),
        (f"jobs to look at (flagged, since {t(c.since)})", f"{c.flagged_jobs:,}"),
        ("waste GPU-hours (flagged jobs' idle SMs)", hours(c.waste_gpu_hours)),
        ("headroom GPU-hours (healthy jobs' idle SMs)", hours(c.headroom_gpu_hours)),
        ("MFU (GPU-hour-weighted)", pct(c.gap.mfu) or "n/a"),
        ("recoverable GPU-hours (MFU gap)", hours(c.gap.recoverable) or "n/a"),
        ("last audit cycle", t(c.last_cycle) or "never"),
    ]
    tile_html = "".join(f'<div class="tile"><b>{esc(v)}</b><span>{esc(k)}</span></div>' for k, v in tiles)
    bars = [
        (v, h, VERDICT_COLORS.get(v, "#999")) for v, h in sorted(c.gpu_hours_by_verdict.items(), key=lambda x: -x[1])
    ]
    this_week = sorted((x for x in teams if x.week == week), key=lambda x: -x.waste_gpu_hours)
    waste_bars = [(x.team, x.waste_gpu_hours, METRIC_COLORS["waste"]) for x in this_week]
    jobs = table(
        ("verdict", "jobs", "GPU-hours"),
        (
            (f'<a href="{base}/jobs?verdict={esc(v)}">{verdict(v)}</a>', f"{c.jobs_by_verdict.get(v, 0):,}", hours(h))
            for v, h, _ in bars
        ),
    )
    why = table(
        ("team", "waste GPU-hours", "efficiency (SM activity)", "most waste from"),
        ((esc(x.team), hours(x.waste_gpu_hours), pct(x.efficiency), _why(base, x)) for x in this_week),
        cls="why",
        empty="no data this week",
    )
    by_gap = sorted((x for x in this_week if x.gap.referenced_jobs), key=lambda x: -x.gap.recoverable_gpu_hours)
    gap_bars = [(x.team, x.gap.recoverable_gpu_hours, "#ef6c00") for x in by_gap]
    gap = table(
        ("team", "MFU", "jobs with a reference", "recoverable GPU-hours"),
        (
            (
                f'<a href="{base}/jobs?{urlencode({"team": x.team, "sort": "recoverable_gpu_hours", "desc": "1"})}">'
                f"{esc(x.team)}</a>",
                pct(x.gap.mfu) or "n/a",
                f"{x.gap.referenced_jobs:,}",
                hours(x.gap.recoverable_gpu_hours),
            )
            for x in by_gap
        ),
        cls="gap",
        empty="no job with a reference MFU this week",
    )
    return (
        f'<section class="tiles">{tile_html}</section>'
        f'<p class="gapnote">{esc(gap_sentence(c.gap, c.waste_gpu_hours))}</p>'
        f'<section class="grid2"><div>{svg.hbars(bars, title="GPU-hours by verdict", unit=" h")}{jobs}</div>'
        f"<div>{svg.hbars(waste_bars, title=f'Waste GPU-hours by team, week {week}', unit=' h')}{why}</div></section>"
        f'<section class="grid2"><div>{svg.hbars(gap_bars, title=f"Recoverable GPU-hours (MFU gap) by team, week {week}", unit=" h")}'
        f"{gap}</div></section>"
    )


def _why(base: str, x: TeamWeek) -> str:
    """The verdict behind most of a team's waste, linked to those jobs (most waste first)."""
    v = x.main_waste
    if not v:
        return ""
    q = urlencode({"team": x.team, "verdict": v, "sort": "waste_gpu_hours", "desc": "1"})
    return f'<a href="{base}/jobs?{q}">{verdict(v)}</a> {hours(x.waste_by_verdict[v])} h'


# ---------------------------------------------------------------------- teams


def teams(base: str, rows: Sequence[TeamWeek], weeks: Sequence[str], currency: str) -> str:
    names = sorted({r.team for r in rows}, key=lambda n: -sum(r.waste_gpu_hours for r in rows if r.team == n))
    cell = {(r.team, r.week): r for r in rows}
    waste = {n: [cell[(n, w)].waste_gpu_hours if (n, w) in cell else None for w in weeks] for n in names}
    eff = {n: [cell[(n, w)].efficiency if (n, w) in cell else None for w in weeks] for n in names}
    eff_pct = {n: [None if v is None else 100 * v for v in vs] for n, vs in eff.items()}
    mfu = {n: [cell[(n, w)].gap.mfu if (n, w) in cell else None for w in weeks] for n in names}
    mfu_pct = {n: [None if v is None else 100 * v for v in vs] for n, vs in mfu.items()}
    gap = {n: [cell[(n, w)].gap.recoverable if (n, w) in cell else None for w in weeks] for n in names}
    priced = any(r.cost is not None for r in rows)
    headers = ["team", "week", "jobs", "GPU-hours", "waste GPU-hours", "headroom GPU-hours", "efficiency"]
    headers += ["most waste from"]
    headers += ["MFU", "recoverable GPU-hours"]
    headers += [currency] if priced else []
    body = []
    for r in sorted(rows, key=lambda r: (r.week, r.waste_gpu_hours), reverse=True):  # newest week, most waste first
        cells = [
            f'<a href="{base}/jobs?{urlencode({"team": r.team})}">{esc(r.team)}</a>',
            esc(r.week),
            f"{r.jobs:,}",
            hours(r.gpu_hours),
            hours(r.waste_gpu_hours),
            hours(r.headroom_gpu_hours),
            pct(r.efficiency),
            _why(base, r),
            pct(r.gap.mfu) or "n/a",
            hours(r.gap.recoverable) or "n/a",
        ]
        if priced:
            cells.append("" if r.cost is None else f"{r.cost:,.2f}")
        body.append(cells)
    return (
        '<section class="grid2">'
        f"<div>{svg.lines(weeks, waste, title='Waste GPU-hours per week', unit=' h')}</div>"
        f"<div>{svg.lines(weeks, eff_pct, title='Efficiency per week (SM activity, jobs with SM data)', unit='%')}</div>"
        "</section>"
        '<section class="grid2">'
        f"<div>{svg.lines(weeks, mfu_pct, title='MFU per week (GPU-hour-weighted, jobs with an estimate)', unit='%')}</div>"
        f"<div>{svg.lines(weeks, gap, title='Recoverable GPU-hours per week (MFU gap)', unit=' h')}</div>"
        "</section>"
        '<p class="hint">Weeks without a team\'s jobs are left out (no data), never shown as zero. Waste: the idle-SM '
        "GPU-hours of flagged jobs (a wasteful verdict); headroom: those of healthy jobs, never added to waste; "
        "efficiency: the SM activity of the jobs with SM data, weighted by GPU-hours (docs/figures.md). MFU: model FLOPs "
        "over the precision's dense tensor peak; recoverable GPU-hours: what the same work would not have needed at "
        "the job's class reference MFU (n/a: no job with a reference), a separate loss from waste.</p>"
        '<input class="filter" data-table="teams" placeholder="filter teams">'
        + table(headers, body, cls="sortable teams", empty="no data")
    )


# ---------------------------------------------------------------------- jobs


def _query(f: JobFilter, **change: object) -> str:
    doc: dict[str, object] = {
        "team": f.team,
        "namespace": f.namespace,
        "verdict": f.verdict,
        "q": f.text,
        "state": f.state,
        "sort": f.sort,
        "desc": "1" if f.descending else "0",
        "limit": f.limit,
        "offset": f.offset,
    }
    doc.update(change)
    return urlencode({k: v for k, v in doc.items() if v not in ("", None)})


def _select(name: str, current: str, values: Sequence[str], label: str) -> str:
    opts = [f'<option value="">{esc(label)}: all</option>'] + [
        f'<option value="{esc(v)}"{" selected" if v == current else ""}>{esc(v)}</option>' for v in values
    ]
    return f'<select name="{name}" aria-label="{esc(label)}">{"".join(opts)}</select>'


def jobs(base: str, page: JobPage, f: JobFilter) -> str:
    form = (
        f'<form class="filters" method="get" action="{base}/jobs">'
        + _select("team", f.team, page.teams, "team")
        + _select("namespace", f.namespace, page.namespaces, "namespace")
        + _select("verdict", f.verdict, page.verdicts, "verdict")
        + _select("state", f.state, ("running", "ended"), "state")
        + f'<input name="q" value="{esc(f.text)}" placeholder="job name contains">'
        + f'<input type="hidden" name="sort" value="{esc(f.sort)}"><input type="hidden" name="desc" value="{1 if f.descending else 0}">'
        + f'<input type="hidden" name="limit" value="{f.limit}">'
        + '<button type="submit">filter</button></form>'
    )
    heads = []
    for key, label in JOB_COLUMNS:
        if not key:
            heads.append(f"<th>{esc(label)}</th>")
            continue
        desc = not f.descending if key == f.sort else key not in ("job", "team", "verdict", "namespace")
        mark = (" ▼" if f.descending else " ▲") if key == f.sort else ""
        heads.append(
            f'<th><a href="{base}/jobs?{_query(f, sort=key, desc="1" if desc else "0", offset=0)}">{esc(label)}{mark}</a></th>'
        )
    # a page may hold 10,000 rows: each distinct text is escaped once
    cache: dict[str, str] = {}

    def e(text: str) -> str:
        done = cache.get(text)
        if done is None:
            done = cache[text] = esc(text)
        return done

    badges = {v: verdict(v) for v in {r.verdict for r in page.rows}}
    out = []
    for r in page.rows:
        out.append(
            f'<tr><td><a href="{base}/jobs/{r.id}">{e(r.namespace)}/{e(r.kind)}/{esc(r.name)}</a></td>'
            f"<td>{e(r.team)}</td><td>{badges[r.verdict]}</td>"
            f"<td>{hours(r.gpu_hours)}</td><td>{hours(r.waste_gpu_hours)}</td><td>{pct(r.sm_active)}</td>"
            f"<td>{pct(r.tensor_active)}</td><td>{pct(r.mfu_estimate) or 'n/a'}</td><td>{hours(r.recoverable_gpu_hours)}</td>"
            f"<td>{t(r.start)}</td><td>{t(r.end)}</td>"
            f"<td>{'running' if r.running else 'ended'}</td></tr>"
        )
    if not out:
        out.append(f'<tr><td colspan="{len(JOB_COLUMNS)}" class="empty">no jobs match</td></tr>')
    first, last = f.offset + 1 if page.total else 0, min(f.offset + f.limit, page.total)
    pager = [f'<span id="count">{first:,}–{last:,} of {page.total:,} jobs</span>']
    if f.offset > 0:
        pager.append(f'<a href="{base}/jobs?{_query(f, offset=max(f.offset - f.limit, 0))}">previous</a>')
    if last < page.total:
        pager.append(f'<a href="{base}/jobs?{_query(f, offset=f.offset + f.limit)}" rel="next">next</a>')
    return (
        form
        + f'<p class="pager">{" ".join(pager)}</p>'
        + f'<div class="scroll"><table class="jobs"><thead><tr>{"".join(heads)}</tr></thead>'
        + f"<tbody>{''.join(out)}</tbody></table></div>"
    )


# ---------------------------------------------------------------------- one job


def _gpu_label(b: Bucket) -> str:
    """The pod and its GPU, named as the findings and ``explain`` name it (``host:gpuN``)."""
    gpu = b.gpu
    name = f"{b.pod.pod} {gpu_name(gpu.hostname, gpu.index, gpu.uuid, gpu.instance)}"
    return name + (f" ({gpu.mig_profile})" if gpu.mig_profile else "")


def timelines(d: JobDetail) -> str:
    """One chart per GPU of the job: util, SM, tensor and DRAM activity per bucket."""
    per_gpu: dict[str, dict[str, list[tuple[datetime, float]]]] = {}
    lo: datetime | None = None
    hi: datetime | None = None
    for b in d.buckets:
        mean = b.mean
        if mean is None:
            continue
        series = per_gpu.setdefault(_gpu_label(b), {m: [] for m in svg.METRIC_COLORS})
        series.setdefault(b.metric.value, []).append((b.start, mean))
        lo = b.start if lo is None or b.start < lo else lo
        hi = b.end if hi is None or b.end > hi else hi
    if not per_gpu or lo is None or hi is None:
        return '<p class="empty">no buckets stored for this job (older than the bucket retention, or never sampled)</p>'
    charts = []
    for label in sorted(per_gpu, key=natural_key):
        series = {m: sorted(v) for m, v in per_gpu[label].items()}
        charts.append(f'<div class="gpu">{svg.timeline(series, lo, hi, title=label)}</div>')
    return f'<div class="timelines">{"".join(charts)}</div>'


def _evidence(ev: object) -> str:
    return f"<pre>{esc(json.dumps(ev, indent=1, sort_keys=True, default=str))}</pre>"


def _lineage(h: LineageHistory | None) -> str:
    if h is None:
        return '<p class="empty">no lineage recorded for this job</p>'
    runs = table(
        ("job", "verdict", "start", "end", "GPU-h", "waste GPU-h", "findings", "final"),
        (
            (
                esc(r.job),
                verdict(r.verdict),
                t(r.start),
                t(r.end),
                hours(r.gpu_hours),
                hours(r.waste_gpu_hours),
                esc(", ".join(r.findings)),
                "yes" if r.final else "",
            )
            for r in reversed(h.runs)
        ),
        empty="no runs",
    )
    return (
        f"<p>lineage <b>{esc(h.key.namespace)}/{esc(h.key.lineage)}</b> (cluster {esc(h.key.cluster)})</p>"
        + runs
        + _acks(h)
    )


def _acks(h: LineageHistory) -> str:
    return table(
        ("kind", "by", "at", "until", "reason", "via"),
        (
            (esc(a.kind.value), esc(a.by), t(a.at), t(a.until) or "no end", esc(a.reason), esc(a.via))
            for a in reversed(h.acks)
        ),
        cls="acks",
        empty="no acknowledgements",
    )


def _ack_form(base: str, d: JobDetail, w: Writes) -> str:
    if d.lineage is None:
        return ""
    key = d.lineage.key
    hidden = (
        f'<input type="hidden" name="csrf" value="{esc(w.token)}">'
        f'<input type="hidden" name="cluster" value="{esc(key.cluster)}">'
        f'<input type="hidden" name="lineage" value="{esc(key.namespace)}/{esc(key.lineage)}">'
        f'<input type="hidden" name="job" value="{d.row.id}">'
    )
    until = "".join(
        f'<option value="{v}"{" selected" if v == "7d" else ""}>{label}</option>'
        for v, label in (("1d", "1 day"), ("7d", "7 days"), ("30d", "30 days"), ("", "no end (ack only)"))
    )
    return (
        f'<form class="ack" method="post" action="{base}/ack">{hidden}'
        f'<input name="reason" placeholder="why (recorded)" maxlength="500">'
        f'<select name="until" aria-label="until">{until}</select>'
        f'<button type="submit" name="kind" value="ack" id="ack-button">{esc(ACK_LABEL)}</button>'
        '<button type="submit" name="kind" value="snooze" id="snooze-button">admit every re-submission until then (gate)</button>'
        f'<span class="hint">recorded as {esc(w.user)}</span></form>'
    )


def _snooze_form(base: str, d: JobDetail, w: Writes | None, paused: JobSnooze | None) -> str:
    """The running job's escalation (issue 30): its snooze in force, and with writes the alert's
    other button, "Snooze this job's escalation for 24 h" (the ladder, not the gate)."""
    state = f'<p class="snoozed">Escalation {esc(paused.text())}.</p>' if paused is not None else ""
    if w is None:
        return state
    return state + (
        f'<form class="snooze" method="post" action="{base}/ack">'
        f'<input type="hidden" name="csrf" value="{esc(w.token)}">'
        f'<input type="hidden" name="job" value="{d.row.id}">'
        '<input name="reason" placeholder="why (recorded)" maxlength="500">'
        f'<button type="submit" name="kind" value="job-snooze" id="job-snooze-button">{esc(snooze_label(DEFAULT_SNOOZE))}</button>'
        f'<span class="hint">no alert, Event or requeue meanwhile; recorded as {esc(w.user)}</span></form>'
    )


def _admission(d: JobDetail) -> str:
    a = d.admission
    if a is None:
        return '<p class="empty">not seen in a Kueue queue</p>'
    facts = [
        ("Workload", a.workload),
        ("LocalQueue", a.local_queue or ""),
        ("ClusterQueue", a.cluster_queue or ""),
        ("created", t(a.created)),
        ("quota reserved", t(a.quota_reserved_at)),
        ("admitted", t(a.admitted_at)),
        ("queue wait", "" if a.queue_wait_s is None else f"{a.queue_wait_s:,.0f} s"),
        ("last admitted", t(a.last_admitted_at)),
        ("evictions", ", ".join(f"{k}: {v}" for k, v in sorted(a.evictions.items())) or "none"),
        ("requeues", str(a.requeues)),
        ("last eviction", f"{a.last_eviction_reason or ''} {t(a.last_evicted_at)}".strip()),
        ("pending now", "yes" if a.pending else "no"),
    ]
    return "<dl class=facts>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts) + "</dl>"


def _decisions(d: JobDetail) -> str:
    rows = []
    for dec in reversed(d.decisions):
        acts = (
            "; ".join(
                f"{esc(a.action)}: <b>{esc(a.state)}</b> ({a.attempts} tries, {t(a.updated_at)})"
                + (f" — {esc(a.error)}" if a.error else "")
                for a in dec.actions
            )
            or "none"
        )
        rows.append(
            (
                t(dec.decided_at),
                esc(dec.policy),
                str(dec.step + 1),
                esc(dec.mode) + (" (dry run)" if dec.dry_run else ""),
                verdict(dec.verdict),
                esc(dec.reason),
                acts,
            )
        )
    return table(
        ("decided", "policy", "step", "mode", "verdict", "reason", "actions: outcome"),
        rows,
        cls="decisions",
        empty="no decisions",
    )


def job(base: str, d: JobDetail, writes: Writes | None, *, paused: JobSnooze | None = None) -> str:
    s, r = d.summary, d.row
    figures = [
        ("verdict", verdict(r.verdict)),
        ("team", esc(r.team)),
        ("GPUs", esc(gpus_text(s.get("gpus")))),
        ("GPU model", esc(s.get("gpu_model") or "")),
        ("GPU-hours", hours(r.gpu_hours)),
        ("waste GPU-hours", hours(r.waste_gpu_hours)),
        ("util", pct(s.get("gpu_util"))),
        ("SM active", pct(r.sm_active)),
        ("tensor active", pct(r.tensor_active)),
        ("DRAM active", pct(s.get("dram_active"))),
        ("MFU", pct(r.mfu_estimate) or "n/a (no tensor activity)"),
        (
            "reference MFU",
            f"{pct(r.mfu_reference)} ({esc(r.mfu_class or '')})" if r.mfu_reference is not None else "none applies",
        ),
        ("recoverable GPU-hours", hours(r.recoverable_gpu_hours) if r.recoverable_gpu_hours is not None else "n/a"),
        ("coverage", pct(s.get("coverage"))),
        ("start", t(r.start)),
        ("end", t(r.end)),
        (
            "state",
            "running" if r.running else f"ended {t(d.ended_at)}" if d.ended_at else f"not seen since {t(d.last_seen)}",
        ),
        ("queue", esc(d.queue or "")),
        ("uid", esc(d.uid or "")),
    ]
    facts = "<dl class=facts>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in figures) + "</dl>"
    findings = "".join(
        f"<li><b>{esc(x.get('code', ''))}</b>: {esc(x.get('message', ''))}"
        f"<details><summary>evidence</summary>{_evidence(x.get('evidence', {}))}</details></li>"
        for x in s.get("findings") or ()
        if isinstance(x, Mapping)
    )
    violations = table(
        ("policy", "episode", "opened", "last seen", "next step", "last step"),
        (
            (esc(v.policy), str(v.episode), t(v.opened_at), t(v.last_seen_at), str(v.next_step + 1), t(v.last_step_at))
            for v in d.violations
        ),
        empty="no violations",
    )
    gauge = svg.mfu_gauge(r.mfu_estimate, r.mfu_reference, source=r.mfu_class, gpu_hours=r.gpu_hours)
    return (
        facts
        + f'<div class="gauge">{gauge}</div>'
        + f"<h2>Findings</h2><ul class=findings>{findings or '<li>none</li>'}</ul>"
        + "<h2>Per-GPU timelines</h2>"
        + timelines(d)
        + "<h2>Lineage history</h2>"
        + _lineage(d.lineage)
        + (_ack_form(base, d, writes) if writes is not None else "")
        + _snooze_form(base, d, writes, paused)
        + "<h2>Kueue admission</h2>"
        + _admission(d)
        + "<h2>Decisions and actions</h2>"
        + _decisions(d)
        + "<h2>Policy violations</h2>"
        + violations
    )


# ---------------------------------------------------------------------- policy


def next_step(v: ViolationRow, ladder: Sequence[Step] | None, now: datetime) -> tuple[str, str]:
    """(what the next step does, when it is due) of an open violation; a step already due runs
    at the operator's next cycle."""
    if ladder is None:
        return "policy not loaded here", ""
    if v.next_step >= len(ladder):
        return "ladder done", ""
    step = ladder[v.next_step]
    due = v.opened_at + step.after
    if v.last_step_at is not None:
        due = max(due, v.last_step_at + step.cooldown)
    when = f"next cycle (due since {t(due)})" if due <= now else t(due)
    return f"step {v.next_step + 1}: {', '.join(step.actions)}", when


def policy(
    base: str,
    open_: Sequence[ViolationRow],
    ladders: Mapping[str, Sequence[Step]],
    recent: Sequence[ActionRow],
    now: datetime,
) -> str:
    rows = []
    for v in open_:
        what, when = next_step(v, ladders.get(v.policy), now)
        rows.append(
            (job_link(base, v.job_id, v.job), esc(v.policy), t(v.opened_at), t(v.last_step_at), esc(what), when)
        )
    acts = (
        (
            t(a.updated_at),
            esc(a.job),
            esc(a.policy),
            esc(a.action),
            f"<b>{esc(a.state)}</b>",
            str(a.attempts),
            esc(a.error or ""),
        )
        for a in recent
    )
    return (
        f"<h2>Open violations ({len(open_)})</h2>"
        '<input class="filter" data-table="violations" placeholder="filter violations">'
        + table(
            ("job", "policy", "opened", "last step", "next step", "due"),
            rows,
            cls="sortable violations",
            empty="no open violations",
        )
        + "<h2>Actions of the last 7 days</h2>"
        + table(
            ("updated", "job", "policy", "action", "state", "attempts", "error"),
            acts,
            cls="sortable",
            empty="no actions",
        )
    )


# ---------------------------------------------------------------------- gate


def gate(
    base: str,
    histories: Sequence[LineageHistory],
    decisions: Mapping[tuple[str, str, str], GateDecision | None],
    now: datetime,
    *,
    rules: int,
    on: bool = True,
) -> str:
    rows = []
    acks = []
    for h in histories:
        k = (h.key.cluster, h.key.namespace, h.key.lineage)
        d = decisions.get(k)
        name = f"{h.key.namespace}/{h.key.lineage}"
        for a in h.acks:
            acks.append(
                (
                    a.at,
                    (
                        t(a.at),
                        esc(name),
                        esc(a.kind.value),
                        esc(a.by),
                        t(a.until) or "no end",
                        esc(a.reason),
                        esc(a.via),
                    ),
                )
            )
        if d is not None:
            held = d.action.value != "admit" or d.would.value != "admit"
            if not held:
                continue
            state = esc(d.action.value) + ("" if d.action == d.would else f" (would {esc(d.would.value)})")
            rows.append(
                (
                    esc(name),
                    esc(h.key.cluster),
                    esc(h.team),
                    f"<b>{state}</b>",
                    esc(d.reason),
                    t(d.until) or "until acknowledged",
                )
            )
        elif rules == 0 and h.open_findings(now):
            rows.append(
                (esc(name), esc(h.key.cluster), esc(h.team), "flagged", esc(", ".join(h.open_findings(now))), "")
            )
    note = (
        ""
        if rules
        else '<p class="hint">No gate rules (GatePolicy) are loaded here: lineages with unacknowledged findings are listed.</p>'
    )
    if not on:
        note += (
            '<p class="hint">The gate is off (gate.enabled: false): nothing is held; the table says what its '
            "rules would decide for each lineage's next submission.</p>"
        )
    return (
        f"<h2>Held and deprioritized lineages ({len(rows)})</h2>"
        + note
        + table(
            ("lineage", "cluster", "team", "gate", "reason", "until"),
            rows,
            cls="sortable held",
            empty="no held lineages",
        )
        + "<h2>Acknowledgements and snoozes</h2>"
        + table(
            ("at", "lineage", "kind", "by", "until", "reason", "via"),
            (r for _, r in sorted(acks, key=lambda x: x[0], reverse=True)),
            cls="sortable acks",
            empty="no acknowledgements",
        )
    )


# ---------------------------------------------------------------------- deliveries


def delivery_state(d: DeliveryRow) -> str:
    if d.status == "claimed":
        return "retrying" if d.attempts > 1 else "sending"
    return d.status


def action_state(a: ActionRow) -> str:
    return {"done": "sent", "waiting": "retrying", "claimed": "sending"}.get(a.state, a.state)


def deliveries(base: str, reports: Sequence[DeliveryRow], alerts: Sequence[ActionRow]) -> str:
    counts: dict[str, int] = {}
    for s in [delivery_state(d) for d in reports] + [action_state(a) for a in alerts]:
        counts[s] = counts.get(s, 0) + 1
    tiles = "".join(f'<div class="tile"><b>{n:,}</b><span>{esc(s)}</span></div>' for s, n in sorted(counts.items()))
    return (
        f'<section class="tiles">{tiles}</section>'
        "<h2>Weekly reports</h2>"
        + table(
            ("week", "team", "channel", "state", "attempts", "claimed", "sent", "error"),
            (
                (
                    esc(d.week),
                    esc(d.team),
                    esc(d.channel),
                    f"<b>{esc(delivery_state(d))}</b>",
                    str(d.attempts),
                    t(d.claimed_at),
                    t(d.sent_at),
                    esc(d.error or ""),
                )
                for d in reports
            ),
            cls="sortable",
            empty="no report deliveries",
        )
        + "<h2>Alerts (policy notify actions, last 7 days)</h2>"
        + table(
            ("updated", "job", "policy", "state", "attempts", "next try", "error"),
            (
                (
                    t(a.updated_at),
                    esc(a.job),
                    esc(a.policy),
                    f"<b>{esc(action_state(a))}</b>",
                    str(a.attempts),
                    t(a.due_at),
                    esc(a.error or ""),
                )
                for a in alerts
            ),
            cls="sortable",
            empty="no alerts",
        )
    )


def error(message: str) -> str:
    return f'<p class="error">{esc(message)}</p>'
