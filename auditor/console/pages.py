"""The console's pages as HTML text: one function per page, values in, a document out.

Pure rendering: the values come from :mod:`auditor.console.ports` (read by the app), ``now``
is passed in. The markup is in jinja2 templates (``templates/``, one per view, ``base.html``
around them) rendered with autoescape on and undefined names an error: names, reasons and
evidence come from the cluster and may hold markup, and no value reaches a page unescaped unless
it is markup made here (the svg charts, whose text :mod:`auditor.console.svg` escapes itself; a
query string, which :func:`urllib.parse.urlencode` percent-encodes). Verdict colours are
:data:`auditor.render.VERDICT_COLORS`, as on the static pages and in the reports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import jinja2
from jinja2.ext import Extension
from markupsafe import Markup

from auditor.console import svg
from auditor.console.cells import hours, job_rows, pct, t
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
from auditor.core.gate import Acknowledgement, GateDecision, LineageHistory
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


# ---------------------------------------------------------------------- templates


class _JoinLines(Extension):
    """A template's line breaks, and the indentation after them, are not output: the templates
    are written one element a line, the pages stay one line as they always were (the golden
    pages, tests/golden/page/, hold them byte for byte). A space that matters is written before
    the line break; a tag is never broken across lines."""

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        return _BREAK.sub("", source)


_BREAK = re.compile(r"\n[ \t]*")


def _text(value: object) -> object:
    """Every value a template prints passes here before autoescape: markup made here is kept,
    anything else is escaped by :func:`~auditor.console.svg.esc`, so the pages' text and the
    charts' text are escaped alike (``&#x27;``, ``&quot;``: markupsafe would write ``&#39;``)."""
    if hasattr(value, "__html__"):
        return value
    text = str(value)
    # without a quote markupsafe's escape is svg.esc's (and 4x faster: a page may hold 10,000 rows)
    return Markup(esc(text)) if "'" in text or '"' in text else text


def _qs(params: Mapping[str, object]) -> Markup:
    """A query string: percent-encoded by urlencode, so it holds no character HTML would read."""
    return Markup(urlencode(params))


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("auditor.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    finalize=_text,
    extensions=[_JoinLines],
)
_env.filters.update(t=t, hours=hours, pct=pct, n=lambda x: f"{x:,}", qs=_qs)
_env.globals.update(verdict_colors=VERDICT_COLORS, gpus_text=gpus_text)


def _render(view: str, **values: Any) -> Markup:
    return Markup(_env.get_template(f"{view}.html").render(**values))


def layout(base: str, active: str, title: str, body: str, now: datetime, *, writes: bool) -> str:
    """The document around a view; ``body`` is a view this module rendered (kept as markup)."""
    return _render("base", base=base, nav=NAV, active=active, title=title, body=Markup(body), now=now, writes=writes)


def error(message: str) -> str:
    return _render("error", message=message)


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
    bars = [
        (v, h, VERDICT_COLORS.get(v, "#999")) for v, h in sorted(c.gpu_hours_by_verdict.items(), key=lambda x: -x[1])
    ]
    this_week = sorted((x for x in teams if x.week == week), key=lambda x: -x.waste_gpu_hours)
    waste_bars = [(x.team, x.waste_gpu_hours, METRIC_COLORS["waste"]) for x in this_week]
    by_gap = sorted((x for x in this_week if x.gap.referenced_jobs), key=lambda x: -x.gap.recoverable_gpu_hours)
    gap_bars = [(x.team, x.gap.recoverable_gpu_hours, "#ef6c00") for x in by_gap]
    return _render(
        "cluster",
        base=base,
        c=c,
        tiles=tiles,
        gap_sentence=gap_sentence(c.gap, c.waste_gpu_hours),
        bars=bars,
        this_week=this_week,
        by_gap=by_gap,
        # svg.py escapes every label it draws: its charts are markup
        verdict_chart=Markup(svg.hbars(bars, title="GPU-hours by verdict", unit=" h")),
        waste_chart=Markup(svg.hbars(waste_bars, title=f"Waste GPU-hours by team, week {week}", unit=" h")),
        gap_chart=Markup(svg.hbars(gap_bars, title=f"Recoverable GPU-hours (MFU gap) by team, week {week}", unit=" h")),
    )


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
    charts = [  # svg.py escapes every label it draws
        Markup(svg.lines(weeks, waste, title="Waste GPU-hours per week", unit=" h")),
        Markup(svg.lines(weeks, eff_pct, title="Efficiency per week (SM activity, jobs with SM data)", unit="%")),
        Markup(svg.lines(weeks, mfu_pct, title="MFU per week (GPU-hour-weighted, jobs with an estimate)", unit="%")),
        Markup(svg.lines(weeks, gap, title="Recoverable GPU-hours per week (MFU gap)", unit=" h")),
    ]
    return _render(
        "teams",
        base=base,
        charts=charts,
        headers=headers,
        # newest week, most waste first
        rows=sorted(rows, key=lambda r: (r.week, r.waste_gpu_hours), reverse=True),
        priced=priced,
    )


# ---------------------------------------------------------------------- jobs


def _query(f: JobFilter, **change: object) -> Markup:
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
    return _qs({k: v for k, v in doc.items() if v not in ("", None)})


def jobs(base: str, page: JobPage, f: JobFilter) -> str:
    heads: list[tuple[str, Markup | None, str]] = []
    for key, label in JOB_COLUMNS:
        if not key:
            heads.append((label, None, ""))
            continue
        desc = not f.descending if key == f.sort else key not in ("job", "team", "verdict", "namespace")
        mark = (" ▼" if f.descending else " ▲") if key == f.sort else ""
        heads.append((label, _query(f, sort=key, desc="1" if desc else "0", offset=0), mark))
    first, last = f.offset + 1 if page.total else 0, min(f.offset + f.limit, page.total)
    # a page may hold 10,000 rows: each verdict's badge is rendered once
    badge = _env.get_template("_macros.html").module.verdict  # type: ignore[attr-defined]
    return _render(
        "jobs",
        base=base,
        page=page,
        f=f,
        heads=heads,
        rows=job_rows(base, page.rows, {v: badge(v) for v in {r.verdict for r in page.rows}}),
        columns=len(JOB_COLUMNS),
        first=first,
        last=last,
        previous=_query(f, offset=max(f.offset - f.limit, 0)) if f.offset > 0 else None,
        next=_query(f, offset=f.offset + f.limit) if last < page.total else None,
    )


# ---------------------------------------------------------------------- one job


def _gpu_label(b: Bucket) -> str:
    """The pod and its GPU, named as the findings and ``explain`` name it (``host:gpuN``)."""
    gpu = b.gpu
    name = f"{b.pod.pod} {gpu_name(gpu.hostname, gpu.index, gpu.uuid, gpu.instance)}"
    return name + (f" ({gpu.mig_profile})" if gpu.mig_profile else "")


def timelines(d: JobDetail) -> list[Markup]:
    """One chart per GPU of the job: util, SM, tensor and DRAM activity per bucket ([]: no buckets)."""
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
    if lo is None or hi is None:
        return []
    return [  # svg.py escapes the label (a pod name) itself
        Markup(svg.timeline({m: sorted(v) for m, v in per_gpu[label].items()}, lo, hi, title=label))
        for label in sorted(per_gpu, key=natural_key)
    ]


def _admission(d: JobDetail) -> list[tuple[str, str]] | None:
    a = d.admission
    if a is None:
        return None
    return [
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


def job(base: str, d: JobDetail, writes: Writes | None, *, paused: JobSnooze | None = None) -> str:
    """One job: its figures, findings, timelines, lineage (with writes, the acknowledging form),
    its escalation's snooze (issue 30), Kueue admission, decisions and violations."""
    r = d.row
    findings = [
        (
            x.get("code", ""),
            x.get("message", ""),
            json.dumps(x.get("evidence", {}), indent=1, sort_keys=True, default=str),
        )
        for x in d.summary.get("findings") or ()
        if isinstance(x, Mapping)
    ]
    # svg.py escapes the gauge's label (the class name) itself
    gauge = Markup(svg.mfu_gauge(r.mfu_estimate, r.mfu_reference, source=r.mfu_class, gpu_hours=r.gpu_hours))
    return _render(
        "job",
        base=base,
        d=d,
        w=writes,
        paused=paused,
        findings=findings,
        gauge=gauge,
        charts=timelines(d),
        admission=_admission(d),
        ack_label=ACK_LABEL,
        snooze_label=snooze_label(DEFAULT_SNOOZE),
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
    rows = [(v, *next_step(v, ladders.get(v.policy), now)) for v in open_]
    return _render("policy", base=base, open=open_, rows=rows, recent=recent)


# ---------------------------------------------------------------------- gate


@dataclass(frozen=True, slots=True)
class _Held:
    """A row of the gate page: a lineage the rules hold (``held``), or, without rules, one with
    unacknowledged findings."""

    name: str
    cluster: str
    team: str
    state: str
    held: bool
    reason: str
    until: str


def gate(
    base: str,
    histories: Sequence[LineageHistory],
    decisions: Mapping[tuple[str, str, str], GateDecision | None],
    now: datetime,
    *,
    rules: int,
    on: bool = True,
) -> str:
    rows: list[_Held] = []
    acks: list[tuple[str, Acknowledgement]] = []
    for h in histories:
        d = decisions.get((h.key.cluster, h.key.namespace, h.key.lineage))
        name = f"{h.key.namespace}/{h.key.lineage}"
        acks.extend((name, a) for a in h.acks)
        if d is not None:
            if d.action.value == "admit" and d.would.value == "admit":
                continue
            state = d.action.value + ("" if d.action == d.would else f" (would {d.would.value})")
            rows.append(_Held(name, h.key.cluster, h.team, state, True, d.reason, t(d.until) or "until acknowledged"))
        elif rules == 0 and h.open_findings(now):
            rows.append(_Held(name, h.key.cluster, h.team, "flagged", False, ", ".join(h.open_findings(now)), ""))
    acks.sort(key=lambda x: x[1].at, reverse=True)
    return _render("gate", base=base, rows=rows, acks=acks, rules=rules, on=on)


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
    return _render(
        "deliveries",
        base=base,
        counts=sorted(counts.items()),
        reports=reports,
        alerts=alerts,
        delivery_state=delivery_state,
        action_state=action_state,
    )
