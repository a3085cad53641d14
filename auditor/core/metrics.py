"""The DCGM metrics gpu-auditor reads: their exporter names, units and valid ranges.

Everything downstream of a source works in one unit per metric: activities as ratios 0–1,
power in watts, framebuffer in MiB, clocks in MHz. The exporter names differ between DCGM
versions (4.6 renamed every field to ``*_RATIO``/``*_UTIL_RATIO``), so each metric carries every
name it is known by; sources match all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Metric(str, Enum):
    """One quantity the audit reads, independent of how an exporter names it."""

    GPU_UTIL = "gpu_util"
    GR_ENGINE_ACTIVE = "gr_engine_active"
    SM_ACTIVE = "sm_active"
    SM_OCCUPANCY = "sm_occupancy"
    TENSOR_ACTIVE = "tensor_active"
    FP32_ACTIVE = "fp32_active"
    FP16_ACTIVE = "fp16_active"
    DRAM_ACTIVE = "dram_active"
    FB_USED = "fb_used"
    POWER = "power"
    SM_CLOCK = "sm_clock"
    MAX_SM_CLOCK = "max_sm_clock"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """How one metric is exported and what a sane value looks like.

    ``scale`` turns the exported number into the project's unit (GPU_UTIL is a percent even
    under its 4.6 ``_RATIO`` name). Values outside ``[low, high]`` after scaling are garbage
    (e.g. GPU_UTIL 4294967295): sources drop and count them, never average them. ``clamp_above``
    tolerates small overshoots that are known bugs (SM_ACTIVE slightly above 1 on MIG, DCGM #152)
    by clamping them to ``high`` instead of dropping them.
    """

    metric: Metric
    names: tuple[str, ...]
    unit: str
    scale: float = 1.0
    low: float = 0.0
    high: float = 1.0
    clamp_above: float | None = None
    is_ratio: bool = True


SPECS: dict[Metric, MetricSpec] = {
    s.metric: s
    for s in (
        MetricSpec(Metric.GPU_UTIL, ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"), "ratio", scale=0.01),
        MetricSpec(
            Metric.GR_ENGINE_ACTIVE,
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"),
            "ratio",
            clamp_above=1.05,
        ),
        MetricSpec(
            Metric.SM_ACTIVE,
            ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"),
            "ratio",
            clamp_above=1.05,
        ),
        MetricSpec(
            Metric.SM_OCCUPANCY,
            ("DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"),
            "ratio",
            clamp_above=1.05,
        ),
        MetricSpec(
            Metric.TENSOR_ACTIVE,
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_UTIL_RATIO"),
            "ratio",
            clamp_above=1.05,
        ),
        MetricSpec(
            Metric.FP32_ACTIVE,
            ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_UTIL_RATIO"),
            "ratio",
            clamp_above=1.05,
        ),
        MetricSpec(
            Metric.FP16_ACTIVE,
            ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_UTIL_RATIO"),
            "ratio",
            clamp_above=1.05,
        ),
        MetricSpec(
            Metric.DRAM_ACTIVE,
            ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO"),
            "ratio",
            clamp_above=1.05,
        ),
        MetricSpec(Metric.FB_USED, ("DCGM_FI_DEV_FB_USED",), "MiB", high=16_777_216.0, is_ratio=False),
        MetricSpec(Metric.POWER, ("DCGM_FI_DEV_POWER_USAGE",), "W", high=5_000.0, is_ratio=False),
        MetricSpec(Metric.SM_CLOCK, ("DCGM_FI_DEV_SM_CLOCK",), "MHz", high=10_000.0, is_ratio=False),
        MetricSpec(Metric.MAX_SM_CLOCK, ("DCGM_FI_DEV_MAX_SM_CLOCK",), "MHz", high=10_000.0, is_ratio=False),
    )
}

#: exporter name → metric, for every known name
BY_NAME: dict[str, Metric] = {name: spec.metric for spec in SPECS.values() for name in spec.names}


def normalize(metric: Metric, raw: float) -> float | None:
    """Return ``raw`` in the project's unit, or ``None`` when it is garbage.

    Garbage is NaN, ±Inf, or a value outside the metric's valid range after scaling (small
    known overshoots are clamped, see :class:`MetricSpec`).
    """
    spec = SPECS[metric]
    if raw != raw or raw in (float("inf"), float("-inf")):
        return None
    value = raw * spec.scale
    if value < spec.low:
        return None
    if value > spec.high:
        if spec.clamp_above is not None and value <= spec.clamp_above:
            return spec.high
        return None
    return value
