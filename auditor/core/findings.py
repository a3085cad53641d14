"""The findings beyond a verdict's own: multi-GPU patterns (idle ranks, stragglers, imbalance),
sharing, garbage, MIG, partial metrics, suspect zero telemetry and the MFU estimate. Pure;
the codes are documented in docs/findings.md."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from auditor.core.accumulate import RowView
from auditor.core.figures import gpu_name
from auditor.core.job_summary import rounded as _r
from auditor.core.metrics import Metric
from auditor.core.model import Finding, Verdict
from auditor.core.thresholds import Thresholds
from auditor.core.verdicts import RankLoad, Straggler, pct


def silent_zero(row: RowView, th: Thresholds) -> dict[str, object] | None:
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


def gpu_label(r: RowView) -> str:
    """The pod and its GPU, named as every surface names a GPU (:func:`~auditor.core.figures.gpu_name`)."""
    g = r.gpu
    return f"{r.pod.pod} {gpu_name(g.hostname, g.index, g.uuid, g.instance)}"


def straggler(rows: Sequence[RowView], th: Thresholds) -> Straggler | None:
    """Ranks spinning in a collective on a straggler: GPUs at utilization ≥ ``busy_util`` with SM
    activity < ``low_sm`` (NCCL kernels spin on a few SMs) while other, non-idle GPUs of the job are
    at least ``imbalance_util_gap`` less busy (the slow rank they wait for). None otherwise."""
    if len(rows) < 2:
        return None
    busy = [(r, r.busy) for r in rows if r.busy is not None]
    waiting = [
        r for r, b in busy if b >= th.busy_util and (sm := r.mean(Metric.SM_ACTIVE)) is not None and sm < th.low_sm
    ]
    if not waiting:
        return None
    top = min(r.busy or 0.0 for r in waiting)
    slow = [r for r, b in busy if r not in waiting and b >= th.idle_util and b <= top - th.imbalance_util_gap]
    if not slow:
        return None
    return Straggler(tuple(_load(r) for r in slow), tuple(_load(r) for r in waiting))


def _load(r: RowView) -> RankLoad:
    return RankLoad(gpu_label(r), r.busy, r.mean(Metric.SM_ACTIVE))


def job_findings(rows: Sequence[RowView], th: Thresholds, verdict: Verdict, shared_fraction: float) -> list[Finding]:
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
                    {"idle_gpus": [gpu_label(r) for r in idle], "gpus": len(rows), "threshold": th.idle_util},
                )
            )
        found = straggler(rows, th)
        straggler_found = found is not None
        if found is not None:
            slow, waiting = found
            out.append(
                Finding(
                    "collective_wait_straggler",
                    f"{len(waiting)} GPU(s) read near-full utilization with little SM activity while "
                    f"{len(slow)} GPU(s) of the same job are far less busy: the signature of ranks "
                    "spinning in a collective (NCCL) waiting on a straggler. "
                    f"Slow: {', '.join(r.gpu for r in slow)}; waiting: "
                    f"{', '.join(r.gpu for r in waiting)}. Find why the slow rank lags "
                    "(its input pipeline, host CPU, a slower node or link) and balance the work.",
                    {
                        "waiting": [r.to_json() for r in waiting],
                        "stragglers": [r.to_json() for r in slow],
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
                        f"SM activity differs widely across the job's GPUs ({pct(lo[1])} on {gpu_label(lo[0])} "
                        f"vs {pct(hi[1])} on {gpu_label(hi[0])}): the work is not evenly split.",
                        {
                            "per_gpu_sm_active": {gpu_label(r): _r(v) for r, v in sms},
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
                    "gpus": {gpu_label(r): r.max_share for r in shared},
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
                {"instances": {gpu_label(r): r.gpu.mig_profile or None for r in mig}},
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
