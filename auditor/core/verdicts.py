"""The verdict of one job or one GPU from what its means show (DESIGN.md's verdict table, first
match wins), with the finding that says why and the advice that goes with it. Pure.

:mod:`auditor.core.summary` gathers the :class:`Evidence`; docs/verdicts.md is the user-facing
version of the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from auditor.core.job_summary import rounded as _r
from auditor.core.metrics import Metric
from auditor.core.mfu import MfuReference
from auditor.core.model import Finding, Verdict
from auditor.core.thresholds import Thresholds


class RankLoad(NamedTuple):
    """One GPU of a multi-GPU job in a straggler pattern: its label, utilization and SM activity."""

    gpu: str
    busy: float | None
    sm_active: float | None

    def to_json(self) -> dict[str, object]:
        return {"gpu": self.gpu, "busy": _r(self.busy), "sm_active": _r(self.sm_active)}


class Straggler(NamedTuple):
    """Ranks spinning in a collective (``waiting``) on the ranks far less busy (``slow``)."""

    slow: tuple[RankLoad, ...]
    waiting: tuple[RankLoad, ...]


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
    #: SM occupancy (resident warps / the SM's maximum), where exported
    occupancy: float | None = None
    #: the MFU estimate and what it is measured against (auditor/core/mfu.py; issue 28)
    mfu: float | None = None
    mfu_reference: MfuReference | None = None
    #: an inference server (a serving kind or class): its idle time is a serving question
    serving: bool = False
    #: share of the busy signal's samples in idle phases (auditor/core/accumulate.py, Stat.low)
    idle_phase: float | None = None
    #: ranks waiting in a collective on a slow rank (:func:`auditor.core.findings.straggler`)
    straggler: Straggler | None = None
    #: every GPU of a multi-GPU job in the hung-collective signature (:func:`hung`), else None
    stalled: tuple[RankLoad, ...] | None = None


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
    "periodic_stall": "Take the stalls off the GPU's critical path: asynchronous checkpointing "
    "(torch.distributed.checkpoint.async_save, a background writer), evaluation less often or on "
    "other GPUs, and overlapped I/O (prefetch the next shard while the current one trains).",
    "host_offload": "The optimizer or the parameters live on the host (ZeRO-offload style): keep "
    "the optimizer on the GPU if it fits (or shard it across GPUs instead: ZeRO-1/2, FSDP), overlap "
    "the transfers with compute, use larger transfer buckets from pinned memory, and do the "
    "optimizer step on the GPU.",
    "serving": "An inference server idle between requests: batch requests (continuous batching, a "
    "larger max batch / queue delay), consolidate replicas onto fewer GPUs, scale to zero when idle, "
    "or serve from a smaller share of a GPU (a MIG slice or time-slicing).",
    "straggler": "Find why the slow rank lags — its input pipeline, host CPU, a slower node, link or "
    "GPU (clocks, thermals) — and balance the work; the other ranks only wait for it.",
    "stalled": "The ranks spin in a collective that never completes: a rank died or deadlocked. Check "
    "the job's logs for the first failing rank; make NCCL timeouts end a hang instead of holding the "
    "GPUs (TORCH_NCCL_ASYNC_ERROR_HANDLING, the process group's timeout in init_process_group, "
    "TORCH_NCCL_DUMP_ON_TIMEOUT for what each rank was doing); rerun with NCCL_DEBUG=INFO; restart "
    "from the last checkpoint.",
    "low_occupancy": "Kernels occupy every SM with far too few warps (latency-bound): launch more "
    "threads per block and more blocks, use fewer registers per thread (launch bounds), or batch "
    "the work so each kernel has enough parallelism to hide memory and pipeline latency.",
    "no_kernel": "No kernel runs at all: the GPU is busy only with copies. Keep data on the GPU "
    "between steps instead of moving it each time, copy from pinned memory in large chunks, and "
    "overlap copies with compute (non_blocking copies on a side stream, prefetching).",
    Verdict.LOW_SM_EFFICIENCY: "Kernels keep the GPU 'busy' but occupy few SMs: launch more thread "
    "blocks (larger batch or problem size, fewer serial small kernels), and if this is a distributed "
    "job check for ranks waiting in collectives on a straggler (NCCL waits spin on a few SMs).",
    Verdict.MEMORY_BOUND: "SMs wait on memory while no pipe does much math: fuse element-wise "
    "kernels (torch.compile, fused optimizers), use FlashAttention / fused attention, and improve "
    "data locality (contiguous layouts, larger gathers).",
    "mfu_dram_busy": "Fuse the memory-bound work between the matmuls: FlashAttention / "
    "scaled_dot_product_attention instead of a materialised softmax, torch.compile (fused "
    "element-wise, dropout, norm and residual kernels), fused optimizers.",
    "mfu_tensor_low": "Feed the tensor cores larger matmuls: a larger (micro-)batch or sequence, "
    "wider shapes (multiples of 64/128), fewer non-matmul bottlenecks (torch.compile, fused kernels).",
    Verdict.NO_TENSOR_CORES: "Math runs on CUDA cores, not tensor cores: train in bf16 with "
    "mixed precision (torch.autocast), or at least enable TF32 "
    "(torch.backends.cuda.matmul.allow_tf32 = True / torch.set_float32_matmul_precision('high')).",
}


def pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.1f} %"


def classify(ev: Evidence, th: Thresholds, *, explain: bool = True) -> tuple[Verdict, list[Finding]]:
    """DESIGN.md's verdict table, in order, first match wins; the first finding says why.

    ``explain=False``: the verdict alone, no findings (the per-GPU verdicts of a summary, whose
    findings nobody reads: their messages and evidence are most of the cost)."""
    base: dict[str, object] = (
        {
            "busy_signal": ev.busy_metric.value if ev.busy_metric else None,
            "busy": _r(ev.busy),
            "sm_active": _r(ev.sm),
            "coverage": _r(ev.coverage),
        }
        if explain
        else {}
    )
    insufficient = Verdict.INSUFFICIENT_DATA
    if ev.busy is None:
        return insufficient, [] if not explain else [
            Finding(
                "metric_missing",
                "No utilization signal (neither DCGM_FI_DEV_GPU_UTIL nor DCGM_FI_PROF_GR_ENGINE_ACTIVE): "
                "nothing can be judged. Check that dcgm-exporter runs on the node and the pod is attributed.",
                {"missing": ["gpu_util", "gr_engine_active"]},
            )
        ]
    if ev.samples < th.min_samples or ev.span_s < th.min_span.total_seconds():
        return insufficient, [] if not explain else [
            Finding(
                "too_short",
                f"Only {ev.samples} samples over {ev.span_s:.0f} s: too little to judge "
                f"(needs {th.min_samples} samples and {th.min_span.total_seconds():.0f} s).",
                {**base, "samples": ev.samples, "span_seconds": round(ev.span_s, 3)},
            )
        ]
    if ev.coverage is not None and ev.coverage < th.min_coverage:
        return insufficient, [] if not explain else [
            Finding(
                "low_coverage",
                f"Only {pct(ev.coverage)} of the expected samples are present (minimum "
                f"{pct(th.min_coverage)}): scrape gaps, exporter restarts or garbage values; no judgement.",
                {**base, "min_coverage": th.min_coverage},
            )
        ]
    if ev.shared_fraction > th.max_shared_fraction:
        return insufficient, [] if not explain else [
            Finding(
                "gpu_shared_unjudged",
                f"{pct(ev.shared_fraction)} of this job's GPU time is on GPUs shared with other pods "
                "(time-slicing/MPS): the metrics are device-wide, not this job's; no judgement.",
                {**base, "shared_fraction": _r(ev.shared_fraction)},
            )
        ]
    if ev.silent_zero:
        return insufficient, [] if not explain else [
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
        return Verdict.IDLE, [] if not explain else [
            Finding(
                "idle",
                f"GPUs allocated but idle: {ev.busy_metric.value if ev.busy_metric else 'utilization'} "
                f"averages {pct(ev.busy)}. {_ADVICE[Verdict.IDLE]}",
                {**base, "threshold": th.idle_util, "power_w": _r(ev.power, 1)},
            )
        ]
    if ev.straggler is not None:
        return Verdict.UNDERUTILIZED, [_straggler(ev, base)] if explain else []
    if ev.stalled is not None:
        return Verdict.LOW_SM_EFFICIENCY, [_stalled(ev, th, base)] if explain else []
    if ev.busy < th.busy_util:
        return Verdict.UNDERUTILIZED, [_underutilized(ev, th, base)] if explain else []
    if ev.sm is None:
        return insufficient, [] if not explain else [
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
            return Verdict.LOW_SM_EFFICIENCY, _copy_only(ev, th, base) if explain else []
        if ev.sm / ev.busy >= th.sm_while_busy:
            # the SMs are well used while the GPU is busy: the shortfall is the idle time
            return Verdict.UNDERUTILIZED, [_underutilized(ev, th, base)] if explain else []
        return Verdict.LOW_SM_EFFICIENCY, [] if not explain else [
            Finding(
                "low_sm_efficiency",
                f"The GPU looks busy ({pct(ev.busy)} utilization) but only {pct(ev.sm)} of SM time "
                f"has work: about {pct(1 - ev.sm)} of the SMs sit idle. {_ADVICE[Verdict.LOW_SM_EFFICIENCY]}",
                {**base, "threshold": th.low_sm, "reason": "few_blocks", "sm_per_busy": _r(ev.sm / ev.busy)},
            )
        ]
    if _low_occupancy(ev, th):
        per_sm = (ev.occupancy or 0.0) / ev.sm
        return Verdict.LOW_SM_EFFICIENCY, [] if not explain else [
            Finding(
                "low_sm_efficiency",
                f"SMs are active ({pct(ev.sm)}) but almost no warps are resident on them: occupancy "
                f"{pct(ev.occupancy)} ({pct(per_sm)} of an SM's warps while it has work, below "
                f"{pct(th.low_occupancy)}), tensor pipes {pct(ev.tensor)}, FP32 pipe {pct(ev.fp32)}: "
                f"latency-bound, far too few warps per SM to hide latency. {_ADVICE['low_occupancy']}",
                {
                    **base,
                    "sm_occupancy": _r(ev.occupancy),
                    "occupancy_per_sm_active": _r(per_sm),
                    "tensor_active": _r(ev.tensor),
                    "fp32_active": _r(ev.fp32),
                    "low_occupancy": th.low_occupancy,
                    "reason": "low_occupancy",
                },
            )
        ]
    if ev.tensor is None:
        return insufficient, [] if not explain else [
            Finding(
                "metric_missing",
                "SMs are busy but there is no tensor-pipe series (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE): "
                "the kind of work cannot be told.",
                {**base, "missing": ["tensor_active"]},
            )
        ]
    pipe_ev = (
        {
            **base,
            "tensor_active": _r(ev.tensor),
            "dram_active": _r(ev.dram),
            "fp32_active": _r(ev.fp32),
            "fp16_active": _r(ev.fp16),
        }
        if explain
        else {}
    )
    if ev.tensor < th.tensor_idle:
        # The CUDA-core math signal needs the FP32 pipe; FP16 (which excludes HMMA) only adds to it.
        math = max(ev.fp32, ev.fp16 or 0.0) if ev.fp32 is not None else None
        extra: list[Finding] = []
        if explain and ev.fp32 is None:
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
            return Verdict.MEMORY_BOUND, [] if not explain else [
                Finding(
                    "memory_bound",
                    f"SMs are busy ({pct(ev.sm)}) but neither the tensor ({pct(ev.tensor)}) nor the "
                    f"FP32/FP16 pipes ({pct(math)}) do much math: the warps wait on memory "
                    f"(DRAM {pct(ev.dram)}; latency-bound gathers keep DRAM well below its peak). "
                    f"{_ADVICE[Verdict.MEMORY_BOUND]}",
                    {**pipe_ev, "reason": "no_math_pipe", "math_pipe_idle": th.math_pipe_idle},
                ),
                *extra,
            ]
        if ev.dram is not None and ev.dram >= th.dram_busy:
            return Verdict.MEMORY_BOUND, [] if not explain else [
                Finding(
                    "memory_bound",
                    f"SMs are busy ({pct(ev.sm)}), tensor pipes (nearly) idle ({pct(ev.tensor)}) and DRAM busy "
                    f"({pct(ev.dram)}): the work streams memory rather than doing math. "
                    f"{_ADVICE[Verdict.MEMORY_BOUND]}",
                    {**pipe_ev, "reason": "dram_busy", "dram_busy": th.dram_busy},
                ),
                *extra,
            ]
        if math is not None or ev.dram is not None:
            why = (
                f"the FP32/FP16 pipes are busy ({pct(math)})"
                if math is not None
                else f"DRAM is quiet ({pct(ev.dram)}), so the SMs compute on CUDA cores"
            )
            return Verdict.NO_TENSOR_CORES, [] if not explain else [
                Finding(
                    "no_tensor_cores",
                    f"SMs are busy ({pct(ev.sm)}) but the tensor cores are (nearly) idle ({pct(ev.tensor)}); "
                    f"{why}. {_ADVICE[Verdict.NO_TENSOR_CORES]}",
                    {**pipe_ev, "reason": "math_pipe_busy" if math is not None else "dram_quiet"},
                ),
                *extra,
            ]
        return insufficient, [] if not explain else [
            Finding(
                "metric_missing",
                "Tensor pipes are idle, but with neither DRAM nor FP32-pipe series memory-bound and "
                "CUDA-core work cannot be told apart.",
                {**pipe_ev, "missing": ["dram_active", "fp32_active"]},
            )
        ]
    # a healthy job's waste is bounded (healthy_max_waste) and it has no long idle phases
    if ev.sm < 1.0 - th.healthy_max_waste or _periodic(ev, th):
        if _periodic(ev, th) or ev.sm / ev.busy >= th.sm_while_busy:
            return Verdict.UNDERUTILIZED, [_underutilized(ev, th, base)] if explain else []
        return Verdict.LOW_SM_EFFICIENCY, [] if not explain else [
            Finding(
                "low_sm_efficiency",
                f"The GPU is busy ({pct(ev.busy)} utilization) but only {pct(ev.sm)} of SM time has work: "
                f"{pct(1 - ev.sm)} of its GPU-hours are waste, more than a healthy job's "
                f"{pct(th.healthy_max_waste)}. {_ADVICE[Verdict.LOW_SM_EFFICIENCY]}",
                {
                    **base,
                    "threshold": th.low_sm,
                    "healthy_max_waste": th.healthy_max_waste,
                    "reason": "few_blocks",
                    "sm_per_busy": _r(ev.sm / ev.busy),
                },
            )
        ]
    low = _low_mfu(ev, th, pipe_ev, explain)
    if low is not None:
        return Verdict.LOW_MFU, low
    if not explain:
        return Verdict.HEALTHY, []
    findings = [
        Finding(
            "healthy",
            f"SMs busy ({pct(ev.sm)}) with tensor cores in use ({pct(ev.tensor)}).",
            pipe_ev,
        )
    ]
    if ev.tensor < th.tensor_headroom:
        dram_busy = ev.dram is not None and ev.dram >= th.dram_busy
        findings.append(
            Finding(
                "tensor_headroom",
                f"Tensor pipes are only {pct(ev.tensor)} busy: there is room to grow"
                + (
                    f". DRAM is busy ({pct(ev.dram)}): memory-bound kernels take much of the time "
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


def _low_mfu(ev: Evidence, th: Thresholds, pipe_ev: dict[str, object], explain: bool) -> list[Finding] | None:
    """``low_mfu`` (with its finding) when the MFU estimate is below ``low_mfu_ratio`` of the
    job's reference; None when it is not, or when there is no reference or estimate."""
    ref = ev.mfu_reference
    if ref is None or ev.mfu is None or ev.mfu >= th.low_mfu_ratio * ref.value:
        return None
    if not explain:
        return []
    dram_busy = ev.dram is not None and ev.dram >= th.dram_busy
    reason = "dram_busy" if dram_busy else "tensor_low"
    why = (
        f"DRAM is busy ({pct(ev.dram)}) while the tensor pipes are {pct(ev.tensor)} busy: unfused "
        "attention and element-wise kernels stream memory between the matmuls"
        if dram_busy
        else f"the tensor pipes are only {pct(ev.tensor)} busy"
    )
    source = "its lineage's best run" if ref.source == "lineage-best" else f"the {ref.source} reference"
    return [
        Finding(
            "low_mfu",
            f"SMs are busy ({pct(ev.sm)}) and the tensor cores in use, but the MFU estimate is "
            f"{pct(ev.mfu)} against {pct(ref.value)} for {source} ({pct(ev.mfu / ref.value)} of it): at the "
            f"reference the same work would need {pct(1 - ev.mfu / ref.value)} fewer GPU-hours; "
            f"{why}. {_ADVICE['mfu_' + reason]}",
            {
                **pipe_ev,
                "mfu_estimate": _r(ev.mfu),
                "mfu_reference": _r(ref.value),
                "mfu_class": ref.source,
                "low_mfu_ratio": th.low_mfu_ratio,
                "reason": reason,
            },
        )
    ]


def _underutilized(ev: Evidence, th: Thresholds, base: dict[str, object]) -> Finding:
    """The underutilized finding, its advice chosen by what the SMs do while the GPU is busy:
    well used (``input_stall``: the job waits on its input or host), barely used
    (``launch_bound``: many tiny kernels with gaps), or unknown without SM activity."""
    busy = ev.busy
    assert busy is not None, "classify() returns metric_missing before an underutilized finding"
    head = f"Utilization averages {pct(busy)}"
    head += (
        f", clearly below full (< {pct(th.busy_util)})"
        if busy < th.busy_util
        else f": the GPU is idle {pct(1 - busy)} of the time"
    )
    ev_out: dict[str, object] = {**base, "threshold": th.busy_util}
    special = _idle_reason(ev, th, head, ev_out)
    if special is not None:
        return special
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
            f"{head}, but while it runs its SMs are well used ({pct(per_busy)} of busy time): the job "
            f"waits on its input pipeline or host code between steps. {_ADVICE['input_stall']}",
            ev_out,
        )
    ev_out["reason"] = "launch_bound"
    return Finding(
        "underutilized",
        f"{head}, and even while a kernel runs only {pct(per_busy)} of SM time has work: many small "
        f"kernels with launch gaps (launch-bound). {_ADVICE['launch_bound']}",
        ev_out,
    )


def _idle_reason(ev: Evidence, th: Thresholds, head: str, ev_out: dict[str, object]) -> Finding | None:
    """The underutilized finding when the idle time has a cause the evidence names — a server
    between requests, transfers to and from the host, idle phases — else None (the SM activity
    while busy then tells input stall from launch-bound). The order: the job's kind or class says
    serving outright; PCIe busy both ways is the host's work, whatever its rhythm; idle phases
    last."""
    if ev.serving:
        ev_out["reason"] = "serving"
        return Finding(
            "underutilized",
            f"{head}: an inference server (a serving kind or class) idle between requests "
            f"(SM activity {pct(ev.sm)}). {_ADVICE['serving']}",
            ev_out,
        )
    if ev.pcie_rx is not None and ev.pcie_tx is not None and min(ev.pcie_rx, ev.pcie_tx) >= th.pcie_offload_bytes:
        ev_out.update(
            reason="host_offload",
            pcie_rx_bytes_per_s=_r(ev.pcie_rx, 0),
            pcie_tx_bytes_per_s=_r(ev.pcie_tx, 0),
            pcie_offload_bytes=th.pcie_offload_bytes,
        )
        return Finding(
            "underutilized",
            f"{head}, while PCIe is busy both ways ({_gbps(ev.pcie_tx)} device→host, {_gbps(ev.pcie_rx)} "
            f"host→device): gradients go to the host and weights come back every step, and the GPU "
            f"waits on the host in between (SM activity {pct(ev.sm)}). {_ADVICE['host_offload']}",
            ev_out,
        )
    if _periodic(ev, th) and ev.idle_phase is not None:
        ev_out.update(reason="periodic_stall", idle_phase_share=_r(ev.idle_phase), stall_share=th.stall_share)
        return Finding(
            "underutilized",
            f"{head}, and the busy signal is a square wave: about {pct(ev.idle_phase)} of the time the GPU "
            f"sits in idle phases of tens of seconds or more between busy ones (utilization near 0, then "
            f"near full) — synchronous checkpoints, evaluation or data loading that stop training. "
            f"{_ADVICE['periodic_stall']}",
            ev_out,
        )
    return None


def _periodic(ev: Evidence, th: Thresholds) -> bool:
    """Idle phases hold at least ``stall_share`` of the samples and most of the idle time (so a
    job idle in short gaps between steps, with one slow start, is not called periodic)."""
    if ev.idle_phase is None or ev.busy is None:
        return False
    return ev.idle_phase >= th.stall_share and ev.idle_phase >= 0.5 * (1.0 - ev.busy)


def _low_occupancy(ev: Evidence, th: Thresholds) -> bool:
    """Latency-bound CUDA-core work: SMs active with few warps resident (occupancy per active SM
    below ``low_occupancy``), tensor pipes idle, a CUDA-core pipe doing some math but far from
    its throughput (below ``math_pipe_busy``) and DRAM not busy — nothing is saturated, the warps
    wait on their own dependency chains. A GEMM's large tiles also keep few warps (0.15) but use
    the tensor cores; an FP32 product without TF32 keeps its FP32 pipe busy (0.73); gathers with
    no math pipe at all stay memory_bound."""
    if ev.occupancy is None or ev.sm is None or ev.sm <= 0 or ev.fp32 is None:
        return False
    if ev.tensor is not None and ev.tensor >= th.tensor_idle:
        return False
    math = max(ev.fp32, ev.fp16 or 0.0)
    if not th.math_pipe_idle <= math < th.math_pipe_busy:
        return False
    if ev.dram is not None and ev.dram >= th.dram_busy:
        return False
    return ev.occupancy / ev.sm < th.low_occupancy


def _straggler(ev: Evidence, base: dict[str, object]) -> Finding:
    """underutilized, headlined by the slow rank the others wait for (the cause, not the pooled
    symptom: the waiting ranks' spinning reads as launch-bound)."""
    assert ev.straggler is not None
    slow, waiting = ev.straggler

    def loads(rs: tuple[RankLoad, ...], what: str) -> str:
        return "; ".join(f"{r.gpu} ({what} {pct(r.busy)}, SM activity {pct(r.sm_active)})" for r in rs)

    return Finding(
        "underutilized",
        f"A straggler: {loads(slow, 'utilization')} is slow, and the other rank(s) wait for it in the "
        f"collective: {loads(waiting, 'utilization')} — near-full utilization with little SM activity "
        f"is NCCL spinning, not work. {_ADVICE['straggler']}",
        {
            **base,
            "reason": "straggler",
            "slow": [r.to_json() for r in slow],
            "waiting": [r.to_json() for r in waiting],
        },
    )


def hung(ev: Evidence, th: Thresholds) -> bool:
    """One GPU in the hung-collective signature: busy (≥ ``busy_util``) with a kernel running
    (not copies alone) on few SMs (< ``low_sm``), every math pipe and DRAM ~0 (below
    ``stall_pipe_idle`` / ``stall_dram_idle``), where power is known below the model's power floor
    (idle draw), for at least ``stall_min_span``. NCCL's ranks poll a flag in a few blocks while a
    peer is dead; a launch-bound or latency-bound kernel moves a pipe, DRAM or power. Tensor and
    DRAM series are needed: without them "no math, no memory" cannot be told."""
    if ev.busy is None or ev.busy < th.busy_util or ev.sm is None or ev.sm >= th.low_sm or _no_kernel(ev, th):
        return False
    if ev.tensor is None or ev.dram is None or ev.dram >= th.stall_dram_idle:
        return False
    if any(p is not None and p >= th.stall_pipe_idle for p in (ev.tensor, ev.fp32, ev.fp16)):
        return False
    floor = th.power_floor(ev.model)
    if ev.power is not None and floor is not None and ev.power >= floor:
        return False
    return ev.span_s >= th.stall_min_span.total_seconds()


def _stalled(ev: Evidence, th: Thresholds, base: dict[str, object]) -> Finding:
    """low_sm_efficiency headlined as a hung collective: all the job's GPUs spin, none works."""
    assert ev.stalled is not None
    ranks = ev.stalled
    return Finding(
        "low_sm_efficiency",
        f"Stalled: all {len(ranks)} GPUs of the job read {pct(ev.busy)} utilization with only {pct(ev.sm)} "
        f"SM activity, no math (tensor {pct(ev.tensor)}, FP32 {pct(ev.fp32)}, FP16 {pct(ev.fp16)}), "
        f"no memory traffic (DRAM {pct(ev.dram)})"
        + ("" if ev.power is None else f" and idle power ({ev.power:.0f} W per GPU)")
        + f" for at least {th.stall_min_span.total_seconds() / 60:g} min: no rank is working. "
        f"{_ADVICE['stalled']}",
        {
            **base,
            "reason": "stalled",
            "gpus": [r.to_json() for r in ranks],
            "tensor_active": _r(ev.tensor),
            "fp32_active": _r(ev.fp32),
            "fp16_active": _r(ev.fp16),
            "dram_active": _r(ev.dram),
            "power_w": _r(ev.power, 1),
            "power_floor_w": th.power_floor(ev.model),
            "stall_pipe_idle": th.stall_pipe_idle,
            "stall_dram_idle": th.stall_dram_idle,
            "stall_min_span_s": th.stall_min_span.total_seconds(),
        },
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
            f"The GPU reads {pct(ev.busy)} utilization but no kernel runs (graphics engine "
            f"{pct(ev.gr_engine)}, SM activity {pct(ev.sm)}): the time goes to copies; {where}. "
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
