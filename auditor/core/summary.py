"""Rollup buckets of one job → its audit-JSON summary: means, percentiles, coverage,
GPU-hours, waste, MFU estimate, per-GPU breakdown, verdict and findings. Pure.

Definitions (docs/verdicts.md has the user-facing version):

- **Row**: one (pod, GPU) pair; a GPU is a whole GPU or one MIG instance (``GpuId.key``).
- **Means** combine bucket sums and counts, so they are exact sample means whatever the bucket
  width; a job's mean pools the samples of all its GPUs (count-weighted).
- **Percentiles** p10/p50/p90 are taken over the *bucket means*, each weighted by its sample
  count (the smallest bucket mean whose cumulative weight reaches p). They describe how the
  job varied over time at the bucket width, not the spread of individual samples.
- **Observed span** of a row: from its first to its last bucket. Interior buckets count in full
  (clipped to the audit window); the first and last bucket count for ``samples × interval``
  (the job is assumed to have started/ended inside them rather than to have had a gap).
- **Coverage**: valid samples / expected samples, expected = observed span / scrape interval,
  for the busy signal and SM activity (the lower of the two when both exist). Dropped garbage
  samples are not valid. Job coverage pools all rows.
- **GPU-hours**: observed span × GPU fraction (MIG slices count as slices/7), divided in each
  bucket by the number of pods seen on that GPU (time-slicing/MPS: never counted twice).
- **Waste**: ``gpu_hours × (1 − sm_active)`` per row, summed; null when any row lacks SM.
- **MFU estimate**: tensor activity × (SM clock / max SM clock) when both clocks are known,
  else tensor activity alone; null without tensor activity.
"""

from __future__ import annotations

from datetime import datetime
from typing import Mapping, Sequence

from auditor.core.accumulate import JobAggregate, RowView, ShareMap, Stat, peak_held
from auditor.core.findings import gpu_label, job_findings, silent_zero, straggler
from auditor.core.identity import JobKey
from auditor.core.job_summary import GpuSummary, JobSummary, MetricStats
from auditor.core.job_summary import rounded as _r
from auditor.core.metrics import Metric
from auditor.core.mfu import SERVING_KINDS, MfuContext, recoverable_gpu_hours
from auditor.core.model import Bucket, Finding, JobRef, Window
from auditor.core.sharing import gpu_shares
from auditor.core.stat_block import means_of, metric_stats
from auditor.core.thresholds import Thresholds
from auditor.core.verdicts import Evidence, RankLoad, classify, hung

# --------------------------------------------------------------------------- MFU


def _mfu(
    tensor: float | None, clock: float | None, max_clock: float | None, th: Thresholds
) -> tuple[float | None, str | None]:
    """Tensor activity × the clock's share of the max clock × :attr:`Thresholds.mfu_tensor_rate`.

    Without both clocks the share is assumed, ``1 − mfu_clock_drop × tensor``: a GPU whose tensor
    pipes are busy runs into its power cap and drops its clock (the H200 at 700 W: 0.74 of max
    under a bf16 product at tensor 0.93, 0.89 under SDPA training at 0.46, max below ~0.2).
    Assuming the max clock instead made a clock-less bf16 product read 0.91 against 0.67 measured."""
    if tensor is None:
        return None, None
    if clock is not None and max_clock:
        return tensor * min(1.0, clock / max_clock) * th.mfu_tensor_rate, "tensor_active*sm_clock/max_sm_clock*rate"
    share = max(0.0, 1.0 - th.mfu_clock_drop * tensor)
    return tensor * share * th.mfu_tensor_rate, "tensor_active*(1-drop*tensor_active)*rate"


def _max_clock(stats: Mapping[Metric, Stat], model: str, th: Thresholds) -> tuple[float | None, str | None]:
    s = stats.get(Metric.MAX_SM_CLOCK)
    if s is not None and s.count and s.maximum > 0:
        return s.maximum, "DCGM_FI_DEV_MAX_SM_CLOCK"
    v = th.max_clock(model)
    return (v, "model table") if v else (None, None)


# --------------------------------------------------------------------------- job summary


def summarize_job(
    job: JobRef,
    buckets: Sequence[Bucket],
    *,
    window: Window,
    now: datetime,
    interval: float | None = None,
    thresholds: Thresholds | None = None,
    shares: ShareMap | None = None,
    mfu: MfuContext | None = None,
) -> JobSummary:
    """The audit-JSON summary of one job from its buckets (DESIGN.md "Audit JSON").

    ``interval`` is the scrape interval in seconds the source saw, used when the job has no
    full bucket to measure its own (:meth:`JobAggregate.interval_for`); ``shares`` comes from
    :func:`gpu_shares` over *all* pods' buckets of the window, so GPUs shared with other jobs
    are seen.
    """
    shares = shares if shares is not None else gpu_shares(buckets)
    agg = JobAggregate()
    agg.fold(buckets, shares)
    iv = agg.interval_for(interval)
    return summarize_aggregate(job, agg, window=window, now=now, interval=iv, thresholds=thresholds, mfu=mfu)


def summarize_aggregate(
    job: JobRef,
    agg: JobAggregate,
    *,
    window: Window,
    now: datetime,
    interval: float,
    thresholds: Thresholds | None = None,
    mfu: MfuContext | None = None,
) -> JobSummary:
    """The audit-JSON summary of one job from its folded buckets (:mod:`auditor.core.accumulate`);
    ``interval`` is the scrape interval in seconds (0 when unknown); ``mfu`` the job's reference
    MFU and serving flag (:func:`auditor.core.mfu.reference_for`; None: no reference)."""
    th = thresholds or Thresholds()
    ctx = mfu or MfuContext()
    ref = ctx.reference.value if ctx.reference else None
    if job.kind in SERVING_KINDS and not ctx.serving:  # a server whatever its class says
        ctx = MfuContext(ctx.reference, serving=True)
    iv = interval
    rows = agg.views(window, iv)
    models = sorted({r.gpu.model for r in rows if r.gpu.model})
    model = models[0] if len(models) == 1 else (", ".join(models) if models else "")

    # pooled statistics: the rows' sums in row order (as Stat.merge adds them); a pool's points
    # are its rows', which the job's one block of statistics (:mod:`stat_block`) reads there
    pooled: dict[Metric, Stat] = {}
    pool_members: dict[Metric, list[int]] = {}
    row_stats: list[Stat] = []
    busy_total, busy_count = 0.0, 0
    for r in rows:
        for m, s in r.stats.items():
            p = pooled.get(m)
            if p is None:
                p = pooled[m] = Stat()
                pool_members[m] = []
            p.total += s.total
            p.count += s.count
            p.dropped += s.dropped
            p.minimum = min(p.minimum, s.minimum)
            p.maximum = max(p.maximum, s.maximum)
            p.low += s.low
            pool_members[m].append(len(row_stats))
            row_stats.append(s)
        if r.busy_metric is not None:
            b = r.stats[r.busy_metric]
            busy_total += b.total
            busy_count += b.count
    block = metric_stats(row_stats + list(pooled.values()), list(pool_members.values()))
    means = means_of([r.stats for r in rows] + [pooled])
    per_row_stats: list[dict[Metric, MetricStats]] = []
    k = 0
    for r in rows:
        per_row_stats.append(dict(zip(r.stats, block[k : k + len(r.stats)])))
        k += len(r.stats)
    busy_mean = busy_total / busy_count if busy_count else None
    busy_metrics = {r.busy_metric for r in rows if r.busy_metric is not None}
    busy_metric = (
        (Metric.GPU_UTIL if busy_metrics == {Metric.GPU_UTIL} else Metric.GR_ENGINE_ACTIVE) if busy_metrics else None
    )

    def mean(m: Metric) -> float | None:
        s = pooled.get(m)
        return s.mean if s else None

    span_s = sum(r.span_s for r in rows)
    expected = span_s / iv if iv > 0 else 0.0
    if expected > 0:
        valid = 0
        for r in rows:
            if r.busy_metric is None:
                continue
            counts = [r.stats[r.busy_metric].count]
            if Metric.SM_ACTIVE in r.stats:
                counts.append(r.stats[Metric.SM_ACTIVE].count)
            valid += min(counts)
        coverage: float | None = min(1.0, valid / expected)
    else:
        coverage = None
    gpu_hours = sum(r.gpu_hours for r in rows)
    shared_fraction = (sum(r.shared_seconds for r in rows) / span_s) if span_s > 0 else 0.0
    wastes = [r.waste_gpu_hours for r in rows]
    waste = None if (not rows or any(w is None for w in wastes)) else sum(w for w in wastes if w is not None)

    # per-GPU breakdown with per-GPU verdicts
    per_gpu: list[GpuSummary] = []
    silent: list[dict[str, object]] = []
    row_mfus: list[tuple[float | None, RowView]] = []
    hung_ranks: list[RankLoad] = []
    for r, r_stats, r_means in zip(rows, per_row_stats, means):
        sz = silent_zero(r, th)
        if sz:
            silent.append(sz)
        mclock, mclock_src = _max_clock(r.stats, r.gpu.model, th)
        r_mfu, _ = _mfu(r.mean(Metric.TENSOR_ACTIVE), r.mean(Metric.SM_CLOCK), mclock, th)
        row_mfus.append((r_mfu, r))
        r_ev = _evidence_row(r, th, sz, r_mfu, ctx)
        if hung(r_ev, th):
            hung_ranks.append(RankLoad(gpu_label(r), r.busy, r_ev.sm))
        r_verdict, _ = classify(r_ev, th, explain=False)
        per_gpu.append(
            GpuSummary(
                pod=r.pod.pod,
                namespace=r.pod.namespace,
                container=r.pod.container or None,
                gpu=r.gpu.index or None,
                uuid=r.gpu.uuid,
                mig_instance=r.gpu.instance or None,
                mig_profile=r.gpu.mig_profile or None,
                hostname=r.gpu.hostname or None,
                gpu_model=r.gpu.model or None,
                fraction=_r(r.gpu.fraction),
                start=r.start,
                end=r.end,
                gpu_hours=_r(r.gpu_hours),
                coverage=_r(r.coverage),
                busy_signal=r.busy_metric,
                means=r_means,
                mfu_estimate=_r(r_mfu),
                waste_gpu_hours=_r(r.waste_gpu_hours),
                shared_with_pods=r.max_share - 1 if r.max_share > 1 else 0,
                verdict=r_verdict,
                stats=r_stats,
            )
        )

    # MFU
    tensor = mean(Metric.TENSOR_ACTIVE)
    clock = mean(Metric.SM_CLOCK)
    mclock, mclock_src = _max_clock(pooled, models[0] if len(models) == 1 else "", th)
    mfu_est, mfu_method = _mfu(tensor, clock, mclock, th)
    mig = [r for r in rows if r.gpu.instance]
    if mig and mfu_est is not None:
        # a MIG instance's counters are relative to the instance: its estimate is a share of the
        # slice's own peak, so the job's is the slices' estimates weighted by what each can do
        weighted = [(m, r.gpu.fraction * r.stats[Metric.TENSOR_ACTIVE].count) for m, r in row_mfus if m is not None]
        total_w = sum(w for _, w in weighted)
        if total_w > 0:
            mfu_est = sum(m * w for m, w in weighted) / total_w

    ev = Evidence(
        busy=busy_mean,
        busy_metric=busy_metric,
        sm=mean(Metric.SM_ACTIVE),
        tensor=mean(Metric.TENSOR_ACTIVE),
        dram=mean(Metric.DRAM_ACTIVE),
        fp32=mean(Metric.FP32_ACTIVE),
        fp16=mean(Metric.FP16_ACTIVE),
        power=mean(Metric.POWER),
        samples=busy_count,
        span_s=max((r.span_s for r in rows), default=0.0),
        coverage=coverage,
        shared_fraction=shared_fraction,
        model=model,
        silent_zero=silent,
        gr_engine=mean(Metric.GR_ENGINE_ACTIVE),
        pcie_rx=mean(Metric.PCIE_RX),
        pcie_tx=mean(Metric.PCIE_TX),
        occupancy=mean(Metric.SM_OCCUPANCY),
        mfu=mfu_est,
        mfu_reference=ctx.reference,
        serving=ctx.serving,
        idle_phase=_idle_phase(rows),
        straggler=straggler(rows, th),
        # a hung collective: a multi-GPU job whose every GPU spins (one GPU alone: a spin kernel)
        stalled=tuple(hung_ranks) if len(rows) >= 2 and len(hung_ranks) == len(rows) else None,
    )
    verdict, findings = classify(ev, th)
    findings += job_findings(rows, th, verdict, shared_fraction)

    if mfu_est is not None:
        findings.append(
            Finding(
                "mfu_estimate",
                "MFU estimated from tensor-pipe activity"
                + (
                    " scaled by SM clock / max SM clock"
                    if clock is not None and mclock
                    else (
                        f" and an assumed clock (clocks unknown: 1 − {th.mfu_clock_drop:g} × tensor activity "
                        "of the max, as a power-capped GPU drops it under tensor load)"
                    )
                )
                + f" and by the {th.mfu_tensor_rate:g} of the peak a busy tensor pipe delivers, relative to "
                + (
                    "the dense tensor peak of the MIG slice(s) the job runs on (a MIG instance's counters "
                    "count its own SMs: 100 % is what the slice can do)"
                    if mig
                    else "the dense tensor peak of the precision in use"
                )
                + " (bf16, FP8 or TF32: the counters do not say which).",
                {
                    "method": mfu_method,
                    "relative_to": (
                        "dense tensor-core peak of the MIG slice (its own SMs), precision in use"
                        if mig
                        else "dense tensor-core peak of the precision in use"
                    ),
                    "tensor_rate": th.mfu_tensor_rate,
                    "tensor_active": _r(tensor),
                    "sm_clock_mhz": _r(clock, 1),
                    "max_sm_clock_mhz": mclock,
                    "max_sm_clock_source": mclock_src,
                },
            )
        )

    return JobSummary(
        key=JobKey(job.cluster, job.namespace, job.kind, job.name),
        uid=job.uid,
        team=job.team or job.namespace,
        queue=job.queue,
        gpu_model=model or None,
        gpus=_r(_peak_gpus(rows, agg.peak), 4),
        pods=tuple(sorted({r.pod.pod for r in rows})),
        start=min((r.start for r in rows), default=window.start),
        end=max((r.end for r in rows), default=window.start),
        gpu_hours=_r(gpu_hours),
        busy_signal=busy_metric,
        means=means[-1],
        coverage=_r(coverage),
        mfu_estimate=_r(mfu_est),
        mfu_reference=_r(ref),
        mfu_class=ctx.reference.source if ctx.reference else None,
        waste_gpu_hours=_r(waste),
        recoverable_gpu_hours=_r(recoverable_gpu_hours(gpu_hours, mfu_est, ref)),
        verdict=verdict,
        findings=tuple(findings),
        stats=dict(zip(pooled, block[k:])),
        per_gpu=tuple(per_gpu),
        window_start=window.start,
        window_end=window.end,
        scrape_interval_s=_r(iv, 3) if iv else None,
        computed_at=now,
    )


def _peak_gpus(rows: Sequence[RowView], frozen_peak: float = 0.0) -> float:
    """GPU equivalents held at the busiest bucket (MIG fractions, shared GPUs divided);
    ``frozen_peak`` is that of the buckets an aggregate no longer lists one by one."""
    peak = peak_held(r.presence for r in rows)
    if peak is not None:
        return max(frozen_peak, peak)
    return frozen_peak or sum(r.gpu.fraction for r in rows)


def _idle_phase(rows: Sequence[RowView]) -> float | None:
    """The share of the job's busy-signal samples in idle phases (:attr:`Stat.low`), None without any."""
    low, count = 0.0, 0
    for r in rows:
        if r.busy_metric is not None:
            s = r.stats[r.busy_metric]
            low += s.low
            count += s.count
    return min(1.0, low / count) if count else None


def _evidence_row(
    r: RowView, th: Thresholds, sz: dict[str, object] | None, mfu: float | None, ctx: MfuContext
) -> Evidence:
    return Evidence(
        busy=r.busy,
        busy_metric=r.busy_metric,
        sm=r.mean(Metric.SM_ACTIVE),
        tensor=r.mean(Metric.TENSOR_ACTIVE),
        dram=r.mean(Metric.DRAM_ACTIVE),
        fp32=r.mean(Metric.FP32_ACTIVE),
        fp16=r.mean(Metric.FP16_ACTIVE),
        power=r.mean(Metric.POWER),
        samples=r.stats[r.busy_metric].count if r.busy_metric else 0,
        span_s=r.span_s,
        coverage=r.coverage,
        shared_fraction=(r.shared_seconds / r.span_s) if r.span_s > 0 else 0.0,
        model=r.gpu.model,
        silent_zero=[sz] if sz else [],
        gr_engine=r.mean(Metric.GR_ENGINE_ACTIVE),
        pcie_rx=r.mean(Metric.PCIE_RX),
        pcie_tx=r.mean(Metric.PCIE_TX),
        occupancy=r.mean(Metric.SM_OCCUPANCY),
        mfu=mfu,
        mfu_reference=ctx.reference,
        serving=ctx.serving,
        idle_phase=_idle_phase([r]),
    )
