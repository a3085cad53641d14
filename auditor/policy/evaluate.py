"""Pure policy evaluation: one policy, one job summary, the job's facts and buckets → a verdict.

No I/O here: Kubernetes facts (annotations, labels) and the stored buckets are passed in, and
``now`` too. Safety rules live here and nowhere else:
- ``insufficient_data`` never fires, whatever the policy says;
- a condition on an absent field (``null``) is false, never "0 so below threshold";
- a sustained condition needs covered buckets, after the warm-up, for its whole duration;
- exemptions and snoozes are checked before anything is decided.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Sequence

from auditor.core.job_summary import JobSummary
from auditor.core.model import Bucket, Verdict
from auditor.core.rfc3339 import read_rfc3339
from auditor.policy.schema import SNOOZE_ANNOTATION, Policy, Sustained, glob_any

#: metric value (Metric enum value) → sustained field name, where the two differ
_FIELD_OF_METRIC = {"power": "power_w"}


@dataclass(frozen=True)
class JobFacts:
    """What Kubernetes says about the job (empty without Kubernetes: then label selectors and
    annotation opt-outs cannot match, and nothing is assumed)."""

    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_annotations: Mapping[str, str] = field(default_factory=dict)
    known: bool = False


@dataclass(frozen=True)
class Evaluation:
    """Whether ``policy`` fires on the job, and why (or why not)."""

    policy: str
    fires: bool
    reason: str
    evidence: dict[str, Any]
    #: why nothing may happen even though it fires or could: "exempt", "snoozed", ...; None = free
    blocked: str | None = None
    #: False when the job lacked data for a judgement (then an open violation is left as it is)
    judged: bool = True

    @property
    def exempt(self) -> bool:
        """Exempt jobs are left untouched: no violation is even opened."""
        return self.blocked is not None and not self.blocked.startswith("snoozed")

    @property
    def snoozed(self) -> bool:
        return self.blocked is not None and self.blocked.startswith("snoozed")


def snoozed_until(facts: JobFacts, now: datetime) -> datetime | None:
    """The snooze end from ``gpu-auditor.io/snooze-until`` when it lies in the future."""
    raw = facts.annotations.get(SNOOZE_ANNOTATION)
    if raw is None:
        return None
    t = read_rfc3339(raw)
    return t if t is not None and t > now else None


def _optout(value: str | None, policy: str, now: datetime) -> str | None:
    """Read an opt-out annotation value: ``true``, an RFC 3339 expiry, or a list of policy names."""
    if value is None:
        return None
    v = value.strip()
    if v.lower() in ("true", "yes", "1", "*"):
        return "opt-out annotation"
    t = read_rfc3339(v)
    if t is not None:
        return f"opt-out annotation until {v}" if t > now else None
    names = {x.strip() for x in v.split(",") if x.strip()}
    return "opt-out annotation for this policy" if policy in names else None


def exemption(policy: Policy, summary: JobSummary, facts: JobFacts, now: datetime) -> str | None:
    """Why the job is exempt from ``policy`` (None when it is not)."""
    ex = policy.spec.exemptions
    ns = summary.namespace
    if glob_any(ns, ex.namespaces):
        return f"namespace {ns} exempt by the policy"
    if glob_any(summary.team, ex.teams):
        return f"team {summary.team} exempt by the policy"
    if glob_any(f"{ns}/{summary.job}", ex.jobs):
        return "job exempt by the policy"
    why = _optout(facts.annotations.get(ex.annotation), policy.name, now)
    if why:
        return f"job {why} ({ex.annotation})"
    why = _optout(facts.namespace_annotations.get(ex.annotation), policy.name, now)
    if why:
        return f"namespace {why} ({ex.annotation})"
    return None


def selected(policy: Policy, summary: JobSummary, facts: JobFacts) -> str | None:
    """None when the selector takes the job, else why not."""
    s = policy.spec.selector
    ns = summary.namespace
    if s.namespaces and not glob_any(ns, s.namespaces):
        return "namespace not selected"
    if glob_any(ns, s.exclude_namespaces):
        return "namespace excluded"
    if s.teams and not glob_any(summary.team, s.teams):
        return "team not selected"
    if s.queues and not glob_any(summary.queue, s.queues):
        return "queue not selected"
    if s.kinds and summary.key.kind not in s.kinds:
        return "kind not selected"
    if s.gpu_models and not glob_any(summary.gpu_model, s.gpu_models):
        return "GPU model not selected"
    for k, v in s.labels.items():
        if facts.labels.get(k) is None or not glob_any(facts.labels.get(k), [v]):
            return f"label {k} not matched"
    gpus = summary.gpus
    if s.min_gpus and (gpus is None or gpus < s.min_gpus):
        return "fewer GPUs than minGpus"
    return None


@dataclass(frozen=True)
class SustainedResult:
    holds: bool
    evidence: dict[str, Any]


def _bucket_means(buckets: Iterable[Bucket]) -> dict[datetime, dict[str, tuple[float, int]]]:
    acc: dict[datetime, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    ends: dict[datetime, datetime] = {}
    for b in buckets:
        if b.count <= 0:
            continue
        name = _FIELD_OF_METRIC.get(b.metric.value, b.metric.value)
        cell = acc[b.start][name]
        cell[0] += b.total
        cell[1] += b.count
        ends[b.start] = max(ends.get(b.start, b.end), b.end)
    return {s: {k: (t / c, int(c)) for k, (t, c) in m.items()} for s, m in acc.items()}


def evaluate_sustained(
    rule: Sustained, buckets: Sequence[Bucket], now: datetime, *, job_start: datetime | None = None
) -> SustainedResult:
    """Do all of ``rule.conditions`` hold in every covered bucket of the trailing window?

    The window is ``[end - for, end)`` where ``end`` is the end of the last bucket not after
    ``now``. The job's start (``job_start``, else its first bucket given) starts its warm-up; the
    window must begin after it, so ``buckets`` need only cover the trailing window. A bucket
    is covered when it has samples of every field the conditions name; covered buckets must be at
    least ``minCoverage`` of the window's buckets. Any covered bucket that breaks a condition, or
    too little coverage, and it does not hold.
    """
    usable = [b for b in buckets if b.end <= now + timedelta(seconds=1)]
    if not usable:
        return SustainedResult(False, {"reason": "no stored buckets"})
    width = min(b.end - b.start for b in usable)
    if width <= timedelta(0):
        return SustainedResult(False, {"reason": "degenerate buckets"})
    first = min(b.start for b in usable)
    if job_start is not None:
        first = min(first, job_start)
    end = max(b.end for b in usable)
    start = end - rule.duration
    ev: dict[str, Any] = {
        "window_start": start.isoformat(),
        "window_end": end.isoformat(),
        "for_s": rule.duration.total_seconds(),
        "warmup_s": rule.warmup.total_seconds(),
        "conditions": [c.describe() for c in rule.conditions],
    }
    if start < first + rule.warmup:
        return SustainedResult(False, {**ev, "reason": "job younger than warm-up + duration"})
    means = _bucket_means(b for b in usable if start <= b.start < end)
    expected = max(1, round(rule.duration / width))
    needed = {c.field for c in rule.conditions}
    covered = {s: m for s, m in means.items() if needed <= m.keys()}
    coverage = min(1.0, len(covered) / expected)
    ev.update({"buckets_expected": expected, "buckets_covered": len(covered), "coverage": round(coverage, 4)})
    if coverage < rule.min_coverage:
        return SustainedResult(False, {**ev, "reason": f"coverage {coverage:.2f} < {rule.min_coverage:g}"})
    worst: dict[str, float] = {}
    for s in sorted(covered):
        for c in rule.conditions:
            v = covered[s][c.field][0]
            if not c.holds(v):
                return SustainedResult(
                    False, {**ev, "reason": f"{c.field}={v:.3f} at {s.isoformat()} breaks {c.describe()}"}
                )
            worst[c.field] = v if c.field not in worst else (max if c.op in ("<", "<=") else min)(worst[c.field], v)
    # in the conditions' order, as ``worst``: a set's order would differ from process to process
    fields = dict.fromkeys(c.field for c in rule.conditions)
    means_all = {f: round(sum(covered[s][f][0] for s in covered) / len(covered), 4) for f in fields}
    return SustainedResult(True, {**ev, "means": means_all, "worst": {k: round(v, 4) for k, v in worst.items()}})


def evaluate(
    policy: Policy,
    summary: JobSummary,
    *,
    now: datetime,
    facts: JobFacts = JobFacts(),
    buckets: Sequence[Bucket] | None = None,
    lineage_best: float | None = None,
) -> Evaluation:
    """Decide whether ``policy`` fires on the job of ``summary`` (pure). ``lineage_best``: the
    best MFU estimate of the earlier runs of the job's lineage (the ``lineage`` condition), None
    when it has none."""
    name = policy.name
    verdict = summary.verdict.value
    m = summary.means
    figures: dict[str, Any] = {
        "verdict": verdict,
        "gpu_util": m.gpu_util,
        "sm_active": m.sm_active,
        "tensor_active": m.tensor_active,
        "dram_active": m.dram_active,
        "coverage": summary.coverage,
        "gpu_hours": summary.gpu_hours,
        "waste_gpu_hours": summary.waste_gpu_hours,
        "gpus": summary.gpus,
        "gpu_model": summary.gpu_model,
        "mfu_estimate": summary.mfu_estimate,
        "mfu_reference": summary.mfu_reference,
        "mfu_class": summary.mfu_class,
        "recoverable_gpu_hours": summary.recoverable_gpu_hours,
    }
    if summary.verdict is Verdict.INSUFFICIENT_DATA:
        return Evaluation(name, False, "insufficient data: no judgement", figures, judged=False)
    why_not = selected(policy, summary, facts)
    if why_not:
        return Evaluation(name, False, why_not, figures)
    spec = policy.spec
    if spec.verdicts and verdict not in spec.verdicts:
        return Evaluation(name, False, f"verdict {verdict} not in {spec.verdicts}", figures)
    held = []
    for c in spec.conditions:
        v = summary.value_of(c.field)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return Evaluation(name, False, f"{c.field} is missing: no judgement", figures, judged=False)
        if not c.holds(float(v)):
            return Evaluation(name, False, f"{c.field}={v:.3f} does not meet {c.describe()}", figures)
        held.append(f"{c.field}={v:.3f} {c.op} {c.value:g}")
    evidence: dict[str, Any] = dict(figures)
    if spec.lineage is not None:
        mfu = summary.mfu_estimate
        if mfu is None:
            return Evaluation(name, False, "mfu_estimate is missing: no judgement", figures, judged=False)
        if lineage_best is None:
            return Evaluation(name, False, "no earlier run of its lineage with an MFU estimate", figures)
        bar = spec.lineage.below_best * lineage_best
        evidence["lineage_best_mfu"] = round(lineage_best, 4)
        if not mfu < bar:
            return Evaluation(
                name, False, f"mfu_estimate={mfu:.3f} is not below {spec.lineage.describe()} ({bar:.3f})", evidence
            )
        held.append(f"mfu_estimate={mfu:.3f} < {spec.lineage.below_best:g} x its lineage's best {lineage_best:.3f}")
    if spec.sustained is not None:
        if buckets is None:
            return Evaluation(name, False, "no stored buckets for the sustained condition", figures, judged=False)
        sr = evaluate_sustained(spec.sustained, buckets, now, job_start=summary.start)
        evidence["sustained"] = sr.evidence
        if not sr.holds:
            return Evaluation(name, False, "sustained: " + str(sr.evidence.get("reason")), evidence)
        held.append(
            f"{' and '.join(c.describe() for c in spec.sustained.conditions)} for {_human(spec.sustained.duration)}"
        )
    reason = f"{verdict}: " + ("; ".join(held) if held else f"verdict is {verdict}")
    blocked = exemption(policy, summary, facts, now)
    if blocked is None:
        until = snoozed_until(facts, now)
        if until is not None:
            blocked = f"snoozed until {until.isoformat()}"
    return Evaluation(name, True, reason, evidence, blocked=blocked)


def _human(d: timedelta) -> str:
    s = int(d.total_seconds())
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"
