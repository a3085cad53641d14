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

from auditor.core.figures import gpu_name, natural_key
from auditor.core.job_summary import GpuSummary, JobSummary
from auditor.core.model import Bucket, Verdict
from auditor.core.rfc3339 import read_rfc3339
from auditor.core.rightsizing import right_size
from auditor.policy.schema import (
    PER_GPU_FIELDS,
    SNOOZE_ANNOTATION,
    Condition,
    Policy,
    RightsizingCondition,
    Spec,
    Sustained,
    glob_any,
)

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
    #: the conditions the job failed (the first only, unless evaluated with ``all_misses``)
    misses: tuple[Miss, ...] = ()

    @property
    def near_miss(self) -> Miss | None:
        """The one condition a judged job failed when it failed exactly that one (else None). A
        job of another verdict is no near miss: it has another problem, not a threshold's."""
        if not self.judged or self.fires or len(self.misses) != 1:
            return None
        return self.misses[0] if self.misses[0].near else None

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
        why = f"coverage {coverage:.2f} < {rule.min_coverage:g}"
        broken = {
            "condition": f"minCoverage {rule.min_coverage:g}",
            "value": round(coverage, 4),
            "threshold": rule.min_coverage,
        }
        return SustainedResult(False, {**ev, "reason": why, "breaks": broken})
    worst: dict[str, float] = {}
    for s in sorted(covered):
        for c in rule.conditions:
            v = covered[s][c.field][0]
            if not c.holds(v):
                broken = {"condition": c.describe(), "value": round(v, 4), "threshold": c.value, "at": s.isoformat()}
                reason = f"{c.field}={v:.3f} at {s.isoformat()} breaks {c.describe()}"
                return SustainedResult(False, {**ev, "reason": reason, "breaks": broken})
            worst[c.field] = v if c.field not in worst else (max if c.op in ("<", "<=") else min)(worst[c.field], v)
    # in the conditions' order, as ``worst``: a set's order would differ from process to process
    fields = dict.fromkeys(c.field for c in rule.conditions)
    means_all = {f: round(sum(covered[s][f][0] for s in covered) / len(covered), 4) for f in fields}
    return SustainedResult(True, {**ev, "means": means_all, "worst": {k: round(v, 4) for k, v in worst.items()}})


@dataclass(frozen=True)
class Miss:
    """One condition a judged job failed, with its value and the threshold it missed: what a
    near miss (``policy simulate``) says, so that an admin sees how far a job was from firing."""

    condition: str
    value: Any
    threshold: Any
    reason: str
    #: False when the job is no near miss for it: another verdict (another problem), or a lineage
    #: without an earlier run to compare with (nothing to come near to)
    near: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"condition": self.condition, "value": self.value, "threshold": self.threshold, "reason": self.reason}


def verdict_may_match(policy: Policy, summary: JobSummary) -> bool:
    """Whether ``policy``'s verdicts can take the job: its own verdict, or under ``gpus`` one of
    its GPUs' (the runner asks Kubernetes for the opt-out annotations only then)."""
    wanted = policy.spec.verdicts
    if not wanted:
        return True
    if summary.verdict.value in wanted:
        return True
    return policy.spec.gpus is not None and any(g.verdict.value in wanted for g in summary.per_gpu)


class _NoJudgement(Exception):
    """A field a condition needs is missing: the job is not judged (never "0, so below")."""


def _check(c: Condition, v: object, misses: list[Miss], held: list[str]) -> None:
    """Test condition ``c`` on value ``v``: a held one joins ``held``, a failed one ``misses``."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise _NoJudgement(f"{c.field} is missing: no judgement")
    if c.holds(float(v)):
        held.append(f"{c.field}={v:.3f} {c.op} {c.value:g}")
    else:
        misses.append(Miss(c.describe(), v, c.value, f"{c.field}={v:.3f} does not meet {c.describe()}"))


def _gpu_value(row: GpuSummary | JobSummary, name: str) -> object:
    if isinstance(row, JobSummary):
        return row.value_of(name)
    return getattr(row.means, name) if hasattr(row.means, name) else getattr(row, name, None)


def _gpu_label(row: GpuSummary | JobSummary) -> str:
    """The pod and its GPU as every surface names them (the findings' ``pod host:gpuN``)."""
    if isinstance(row, JobSummary):
        return "the job"
    return f"{row.pod} {gpu_name(row.hostname or '', row.gpu or '', row.uuid, row.mig_instance or '')}"


def _buckets_by_gpu(buckets: Sequence[Bucket]) -> dict[tuple[str, str, str, str], list[Bucket]]:
    out: dict[tuple[str, str, str, str], list[Bucket]] = defaultdict(list)
    for b in buckets:
        out[(b.pod.namespace, b.pod.pod, b.gpu.uuid, b.gpu.instance)].append(b)
    return out


def _judge_gpus(
    policy: Policy, summary: JobSummary, *, now: datetime, buckets: Sequence[Bucket] | None, all_misses: bool
) -> tuple[list[str], list[Miss], dict[str, Any]]:
    """``gpus``: each GPU is judged on its own verdict, the per-GPU conditions and ``sustained``
    over its own buckets; then the quorum. A summary without per-GPU rows (an older stored one, a
    suite's example) is one GPU: the job. Returns what held, the misses and the evidence."""
    spec = policy.spec
    quorum = spec.gpus
    assert quorum is not None
    rows: Sequence[GpuSummary | JobSummary] = summary.per_gpu or (summary,)
    conds = [c for c in spec.conditions if c.field in PER_GPU_FIELDS]
    by_gpu = _buckets_by_gpu(buckets) if buckets is not None and summary.per_gpu else None
    met, judged, first_miss = [], 0, None
    sustained_evidence: dict[str, Any] | None = None
    table = []
    for row in rows:
        misses: list[Miss] = []
        why = ""
        if spec.verdicts and row.verdict.value not in spec.verdicts:
            text = f"verdict {row.verdict.value} not in {spec.verdicts}"
            misses.append(Miss("verdict", row.verdict.value, spec.verdicts, text, near=False))
        try:
            for c in conds:
                _check(c, _gpu_value(row, c.field), misses, [])
        except _NoJudgement as exc:
            why = str(exc)
        if not why and spec.sustained is not None and (all_misses or not misses):
            if buckets is None:
                why = "no stored buckets for the sustained condition"
            else:
                mine = (
                    buckets
                    if by_gpu is None or isinstance(row, JobSummary)
                    else by_gpu.get((row.namespace, row.pod, row.uuid, row.mig_instance or ""), [])
                )
                sr = evaluate_sustained(spec.sustained, mine, now, job_start=row.start)
                sustained_evidence = sr.evidence
                if not sr.holds:
                    misses.append(_sustained_miss(sr))
        judged += not why
        if not why and not misses:
            met.append(row)
        elif first_miss is None and misses:
            first_miss = misses[0]
        if len(rows) == 1:  # one GPU: judged as a whole job is, with the same reasons and evidence
            if why:
                raise _NoJudgement(why)
            evidence = {} if sustained_evidence is None else {"sustained": sustained_evidence}
            return _held(spec, conds, met, "") if met else [], misses, evidence
        table.append({"gpu": _gpu_label(row), "meets": not why and not misses, "why": why or _reasons(misses)})
    if not judged:
        raise _NoJudgement(f"no GPU of the job could be judged ({table[0]['why']})")
    hours = [r.gpu_hours if r.gpu_hours is not None else 1.0 for r in rows]
    share = sum(h for r, h in zip(rows, hours) if r in met) / (sum(hours) or 1.0)
    evidence = {
        "gpus_judged": {
            "met": len(met),
            "of": len(rows),
            "gpu_hours_share": round(share, 4),
            "quorum": quorum.describe(),
            "per_gpu": sorted(table, key=lambda g: natural_key(g["gpu"])),  # gpu2 before gpu10
        }
    }
    got = f"{len(met)} of {len(rows)} GPUs ({share:.0%} of its GPU-hours) meet it"
    if spec.verdicts and not any(r.verdict.value in spec.verdicts for r in rows):
        why = f"no GPU's verdict in {spec.verdicts}"
        return [], [Miss("verdict", sorted({r.verdict.value for r in rows}), spec.verdicts, why, near=False)], evidence
    if len(met) >= quorum.at_least and share >= quorum.share - 1e-9:
        return _held(spec, conds, met, got), [], evidence
    reason = f"{got}; needs {quorum.describe()}" + (f" (the others: {first_miss.reason})" if first_miss else "")
    enough = len(met) >= quorum.at_least
    miss = Miss(
        f"gpus: {quorum.describe()}",
        round(share, 4) if enough else len(met),
        quorum.share if enough else quorum.at_least,
        reason,
    )
    return [], [miss], evidence


def _reasons(misses: Sequence[Miss]) -> str:
    return "; ".join(m.reason for m in misses)


def _held(spec: Spec, conds: Sequence[Condition], met: Sequence[GpuSummary | JobSummary], got: str) -> list[str]:
    """What held, worded as for a job judged whole, at the met GPU nearest each threshold."""
    held = [got + (f", each {' or '.join(spec.verdicts)}" if spec.verdicts else "")] if got else []
    for c in conds:
        values = [float(v) for r in met if isinstance(v := _gpu_value(r, c.field), (int, float))]
        v = (max if c.op in ("<", "<=") else min)(values)
        held.append(f"{c.field}={v:.3f} {c.op} {c.value:g}")
    if spec.sustained is not None:
        held.append(_sustained_text(spec.sustained))
    return held


def evaluate(
    policy: Policy,
    summary: JobSummary,
    *,
    now: datetime,
    facts: JobFacts = JobFacts(),
    buckets: Sequence[Bucket] | None = None,
    lineage_best: float | None = None,
    all_misses: bool = False,
) -> Evaluation:
    """Decide whether ``policy`` fires on the job of ``summary`` (pure). ``lineage_best``: the
    best MFU estimate of the earlier runs of the job's lineage (the ``lineage`` condition), None
    when it has none. ``all_misses``: judge every condition, not only up to the first that fails,
    so that :attr:`Evaluation.misses` lists them all (a backtest's near misses; the operator's
    cycle stops at the first)."""
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
    per_gpu = spec.gpus is not None
    misses: list[Miss] = []
    held: list[str] = []
    evidence: dict[str, Any] = dict(figures)

    def done() -> bool:
        return bool(misses) and not all_misses

    def missed() -> Evaluation:
        return Evaluation(name, False, misses[0].reason, evidence, misses=tuple(misses))

    try:
        if not per_gpu and spec.verdicts and verdict not in spec.verdicts:
            why = f"verdict {verdict} not in {spec.verdicts}"
            misses.append(Miss("verdict", verdict, spec.verdicts, why, near=False))
            if done():
                return Evaluation(name, False, misses[0].reason, figures, misses=tuple(misses))
        for c in spec.conditions:
            if per_gpu and c.field in PER_GPU_FIELDS:
                continue
            _check(c, summary.value_of(c.field), misses, held)
            if done():
                return Evaluation(name, False, misses[0].reason, figures, misses=tuple(misses))
        if spec.lineage is not None:
            mfu = summary.mfu_estimate
            if mfu is None:
                raise _NoJudgement("mfu_estimate is missing: no judgement")
            if lineage_best is None:
                why = "no earlier run of its lineage with an MFU estimate"
                misses.append(Miss(spec.lineage.describe(), mfu, None, why, near=False))
            else:
                bar = spec.lineage.below_best * lineage_best
                evidence["lineage_best_mfu"] = round(lineage_best, 4)
                if not mfu < bar:
                    misses.append(
                        Miss(
                            spec.lineage.describe(),
                            mfu,
                            round(bar, 4),
                            f"mfu_estimate={mfu:.3f} is not below {spec.lineage.describe()} ({bar:.3f})",
                        )
                    )
                else:
                    held.append(
                        f"mfu_estimate={mfu:.3f} < {spec.lineage.below_best:g} x its lineage's best {lineage_best:.3f}"
                    )
            if done():
                return missed()
        if spec.rightsizing is not None:
            _judge_rightsizing(spec.rightsizing, summary, evidence, misses, held)
            if done():
                return missed()
        if per_gpu:
            got, gpu_misses, gpu_evidence = _judge_gpus(
                policy, summary, now=now, buckets=buckets, all_misses=all_misses
            )
            held += got
            misses += gpu_misses
            evidence.update(gpu_evidence)
        elif spec.sustained is not None:
            if buckets is None:
                raise _NoJudgement("no stored buckets for the sustained condition")
            sr = evaluate_sustained(spec.sustained, buckets, now, job_start=summary.start)
            evidence["sustained"] = sr.evidence
            if not sr.holds:
                misses.append(_sustained_miss(sr))
            else:
                held.append(_sustained_text(spec.sustained))
    except _NoJudgement as exc:
        return Evaluation(name, False, str(exc), figures, judged=False)
    if misses:
        return missed()
    reason = f"{verdict}: " + ("; ".join(held) if held else f"verdict is {verdict}")
    blocked = exemption(policy, summary, facts, now)
    if blocked is None:
        until = snoozed_until(facts, now)
        if until is not None:
            blocked = f"snoozed until {until.isoformat()}"
    return Evaluation(name, True, reason, evidence, blocked=blocked)


def _judge_rightsizing(
    rule: RightsizingCondition, summary: JobSummary, evidence: dict[str, Any], misses: list[Miss], held: list[str]
) -> None:
    """The ``rightsizing`` condition (issue 32): the job's right-sizing advice with the policy's
    headroom; a job never advised (multi-GPU, too short, does not fit, ...) is no near miss."""
    rs = right_size(summary, rule.rules())
    evidence["right_size"] = rs.to_json()
    freed = rs.gpu_hours_freed
    if not rs.advised or rs.mig_profile is None or freed is None:
        misses.append(Miss(rule.describe(), None, None, f"no smaller slice: {rs.reason} ({rs.detail})", near=False))
    elif freed < rule.min_gpu_hours_freed:
        why = f"a MIG {rs.mig_profile} slice would free {freed:.2f} GPU-hours, under {rule.min_gpu_hours_freed:g}"
        misses.append(Miss(rule.describe(), freed, rule.min_gpu_hours_freed, why))
    else:
        held.append(f"a MIG {rs.mig_profile} slice would hold it, freeing {freed:.2f} GPU-hours")


def _sustained_miss(sr: SustainedResult) -> Miss:
    """The failed sustained condition: the bucket's value and the threshold it broke, or the
    coverage short of ``minCoverage`` (null both when the job is too young or has no buckets)."""
    broken = sr.evidence.get("breaks") or {}
    what = f"sustained: {broken['condition']}" if broken else "sustained"
    return Miss(what, broken.get("value"), broken.get("threshold"), "sustained: " + str(sr.evidence.get("reason")))


def _sustained_text(rule: Sustained) -> str:
    return f"{' and '.join(c.describe() for c in rule.conditions)} for {_human(rule.duration)}"


def _human(d: timedelta) -> str:
    s = int(d.total_seconds())
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"
