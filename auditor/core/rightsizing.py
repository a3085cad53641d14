"""Right-sizing advice (issue 32, part 3): would this job run as well on a MIG slice of its GPU,
or on a smaller GPU class, and what would that free?

Pure: a job's audit-JSON summary in, a :class:`RightSizing` out (advice, or why none).

**What the job needs**, from its life's figures (:class:`~auditor.core.job_summary.MetricStats`
are over the bucket means):

- memory: the peak framebuffer used (``fb_used`` max), in MiB. A slice must hold it with
  ``memory_headroom`` to spare: an out-of-memory error is fatal, so the peak, never a mean.
- SMs: the larger of the peak SM activity and the SM activity *while the GPU is busy* (mean SM
  activity ÷ mean busy signal, ``gpu_util`` or ``gr_engine_active``). The second matters: a job
  that fills the GPU in short bursts and waits between them (a synchronous data loader) shows a
  low per-second SM activity, yet each burst needs the whole GPU — on a slice every burst runs
  several times longer and the job slows down. Times the GPU's SMs, this must fit the slice's
  SMs with ``compute_headroom`` to spare. Tensor activity is judged the same way (it is a share
  of the same SMs' cycles).
- memory bandwidth: DRAM activity, peak and while busy, likewise; a slice gets its share of
  the memory (and of the memory bandwidth), so a decode-bound server may fit the SMs of a 1g
  slice but not its bandwidth.

On a MIG slice already, the activities are shares of that slice; they are scaled to SMs and
bandwidth by its profile before comparing.

**Never advised** (``reason`` says which): too little data (``insufficient_data``), an idle job
(release it rather than shrink it), a job on several GPUs (``multi_gpu``: its ranks talk over
NVLink and a slice's share of that is neither measured nor given), a GPU shared with other pods
(the device's memory and activity include theirs), a life shorter than ``min_span`` or a
coverage below ``min_coverage``, a GPU model without a profile table and no GPU class given,
absent memory or SM figures, and a job whose needs fit no smaller slice (``does_not_fit``).

**Freed**: the GPU-hours the job held minus what the slice would hold (a slice's share of a
GPU is the larger of its compute slices /7 and its memory share), priced at the model's price
per GPU-hour when one is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from auditor.core.job_summary import JobSummary
from auditor.core.metrics import Metric
from auditor.core.mig_profiles import MIG_MODELS, MigModel, MigProfile, mig_model
from auditor.core.model import Finding, Verdict

FINDING_CODE = "right_size"


@dataclass(frozen=True, slots=True)
class GpuClass:
    """A smaller GPU a job could move to: its memory, its compute and memory bandwidth relative
    to the GPU models named in ``instead_of`` (substrings of ``modelName``, case-insensitive),
    and its price per GPU-hour. Sites list their own (prices and the classes on offer differ)."""

    name: str
    memory_mib: float
    relative_compute: float
    price_per_gpu_hour: float | None = None
    instead_of: tuple[str, ...] = ()
    relative_bandwidth: float | None = None  # None: as relative_compute

    def replaces(self, gpu_model: str | None) -> bool:
        low = (gpu_model or "").lower()
        return bool(low) and any(s.lower() in low for s in self.instead_of)


@dataclass(frozen=True, slots=True)
class RightSizingRules:
    """The thresholds (settings ``rightsizing:``, docs/rightsizing.md)."""

    memory_headroom: float = 0.20
    compute_headroom: float = 0.20
    min_span: timedelta = timedelta(hours=1)
    min_coverage: float = 0.80
    gpu_classes: tuple[GpuClass, ...] = ()
    models: tuple[MigModel, ...] = MIG_MODELS


@dataclass(frozen=True, slots=True)
class Needs:
    """What the job needs, in the whole GPU's units: MiB, SMs, and a share of its memory
    bandwidth (1.0: all of it); ``sm_share`` is the SMs as a share of the whole GPU."""

    memory_mib: float
    sms: float
    sm_share: float
    bandwidth: float

    def to_json(self) -> dict[str, object]:
        return {
            "peak_memory_mib": round(self.memory_mib, 1),
            "sms_needed": round(self.sms, 1),
            "sm_share_needed": round(self.sm_share, 4),
            "bandwidth_share_needed": round(self.bandwidth, 4),
        }


@dataclass(frozen=True, slots=True)
class RightSizing:
    """The advice for one job. ``advised``: a slice or class fits; ``reason``: a code
    (``fits``, ``does_not_fit``, ``multi_gpu``, …) and ``detail`` the sentence that says why."""

    advised: bool
    reason: str
    detail: str
    gpu_model: str | None = None
    current: str | None = None
    mig_profile: str | None = None
    mig_share: float | None = None
    gpu_class: str | None = None
    gpu_hours: float | None = None
    gpu_hours_freed: float | None = None
    cost_freed: float | None = None
    class_cost_freed: float | None = None
    needs: Needs | None = None
    evidence: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "advised": self.advised,
            "reason": self.reason,
            "detail": self.detail,
            "gpu_model": self.gpu_model,
            "current": self.current,
            "mig_profile": self.mig_profile,
            "mig_share": self.mig_share,
            "gpu_class": self.gpu_class,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_freed": self.gpu_hours_freed,
            "cost_freed": self.cost_freed,
            "class_cost_freed": self.class_cost_freed,
            **(self.needs.to_json() if self.needs else {}),
        }


def _no(reason: str, detail: str, job: JobSummary) -> RightSizing:
    return RightSizing(False, reason, detail, gpu_model=job.gpu_model, gpu_hours=job.gpu_hours)


def _stat_max(job: JobSummary, m: Metric) -> float | None:
    st = job.stats.get(m)
    return None if st is None else st.max


def _demand(job: JobSummary, m: Metric) -> float | None:
    """A ratio metric's demand: its peak, or its mean while the GPU is busy if higher."""
    peak = _stat_max(job, m)
    mean = job.means.of_metric(m)
    if peak is None or mean is None:
        return None
    busy = job.means.of_metric(job.busy_signal) if job.busy_signal else None
    while_busy = mean / busy if busy else 0.0
    return min(1.0, max(peak, while_busy))


def needs_of(job: JobSummary, scale_sms: float, scale_bandwidth: float) -> Needs | None:
    """The job's needs; activities are shares of what it ran on (``scale_sms`` SMs and
    ``scale_bandwidth`` of the whole GPU's bandwidth). None without memory or SM figures."""
    mem = _stat_max(job, Metric.FB_USED)
    sm = _demand(job, Metric.SM_ACTIVE)
    if mem is None or sm is None:
        return None
    tensor = _demand(job, Metric.TENSOR_ACTIVE) or 0.0
    dram = _demand(job, Metric.DRAM_ACTIVE) or 0.0
    sms = max(sm, tensor) * scale_sms
    return Needs(memory_mib=mem, sms=sms, sm_share=sms / scale_sms, bandwidth=dram * scale_bandwidth)


def _misfit(model: MigModel, p: MigProfile, n: Needs, rules: RightSizingRules) -> str | None:
    """Why ``p`` does not hold ``n`` (None: it does)."""
    if n.memory_mib > p.memory_mib * (1 - rules.memory_headroom):
        return f"peak memory {n.memory_mib:.0f} MiB > {1 - rules.memory_headroom:.0%} of {p.name}'s {p.memory_mib} MiB"
    if n.sms > p.sms * (1 - rules.compute_headroom):
        return f"{n.sms:.0f} SMs needed > {1 - rules.compute_headroom:.0%} of {p.name}'s {p.sms}"
    bw = p.memory_mib / model.memory_mib
    if n.bandwidth > bw * (1 - rules.compute_headroom):
        return f"{n.bandwidth:.0%} of the memory bandwidth needed > {1 - rules.compute_headroom:.0%} of {p.name}'s {bw:.0%}"
    return None


def _class_fits(c: GpuClass, n: Needs, whole_sms: float, rules: RightSizingRules) -> bool:
    bw = c.relative_bandwidth if c.relative_bandwidth is not None else c.relative_compute
    return (
        n.memory_mib <= c.memory_mib * (1 - rules.memory_headroom)
        and n.sms / whole_sms <= c.relative_compute * (1 - rules.compute_headroom)
        and n.bandwidth <= bw * (1 - rules.compute_headroom)
    )


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def right_size(
    job: JobSummary, rules: RightSizingRules = RightSizingRules(), price: float | None = None
) -> RightSizing:
    """The smallest MIG profile of the job's GPU model (and the cheapest configured GPU class)
    that holds its needs with headroom, and what moving there frees; or why none is advised.
    ``price``: the model's price per GPU-hour (None: no cost)."""
    if job.verdict is Verdict.INSUFFICIENT_DATA:
        return _no("insufficient_data", "too little data to judge its peaks", job)
    if job.verdict is Verdict.IDLE:
        return _no("idle", "the job is idle: release the GPU rather than a smaller one", job)
    if (job.gpus or 0) > 1 or len(job.per_gpu) > 1:
        return _no(
            "multi_gpu",
            "a job on several GPUs is not judged: its ranks talk over NVLink, and what a slice "
            "would leave of that is neither measured nor given by a MIG profile",
            job,
        )
    if any(g.shared_with_pods for g in job.per_gpu):
        return _no(
            "shared_gpu", "its GPU is shared with other pods: the device's memory and activity include theirs", job
        )
    span = job.end - job.start
    if span < rules.min_span:
        return _no("too_short", f"observed {span} < {rules.min_span}: too short to know its peaks", job)
    if job.coverage is None or job.coverage < rules.min_coverage:
        return _no("low_coverage", f"coverage {job.coverage} < {rules.min_coverage}: peaks may have been missed", job)
    model = mig_model(job.gpu_model, rules.models)
    classes = [c for c in rules.gpu_classes if c.replaces(job.gpu_model)]
    if model is None and not classes:
        return _no("no_profiles", f"no MIG profile table and no smaller GPU class for {job.gpu_model!r}", job)
    row = job.per_gpu[0] if job.per_gpu else None
    current: MigProfile | None = None
    if row is not None and row.mig_profile:
        current = model.profile(row.mig_profile) if model else None
        if current is None:
            return _no("unknown_profile", f"MIG profile {row.mig_profile!r} is not in the table", job)
    whole_sms = float(model.gpu_sms if model else 1.0)
    scale_sms = float(current.sms) if current else whole_sms
    scale_bw = (current.memory_mib / model.memory_mib) if (current and model) else 1.0
    n = needs_of(job, scale_sms, scale_bw)
    if n is None:
        return _no("no_figures", "no framebuffer or SM activity figures: its needs are unknown", job)
    cur_share = model.fraction(current) if (current and model) else 1.0
    held = (row.fraction if row and row.fraction else cur_share) if current else 1.0
    hours = job.gpu_hours
    best: MigProfile | None = None
    why_not: list[str] = []
    if model is not None:
        for p in sorted(model.profiles, key=lambda p: (model.fraction(p), p.slices)):
            if model.fraction(p) >= cur_share:
                continue
            misfit = _misfit(model, p, n, rules)
            if misfit is None:
                best = p
                break
            why_not.append(misfit)
    cls = None
    if current is None and classes:
        fitting = [c for c in classes if _class_fits(c, n, whole_sms if model else 1.0, rules)]
        cls = min(fitting, key=lambda c: (c.price_per_gpu_hour is None, c.price_per_gpu_hour or 0.0), default=None)
    if best is None and cls is None:
        return RightSizing(
            False,
            "does_not_fit",
            "; ".join(why_not[:1]) or "no smaller slice or GPU class holds its peaks",
            gpu_model=job.gpu_model,
            current=current.name if current else "whole GPU",
            gpu_hours=hours,
            needs=n,
        )
    share = model.fraction(best) if (best and model) else None
    freed = hours * (1 - share / held) if (hours is not None and share is not None) else None
    cost = freed * price if (freed is not None and price is not None) else None
    class_cost = None
    if cls is not None and hours is not None and price is not None and cls.price_per_gpu_hour is not None:
        class_cost = hours * (price - cls.price_per_gpu_hour)
    target = best.name if best else (cls.name if cls else "")
    return RightSizing(
        True,
        "fits",
        f"its peaks fit {target}",
        gpu_model=job.gpu_model,
        current=current.name if current else "whole GPU",
        mig_profile=best.name if best else None,
        mig_share=_r(share),
        gpu_class=cls.name if cls else None,
        gpu_hours=hours,
        gpu_hours_freed=_r(freed),
        cost_freed=_r(cost, 2),
        class_cost_freed=_r(class_cost, 2),
        needs=n,
    )


def finding(rs: RightSizing, currency: str = "USD") -> Finding | None:
    """The ``right_size`` finding (docs/findings.md) of advice; None where none is advised."""
    if not rs.advised:
        return None
    n = rs.needs
    assert n is not None
    parts = []
    if rs.mig_profile:
        freed = f", freeing {rs.gpu_hours_freed:.2f} GPU-hours" if rs.gpu_hours_freed is not None else ""
        cost = f" ({rs.cost_freed:.2f} {currency})" if rs.cost_freed is not None else ""
        parts.append(f"a MIG {rs.mig_profile} slice would hold it{freed}{cost}")
    if rs.gpu_class:
        cost = f", saving {rs.class_cost_freed:.2f} {currency}" if rs.class_cost_freed is not None else ""
        parts.append(f"a {rs.gpu_class} would too{cost}" if rs.mig_profile else f"a {rs.gpu_class} would hold it{cost}")
    msg = (
        f"Peak {n.memory_mib / 1024:.1f} GiB of memory and {n.sms:.0f} SMs ({n.sm_share:.0%} of the "
        f"{'slice' if rs.current != 'whole GPU' else 'GPU'}) at most: " + "; ".join(parts) + "."
    )
    return Finding("right_size", msg, rs.to_json())  # FINDING_CODE, spelled out for docs/findings.md's test


def right_size_all(
    jobs: Sequence[JobSummary], rules: RightSizingRules, prices: dict[str, float] | None = None
) -> list[tuple[JobSummary, RightSizing]]:
    """Every job's advice, priced by ``prices`` (model → price per GPU-hour, ``default`` for the rest)."""
    return [(j, right_size(j, rules, price_of(prices or {}, j.gpu_model))) for j in jobs]


def price_of(prices: Mapping[str, float], gpu_model: str | None) -> float | None:
    """A model's price per GPU-hour as ``reports.prices`` gives it (``default`` for the rest)."""
    return prices.get(gpu_model or "", prices.get("default"))
