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

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import groupby
from operator import attrgetter
from typing import Callable, Iterable, Mapping, Sequence

from auditor.core.accumulate import JobAggregate, RowView, ShareMap, Stat, peak_held
from auditor.core.metrics import Metric
from auditor.core.model import Bucket, Finding, JobRef, PodRef, Verdict, Window
from auditor.core.thresholds import Thresholds

#: the activity fields of the audit JSON, in output order
ACTIVITY_FIELDS: tuple[tuple[str, Metric], ...] = (
    ("gpu_util", Metric.GPU_UTIL),
    ("gr_engine_active", Metric.GR_ENGINE_ACTIVE),
    ("sm_active", Metric.SM_ACTIVE),
    ("sm_occupancy", Metric.SM_OCCUPANCY),
    ("tensor_active", Metric.TENSOR_ACTIVE),
    ("dram_active", Metric.DRAM_ACTIVE),
    ("fp32_active", Metric.FP32_ACTIVE),
    ("fp16_active", Metric.FP16_ACTIVE),
)
#: device readings reported as means in their own units
DEVICE_FIELDS: tuple[tuple[str, Metric], ...] = (
    ("power_w", Metric.POWER),
    ("fb_used_mib", Metric.FB_USED),
    ("sm_clock_mhz", Metric.SM_CLOCK),
    ("pcie_rx_bytes_per_s", Metric.PCIE_RX),
    ("pcie_tx_bytes_per_s", Metric.PCIE_TX),
)

_POD_GPU = attrgetter("pod", "gpu")


def _stat_json(st: Stat) -> dict[str, object]:
    p10, p50, p90 = st.percentiles(0.10, 0.50, 0.90)
    return {
        "mean": _r(st.mean),
        "p10": _r(p10),
        "p50": _r(p50),
        "p90": _r(p90),
        "min": _r(st.minimum) if st.count else None,
        "max": _r(st.maximum) if st.count else None,
        "samples": st.count,
        "dropped": st.dropped,
    }


def _r(v: float | None, nd: int = 6) -> float | None:
    return None if v is None else round(v, nd)


def rfc3339(t: datetime) -> str:
    """RFC 3339 UTC with ``Z``, whole seconds unless there is a fraction (milliseconds)."""
    v = t.astimezone(timezone.utc)
    return v.isoformat(timespec="milliseconds" if v.microsecond else "seconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- sharing


def gpu_shares(buckets: Iterable[Bucket]) -> dict[tuple[str, datetime], int]:
    """How many distinct pods were seen on each GPU (``GpuId.key``) in each bucket.

    More than one means time-slicing or MPS (or a pod replaced inside the bucket): the GPU's
    time is divided among them and the metrics are device-wide, not the pod's own.
    """
    pods: dict[tuple[str, datetime], set[PodRef]] = defaultdict(set)
    for (pod, gpu), run in groupby(buckets, key=_POD_GPU):
        key = gpu.key
        for b in run:
            if b.count or b.dropped:
                pods[(key, b.start)].add(pod)
    return {k: len(v) for k, v in pods.items()}


def shared_gpus(buckets: Sequence[Bucket]) -> dict[tuple[str, datetime], int]:
    """:func:`gpu_shares` without its entries of 1: only the GPUs and buckets with several pods.

    Every consumer reads shares with a default of 1, so this is the same map for them, and it
    looks at single buckets only on GPUs that more than one pod used at all — on a cluster
    without sharing, one step per (pod, GPU) run instead of a set per bucket.
    """
    return shares_among(
        ((pod, gpu.key) for (pod, gpu), _ in groupby(buckets, key=_POD_GPU)),
        lambda keys: (b for b in buckets if b.gpu.key in keys),
    )


def shares_among(
    pod_gpus: Iterable[tuple[PodRef, str]], buckets_on: Callable[[set[str]], Iterable[Bucket]]
) -> dict[tuple[str, datetime], int]:
    """:func:`shared_gpus` for any form of a read: ``pod_gpus`` lists its (pod, GPU key) pairs,
    ``buckets_on(keys)`` gives its buckets on those GPUs (asked only for GPUs several pods used)."""
    pods_per_gpu: dict[str, set[PodRef]] = defaultdict(set)
    for pod, key in pod_gpus:
        pods_per_gpu[key].add(pod)
    candidates = {k for k, v in pods_per_gpu.items() if len(v) > 1}
    if not candidates:
        return {}
    shares = gpu_shares(buckets_on(candidates))
    return {k: n for k, n in shares.items() if n > 1}


# --------------------------------------------------------------------------- classification


@dataclass(slots=True)
class Evidence:
    """What the classifier looks at: means of one GPU or one whole job."""

    busy: float | None
    busy_metric: Metric | None
    sm: float | None
    tensor: float | None
    dram: float | None
    fp32: float | None
    fp16: float | None
    power: float | None
    samples: int
    span_s: float
    coverage: float | None
    shared_fraction: float
    model: str
    #: rows (or this GPU) whose profiling fields read exactly 0 while busy: descriptions
    silent_zero: list[dict[str, object]] = field(default_factory=list)
    #: GR_ENGINE_ACTIVE (a kernel, or a graphics/compute context, runs), where exported
    gr_engine: float | None = None
    #: PCIe receive / transmit rates in bytes/s, where exported
    pcie_rx: float | None = None
    pcie_tx: float | None = None


_ADVICE = {
    Verdict.IDLE: "Release the GPU when nothing runs (stop the notebook or pod, scale to zero, "
    "use a shorter idle timeout); allocated-but-idle GPUs block other teams' work.",
    Verdict.UNDERUTILIZED: "The GPU waits on the host: speed up the input pipeline (more DataLoader "
    "workers, pin_memory, prefetching, preprocessing on the GPU), increase the batch size, and for "
    "many tiny kernels use CUDA Graphs or torch.compile to cut launch gaps.",
    "input_stall": "Speed up what the GPU waits for between steps: more DataLoader workers, "
    "pin_memory and prefetching, preprocessing on the GPU, and host work overlapped with GPU work "
    "(asynchronous copies, no synchronisation per step); a larger batch size makes each GPU step "
    "longer against the host's fixed cost.",
    "launch_bound": "Launch fewer, larger kernels: CUDA Graphs or torch.compile (fusion, fewer "
    "launches), a larger batch, and no per-step host synchronisation.",
    "no_kernel": "No kernel runs at all: the GPU is busy only with copies. Keep data on the GPU "
    "between steps instead of moving it each time, copy from pinned memory in large chunks, and "
    "overlap copies with compute (non_blocking copies on a side stream, prefetching).",
    Verdict.LOW_SM_EFFICIENCY: "Kernels keep the GPU 'busy' but occupy few SMs: launch more thread "
    "blocks (larger batch or problem size, fewer serial small kernels), and if this is a distributed "
    "job check for ranks waiting in collectives on a straggler (NCCL waits spin on a few SMs).",
    Verdict.MEMORY_BOUND: "SMs wait on memory while no pipe does much math: fuse element-wise "
    "kernels (torch.compile, fused optimizers), use FlashAttention / fused attention, and improve "
    "data locality (contiguous layouts, larger gathers).",
    Verdict.NO_TENSOR_CORES: "Math runs on CUDA cores, not tensor cores: train in bf16 with "
    "mixed precision (torch.autocast), or at least enable TF32 "
    "(torch.backends.cuda.matmul.allow_tf32 = True / torch.set_float32_matmul_precision('high')).",
}


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.1f} %"


def classify(ev: Evidence, th: Thresholds) -> tuple[Verdict, list[Finding]]:
    """DESIGN.md's verdict table, in order, first match wins; the first finding says why."""
    base: dict[str, object] = {
        "busy_signal": ev.busy_metric.value if ev.busy_metric else None,
        "busy": _r(ev.busy),
        "sm_active": _r(ev.sm),
        "coverage": _r(ev.coverage),
    }
    insufficient = Verdict.INSUFFICIENT_DATA
    if ev.busy is None:
        return insufficient, [
            Finding(
                "metric_missing",
                "No utilization signal (neither DCGM_FI_DEV_GPU_UTIL nor DCGM_FI_PROF_GR_ENGINE_ACTIVE): "
                "nothing can be judged. Check that dcgm-exporter runs on the node and the pod is attributed.",
                {"missing": ["gpu_util", "gr_engine_active"]},
            )
        ]
    if ev.samples < th.min_samples or ev.span_s < th.min_span.total_seconds():
        return insufficient, [
            Finding(
                "too_short",
                f"Only {ev.samples} samples over {ev.span_s:.0f} s: too little to judge "
                f"(needs {th.min_samples} samples and {th.min_span.total_seconds():.0f} s).",
                {**base, "samples": ev.samples, "span_seconds": round(ev.span_s, 3)},
            )
        ]
    if ev.coverage is not None and ev.coverage < th.min_coverage:
        return insufficient, [
            Finding(
                "low_coverage",
                f"Only {_pct(ev.coverage)} of the expected samples are present (minimum "
                f"{_pct(th.min_coverage)}): scrape gaps, exporter restarts or garbage values; no judgement.",
                {**base, "min_coverage": th.min_coverage},
            )
        ]
    if ev.shared_fraction > th.max_shared_fraction:
        return insufficient, [
            Finding(
                "gpu_shared_unjudged",
                f"{_pct(ev.shared_fraction)} of this job's GPU time is on GPUs shared with other pods "
                "(time-slicing/MPS): the metrics are device-wide, not this job's; no judgement.",
                {**base, "shared_fraction": _r(ev.shared_fraction)},
            )
        ]
    if ev.silent_zero:
        return insufficient, [
            Finding(
                "profiling_zero_suspect",
                "Profiling fields read exactly 0 while the GPU is busy: a kernel always keeps at least "
                "one SM active, so this is suspect telemetry (profiling paused by Nsight, a second host "
                "engine, a DCGM bug after Xid errors), not low SM efficiency. Check dcgm-exporter's "
                "profiling module on the node.",
                {**base, "gpus": ev.silent_zero},
            )
        ]
    if ev.busy < th.idle_util:
        return Verdict.IDLE, [
            Finding(
                "idle",
                f"GPUs allocated but idle: {ev.busy_metric.value if ev.busy_metric else 'utilization'} "
                f"averages {_pct(ev.busy)}. {_ADVICE[Verdict.IDLE]}",
                {**base, "threshold": th.idle_util, "power_w": _r(ev.power, 1)},
            )
        ]
    if ev.busy < th.busy_util:
        return Verdict.UNDERUTILIZED, [_underutilized(ev, th, base)]
    if ev.sm is None:
        return insufficient, [
            Finding(
                "metric_missing",
                "The GPU is busy but there is no SM-activity series (DCGM_FI_PROF_SM_ACTIVE is off in "
                "dcgm-exporter's shipped CSVs): whether the busy time does real work cannot be told. "
                "Add DCGM_FI_PROF_SM_ACTIVE to the exporter's metrics CSV.",
                {**base, "missing": ["sm_active"]},
            )
        ]
    if ev.sm < th.low_sm:
        if _no_kernel(ev, th):
            return Verdict.LOW_SM_EFFICIENCY, _copy_only(ev, th, base)
        if ev.sm / ev.busy >= th.sm_while_busy:
            # the SMs are well used while the GPU is busy: the shortfall is the idle time
            return Verdict.UNDERUTILIZED, [_underutilized(ev, th, base)]
        return Verdict.LOW_SM_EFFICIENCY, [
            Finding(
                "low_sm_efficiency",
                f"The GPU looks busy ({_pct(ev.busy)} utilization) but only {_pct(ev.sm)} of SM time "
                f"has work: about {_pct(1 - ev.sm)} of the SMs sit idle. {_ADVICE[Verdict.LOW_SM_EFFICIENCY]}",
                {**base, "threshold": th.low_sm, "reason": "few_blocks", "sm_per_busy": _r(ev.sm / ev.busy)},
            )
        ]
    if ev.tensor is None:
        return insufficient, [
            Finding(
                "metric_missing",
                "SMs are busy but there is no tensor-pipe series (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE): "
                "the kind of work cannot be told.",
                {**base, "missing": ["tensor_active"]},
            )
        ]
    pipe_ev = {
        **base,
        "tensor_active": _r(ev.tensor),
        "dram_active": _r(ev.dram),
        "fp32_active": _r(ev.fp32),
        "fp16_active": _r(ev.fp16),
    }
    if ev.tensor < th.tensor_idle:
        # The CUDA-core math signal needs the FP32 pipe; FP16 (which excludes HMMA) only adds to it.
        math = max(ev.fp32, ev.fp16 or 0.0) if ev.fp32 is not None else None
        extra: list[Finding] = []
        if ev.fp32 is None:
            extra.append(
                Finding(
                    "fp32_pipe_missing",
                    "No FP32-pipe series (DCGM_FI_PROF_PIPE_FP32_ACTIVE, off by default): memory-bound "
                    "and CUDA-core work were told apart by DRAM activity alone. Enable the FP32 pipe "
                    "field for a surer split.",
                    {"dram_active": _r(ev.dram), "dram_busy": th.dram_busy},
                )
            )
        if math is not None and math < th.math_pipe_idle:
            return Verdict.MEMORY_BOUND, [
                Finding(
                    "memory_bound",
                    f"SMs are busy ({_pct(ev.sm)}) but neither the tensor ({_pct(ev.tensor)}) nor the "
                    f"FP32/FP16 pipes ({_pct(math)}) do much math: the warps wait on memory "
                    f"(DRAM {_pct(ev.dram)}; latency-bound gathers keep DRAM well below its peak). "
                    f"{_ADVICE[Verdict.MEMORY_BOUND]}",
                    {**pipe_ev, "reason": "no_math_pipe", "math_pipe_idle": th.math_pipe_idle},
                ),
                *extra,
            ]
        if ev.dram is not None and ev.dram >= th.dram_busy:
            return Verdict.MEMORY_BOUND, [
                Finding(
                    "memory_bound",
                    f"SMs are busy ({_pct(ev.sm)}), tensor pipes (nearly) idle ({_pct(ev.tensor)}) and DRAM busy "
                    f"({_pct(ev.dram)}): the work streams memory rather than doing math. "
                    f"{_ADVICE[Verdict.MEMORY_BOUND]}",
                    {**pipe_ev, "reason": "dram_busy", "dram_busy": th.dram_busy},
                ),
                *extra,
            ]
        if math is not None or ev.dram is not None:
            why = (
                f"the FP32/FP16 pipes are busy ({_pct(math)})"
                if math is not None
                else f"DRAM is quiet ({_pct(ev.dram)}), so the SMs compute on CUDA cores"
            )
            return Verdict.NO_TENSOR_CORES, [
                Finding(
                    "no_tensor_cores",
                    f"SMs are busy ({_pct(ev.sm)}) but the tensor cores are (nearly) idle ({_pct(ev.tensor)}); "
                    f"{why}. {_ADVICE[Verdict.NO_TENSOR_CORES]}",
                    {**pipe_ev, "reason": "math_pipe_busy" if math is not None else "dram_quiet"},
                ),
                *extra,
            ]
        return insufficient, [
            Finding(
                "metric_missing",
                "Tensor pipes are idle, but with neither DRAM nor FP32-pipe series memory-bound and "
                "CUDA-core work cannot be told apart.",
                {**pipe_ev, "missing": ["dram_active", "fp32_active"]},
            )
        ]
    findings = [
        Finding(
            "healthy",
            f"SMs busy ({_pct(ev.sm)}) with tensor cores in use ({_pct(ev.tensor)}).",
            pipe_ev,
        )
    ]
    if ev.tensor < th.tensor_headroom:
        dram_busy = ev.dram is not None and ev.dram >= th.dram_busy
        findings.append(
            Finding(
                "tensor_headroom",
                f"Tensor pipes are only {_pct(ev.tensor)} busy: there is room to grow"
                + (
                    f". DRAM is busy ({_pct(ev.dram)}): memory-bound kernels take much of the time "
                    "(attention without FlashAttention/SDPA, unfused element-wise and normalisation "
                    "kernels): fuse them (torch.compile, fused attention), use channels-last."
                    if dram_busy
                    else " (larger batch, fused kernels, channels-last, fewer non-matmul bottlenecks)."
                ),
                {
                    "tensor_active": _r(ev.tensor),
                    "dram_active": _r(ev.dram),
                    "threshold": th.tensor_headroom,
                    "reason": "dram_busy" if dram_busy else "tensor_low",
                },
            )
        )
    return Verdict.HEALTHY, findings


def _underutilized(ev: Evidence, th: Thresholds, base: dict[str, object]) -> Finding:
    """The underutilized finding, its advice chosen by what the SMs do while the GPU is busy:
    well used (``input_stall``: the job waits on its input or host), barely used
    (``launch_bound``: many tiny kernels with gaps), or unknown without SM activity."""
    busy = ev.busy
    assert busy is not None, "classify() returns metric_missing before an underutilized finding"
    head = f"Utilization averages {_pct(busy)}"
    head += (
        f", clearly below full (< {_pct(th.busy_util)})"
        if busy < th.busy_util
        else f": the GPU is idle {_pct(1 - busy)} of the time"
    )
    ev_out: dict[str, object] = {**base, "threshold": th.busy_util}
    if ev.sm is None or not ev.busy:
        return Finding(
            "underutilized", f"{head}: the GPU often has no kernel to run. {_ADVICE[Verdict.UNDERUTILIZED]}", ev_out
        )
    per_busy = min(1.0, ev.sm / ev.busy)
    ev_out["sm_per_busy"] = _r(per_busy)
    if per_busy >= th.low_sm:
        ev_out["reason"] = "input_stall"
        return Finding(
            "underutilized",
            f"{head}, but while it runs its SMs are well used ({_pct(per_busy)} of busy time): the job "
            f"waits on its input pipeline or host code between steps. {_ADVICE['input_stall']}",
            ev_out,
        )
    ev_out["reason"] = "launch_bound"
    return Finding(
        "underutilized",
        f"{head}, and even while a kernel runs only {_pct(per_busy)} of SM time has work: many small "
        f"kernels with launch gaps (launch-bound). {_ADVICE['launch_bound']}",
        ev_out,
    )


def _no_kernel(ev: Evidence, th: Thresholds) -> bool:
    """Busy with no kernel at all: GR_ENGINE_ACTIVE (any running kernel keeps it active) idle while
    the busy signal is high — copies keep GPU_UTIL up without a kernel. Needs GR_ENGINE_ACTIVE
    apart from the busy signal (on MIG it *is* the busy signal)."""
    return ev.gr_engine is not None and ev.busy_metric is Metric.GPU_UTIL and ev.gr_engine < th.idle_util


def _copy_only(ev: Evidence, th: Thresholds, base: dict[str, object]) -> list[Finding]:
    """low_sm_efficiency for a GPU busy with copies alone, and the copy_only finding with the PCIe
    rates that show where the transfers go."""
    pcie = None if ev.pcie_rx is None and ev.pcie_tx is None else (ev.pcie_rx or 0.0) + (ev.pcie_tx or 0.0)
    if pcie is None:
        where = "PCIe counters are not exported (add DCGM_FI_PROF_PCIE_RX_BYTES/TX_BYTES to see the transfer rate)"
    elif pcie >= th.pcie_busy_bytes:
        where = f"PCIe moves {_gbps(ev.pcie_rx)} in (RX) and {_gbps(ev.pcie_tx)} out (TX): transfer-bound"
    else:
        where = f"PCIe is quiet ({_gbps(pcie)}): device-to-device or peer copies"
    evidence = {
        **base,
        "gr_engine_active": _r(ev.gr_engine),
        "pcie_rx_bytes_per_s": _r(ev.pcie_rx, 0),
        "pcie_tx_bytes_per_s": _r(ev.pcie_tx, 0),
        "pcie_busy_bytes": th.pcie_busy_bytes,
    }
    return [
        Finding(
            "low_sm_efficiency",
            f"The GPU reads {_pct(ev.busy)} utilization but no kernel runs (graphics engine "
            f"{_pct(ev.gr_engine)}, SM activity {_pct(ev.sm)}): the time goes to copies; {where}. "
            f"{_ADVICE['no_kernel']}",
            {**base, "threshold": th.low_sm, "reason": "no_kernel"},
        ),
        Finding(
            "copy_only",
            f"Busy with copies alone: {where}.",
            evidence,
        ),
    ]


def _gbps(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 1e9:.1f} GB/s"


def _silent_zero(row: RowView, th: Thresholds) -> dict[str, object] | None:
    """This GPU reads SM activity exactly 0 while busy and (where known) drawing real power."""
    sm = row.stats.get(Metric.SM_ACTIVE)
    busy = row.busy
    if sm is None or not sm.exactly_zero or busy is None or busy < th.busy_util:
        return None
    power = row.mean(Metric.POWER)
    floor = th.power_floor(row.gpu.model)
    if power is not None and floor is not None and power < floor:
        return None  # drawing idle power: the zero is plausible, judge normally
    return {
        "gpu": row.gpu.key,
        "busy": _r(busy),
        "sm_active_max": 0.0,
        "power_w": _r(power, 1),
        "power_floor_w": floor,
    }


# --------------------------------------------------------------------------- MFU


def _mfu(tensor: float | None, clock: float | None, max_clock: float | None) -> tuple[float | None, str | None]:
    if tensor is None:
        return None, None
    if clock is not None and max_clock:
        return tensor * min(1.0, clock / max_clock), "tensor_active*sm_clock/max_sm_clock"
    return tensor, "tensor_active"


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
) -> dict[str, object]:
    """The audit-JSON object of one job from its buckets (DESIGN.md "Audit JSON").

    ``interval`` is the scrape interval in seconds the source saw, used when the job has no
    full bucket to measure its own (:meth:`JobAggregate.interval_for`); ``shares`` comes from
    :func:`gpu_shares` over *all* pods' buckets of the window, so GPUs shared with other jobs
    are seen.
    """
    shares = shares if shares is not None else gpu_shares(buckets)
    agg = JobAggregate()
    agg.fold(buckets, shares)
    iv = agg.interval_for(interval)
    return summarize_aggregate(job, agg, window=window, now=now, interval=iv, thresholds=thresholds)


def summarize_aggregate(
    job: JobRef,
    agg: JobAggregate,
    *,
    window: Window,
    now: datetime,
    interval: float,
    thresholds: Thresholds | None = None,
) -> dict[str, object]:
    """The audit-JSON object of one job from its folded buckets (:mod:`auditor.core.accumulate`);
    ``interval`` is the scrape interval in seconds (0 when unknown)."""
    th = thresholds or Thresholds()
    iv = interval
    rows = agg.views(window, iv)
    models = sorted({r.gpu.model for r in rows if r.gpu.model})
    model = models[0] if len(models) == 1 else (", ".join(models) if models else "")

    # pooled statistics
    pooled: dict[Metric, Stat] = {}
    busy_pool = Stat()
    for r in rows:
        for m, s in r.stats.items():
            pooled.setdefault(m, Stat()).merge(s)
        if r.busy_metric is not None:
            busy_pool.merge(r.stats[r.busy_metric])
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
    per_gpu = []
    silent: list[dict[str, object]] = []
    for r in rows:
        sz = _silent_zero(r, th)
        if sz:
            silent.append(sz)
        r_verdict, _ = classify(_evidence_row(r, th, sz), th)
        mclock, mclock_src = _max_clock(r.stats, r.gpu.model, th)
        r_mfu, _ = _mfu(r.mean(Metric.TENSOR_ACTIVE), r.mean(Metric.SM_CLOCK), mclock)
        entry: dict[str, object] = {
            "pod": r.pod.pod,
            "namespace": r.pod.namespace,
            "container": r.pod.container or None,
            "gpu": r.gpu.index or None,
            "uuid": r.gpu.uuid,
            "mig_instance": r.gpu.instance or None,
            "mig_profile": r.gpu.mig_profile or None,
            "hostname": r.gpu.hostname or None,
            "gpu_model": r.gpu.model or None,
            "fraction": _r(r.gpu.fraction),
            "start": rfc3339(r.start),
            "end": rfc3339(r.end),
            "gpu_hours": _r(r.gpu_hours),
            "coverage": _r(r.coverage),
            "busy_signal": r.busy_metric.value if r.busy_metric else None,
        }
        for name, m in ACTIVITY_FIELDS + DEVICE_FIELDS:
            entry[name] = _r(r.mean(m))
        entry.update(
            {
                "mfu_estimate": _r(r_mfu),
                "waste_gpu_hours": _r(r.waste_gpu_hours),
                "shared_with_pods": r.max_share - 1 if r.max_share > 1 else 0,
                "verdict": r_verdict.value,
                "stats": {m.value: _stat_json(r.stats[m]) for m in sorted(r.stats, key=lambda m: m.value)},
            }
        )
        per_gpu.append(entry)

    ev = Evidence(
        busy=busy_pool.mean,
        busy_metric=busy_metric,
        sm=mean(Metric.SM_ACTIVE),
        tensor=mean(Metric.TENSOR_ACTIVE),
        dram=mean(Metric.DRAM_ACTIVE),
        fp32=mean(Metric.FP32_ACTIVE),
        fp16=mean(Metric.FP16_ACTIVE),
        power=mean(Metric.POWER),
        samples=busy_pool.count,
        span_s=max((r.span_s for r in rows), default=0.0),
        coverage=coverage,
        shared_fraction=shared_fraction,
        model=model,
        silent_zero=silent,
        gr_engine=mean(Metric.GR_ENGINE_ACTIVE),
        pcie_rx=mean(Metric.PCIE_RX),
        pcie_tx=mean(Metric.PCIE_TX),
    )
    verdict, findings = classify(ev, th)
    findings += _job_findings(rows, th, verdict, shared_fraction)

    # MFU
    tensor = mean(Metric.TENSOR_ACTIVE)
    clock = mean(Metric.SM_CLOCK)
    mclock, mclock_src = _max_clock(pooled, models[0] if len(models) == 1 else "", th)
    mfu, mfu_method = _mfu(tensor, clock, mclock)
    if mfu is not None:
        findings.append(
            Finding(
                "mfu_estimate",
                "MFU estimated from tensor-pipe activity"
                + (" scaled by SM clock / max SM clock" if clock is not None and mclock else " alone (clocks unknown)")
                + ", relative to the dense tensor peak of the precision in use (bf16, FP8 or TF32: the "
                "counters do not say which).",
                {
                    "method": mfu_method,
                    "relative_to": "dense tensor-core peak of the precision in use",
                    "tensor_active": _r(tensor),
                    "sm_clock_mhz": _r(clock, 1),
                    "max_sm_clock_mhz": mclock,
                    "max_sm_clock_source": mclock_src,
                },
            )
        )

    start = min((r.start for r in rows), default=window.start)
    end = max((r.end for r in rows), default=window.start)
    out: dict[str, object] = {
        "cluster": job.cluster,
        "namespace": job.namespace,
        "job": job.job,
        "uid": job.uid,
        "team": job.team or job.namespace,
        "queue": job.queue,
        "gpu_model": model or None,
        "gpus": _r(_peak_gpus(rows, agg.peak), 4),
        "pods": sorted({r.pod.pod for r in rows}),
        "start": rfc3339(start),
        "end": rfc3339(end),
        "gpu_hours": _r(gpu_hours),
        "busy_signal": busy_metric.value if busy_metric else None,
    }
    for name, m in ACTIVITY_FIELDS + DEVICE_FIELDS:
        out[name] = _r(mean(m))
    out.update(
        {
            "coverage": _r(coverage),
            "mfu_estimate": _r(mfu),
            "waste_gpu_hours": _r(waste),
            "verdict": verdict.value,
            "findings": [{"code": f.code, "message": f.message, "evidence": f.evidence} for f in findings],
            "stats": {m.value: _stat_json(pooled[m]) for m in sorted(pooled, key=lambda m: m.value)},
            "per_gpu": per_gpu,
            "window": {"start": rfc3339(window.start), "end": rfc3339(window.end)},
            "scrape_interval_s": _r(iv, 3) if iv else None,
            "computed_at": rfc3339(now),
        }
    )
    return out


def _peak_gpus(rows: Sequence[RowView], frozen_peak: float = 0.0) -> float:
    """GPU equivalents held at the busiest bucket (MIG fractions, shared GPUs divided);
    ``frozen_peak`` is that of the buckets an aggregate no longer lists one by one."""
    peak = peak_held(r.presence for r in rows)
    if peak is not None:
        return max(frozen_peak, peak)
    return frozen_peak or sum(r.gpu.fraction for r in rows)


def _evidence_row(r: RowView, th: Thresholds, sz: dict[str, object] | None) -> Evidence:
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
    )


def _gpu_label(r: RowView) -> str:
    idx = f"gpu{r.gpu.index}" if r.gpu.index else r.gpu.uuid
    if r.gpu.instance:
        idx += f"/mig{r.gpu.instance}"
    host = f"{r.gpu.hostname}:" if r.gpu.hostname else ""
    return f"{r.pod.pod} {host}{idx}"


def _job_findings(rows: Sequence[RowView], th: Thresholds, verdict: Verdict, shared_fraction: float) -> list[Finding]:
    """Findings beyond the verdict's own: multi-GPU patterns, sharing, garbage, MIG, partial metrics."""
    out: list[Finding] = []
    if len(rows) >= 2:
        busy = [(r, r.busy) for r in rows if r.busy is not None]
        idle = [r for r, b in busy if b < th.idle_util]
        if idle and verdict is not Verdict.IDLE:
            out.append(
                Finding(
                    "idle_gpus_in_job",
                    f"{len(idle)} of the job's {len(rows)} GPUs are idle while others work: request fewer "
                    "GPUs or make sure every rank gets work.",
                    {"idle_gpus": [_gpu_label(r) for r in idle], "gpus": len(rows), "threshold": th.idle_util},
                )
            )
        waiting = [
            r for r, b in busy if b >= th.busy_util and (sm := r.mean(Metric.SM_ACTIVE)) is not None and sm < th.low_sm
        ]
        straggler_found = False
        if waiting:
            top = min(r.busy or 0.0 for r in waiting)
            stragglers = [r for r, b in busy if r not in waiting and r not in idle and b <= top - th.imbalance_util_gap]
            if stragglers:
                straggler_found = True
                out.append(
                    Finding(
                        "collective_wait_straggler",
                        f"{len(waiting)} GPU(s) read near-full utilization with little SM activity while "
                        f"{len(stragglers)} GPU(s) of the same job are far less busy: the signature of ranks "
                        "spinning in a collective (NCCL) waiting on a straggler. "
                        f"Slow: {', '.join(_gpu_label(r) for r in stragglers)}; waiting: "
                        f"{', '.join(_gpu_label(r) for r in waiting)}. Find why the slow rank lags "
                        "(its input pipeline, host CPU, a slower node or link) and balance the work.",
                        {
                            "waiting": [
                                {"gpu": _gpu_label(r), "busy": _r(r.busy), "sm_active": _r(r.mean(Metric.SM_ACTIVE))}
                                for r in waiting
                            ],
                            "stragglers": [
                                {"gpu": _gpu_label(r), "busy": _r(r.busy), "sm_active": _r(r.mean(Metric.SM_ACTIVE))}
                                for r in stragglers
                            ],
                            "util_gap": th.imbalance_util_gap,
                        },
                    )
                )
        sms = [(r, r.mean(Metric.SM_ACTIVE)) for r in rows if r.mean(Metric.SM_ACTIVE) is not None and r not in idle]
        if not straggler_found and len(sms) >= 2:
            lo = min(sms, key=lambda x: x[1] or 0.0)
            hi = max(sms, key=lambda x: x[1] or 0.0)
            if (hi[1] or 0.0) - (lo[1] or 0.0) >= th.imbalance_sm_gap:
                out.append(
                    Finding(
                        "gpu_imbalance",
                        f"SM activity differs widely across the job's GPUs ({_pct(lo[1])} on {_gpu_label(lo[0])} "
                        f"vs {_pct(hi[1])} on {_gpu_label(hi[0])}): the work is not evenly split.",
                        {
                            "per_gpu_sm_active": {_gpu_label(r): _r(v) for r, v in sms},
                            "spread_threshold": th.imbalance_sm_gap,
                        },
                    )
                )
    shared = [r for r in rows if r.max_share > 1]
    if shared:
        out.append(
            Finding(
                "gpu_shared",
                "GPU(s) of this job were used by several pods at once (time-slicing or MPS): their "
                "GPU-hours are split among the pods, and their metrics are device-wide, not this job's.",
                {
                    "gpus": {_gpu_label(r): r.max_share for r in shared},
                    "shared_fraction": _r(shared_fraction),
                },
            )
        )
    dropped: dict[str, int] = defaultdict(int)
    for r in rows:
        for m, s in r.stats.items():
            if s.dropped:
                dropped[m.value] += s.dropped
    if dropped:
        out.append(
            Finding(
                "garbage_dropped",
                "Some samples were garbage (NaN, out of range, e.g. GPU_UTIL 4294967295) and were "
                "dropped, not averaged; they count against coverage.",
                {"dropped": dict(sorted(dropped.items()))},
            )
        )
    mig = [r for r in rows if r.gpu.instance]
    if mig:
        out.append(
            Finding(
                "mig_busy_from_gr_engine",
                "MIG instances have no GPU_UTIL series; their busy signal is DCGM_FI_PROF_GR_ENGINE_ACTIVE "
                "and each counts as its slice fraction of a GPU.",
                {"instances": {_gpu_label(r): r.gpu.mig_profile or None for r in mig}},
            )
        )
    present = [set(r.stats) for r in rows]
    if len(rows) >= 2:
        partial = sorted(
            m.value
            for m in (Metric.SM_ACTIVE, Metric.TENSOR_ACTIVE, Metric.DRAM_ACTIVE, Metric.FP32_ACTIVE)
            if any(m in p for p in present) and not all(m in p for p in present)
        )
        if partial:
            out.append(
                Finding(
                    "metric_partial",
                    "Some metrics exist on only part of the job's GPUs (a node whose exporter lacks them): "
                    "job means use the GPUs that have them; waste is null when SM activity is partial.",
                    {"metrics": partial},
                )
            )
    return out
