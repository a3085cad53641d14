"""Every number the verdicts depend on, in one documented, configurable place.

``docs/verdicts.md`` explains each threshold and how the shipped H200 traces land against it.
The defaults are starting points chosen from those measurements and DCGM's own guidance
(SM activity ≥ 0.8 "necessary but not sufficient", < 0.5 "likely ineffective"); operators tune
them through :meth:`Thresholds.from_mapping` (the settings file's ``thresholds:`` section and
``GPU_AUDITOR_THRESHOLDS__<KEY>`` variables, auditor/settings.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any, Mapping

from auditor.core.ranges import RATIO, Range
from auditor.errors import BadInput
from auditor.timeparse import parse_duration

#: Per GPU model: the power (W) above which a GPU is clearly doing work. Used by the silent-zero
#: guard (profiling fields reading exactly 0 on a GPU drawing this much are suspect telemetry)
#: and by the stalled rule (a hung collective's ranks draw less: idle power). Roughly twice the
#: idle draw: an idle H200 draws ~120 W, four spinning thread blocks 124 W, 2–32 blocks polling
#: a flag 122–123 W (h200-hang), real work 400–700 W (../shared/traces). Matched by substring of ``modelName``,
#: longest key first; a model not listed has no floor (the guard then treats power as unknown).
DEFAULT_POWER_FLOOR_W: dict[str, float] = {
    "H200": 250.0,
    "H100": 200.0,
    "H800": 200.0,
    "A100": 150.0,
    "A800": 150.0,
    "B200": 350.0,
    "L40S": 120.0,
    "L4": 40.0,
}

#: Per GPU model: the SM clock (MHz) the peak FLOP rate is specified at (= the max SM clock),
#: for the MFU proxy when the exporter has no ``DCGM_FI_DEV_MAX_SM_CLOCK`` series.
DEFAULT_MAX_SM_CLOCK_MHZ: dict[str, float] = {
    "H200": 1980.0,
    "H100 PCIe": 1755.0,
    "H100": 1980.0,
    "A100": 1410.0,
    # NVIDIA's B200 datasheet gives no clock; 1980 MHz is the boost clock of third-party spec
    # tables, which put the tensor clock at 1860 MHz (docs/verdicts.md, "The MFU estimate")
    "B200": 1980.0,
}


def match_model(table: Mapping[str, float], model: str) -> float | None:
    """The value of the longest key of ``table`` contained in ``model`` (None when none is).

    Case-insensitive: environment variable names carry no case (``…__POWER_FLOOR_W__H200``
    arrives as ``h200``), and no two GPU models differ by case alone."""
    best: tuple[int, float] | None = None
    folded = model.casefold()
    for key, value in table.items():
        if key and key.casefold() in folded and (best is None or len(key) > best[0]):
            best = (len(key), value)
    return best[1] if best else None


@dataclass(frozen=True)
class Thresholds:
    """The verdict thresholds (all activities are ratios 0–1 of the job's mean).

    Verdicts are decided in DESIGN.md's order, first match wins; see docs/verdicts.md.
    """

    #: below this coverage (valid samples / expected samples) → insufficient_data
    min_coverage: float = 0.8
    #: fewer valid samples of the busy signal than this → insufficient_data
    min_samples: int = 4
    #: an observed span shorter than this → insufficient_data
    min_span: timedelta = timedelta(minutes=1)
    #: busy signal (GPU_UTIL, or GR_ENGINE_ACTIVE on MIG) below this → idle
    idle_util: float = 0.05
    #: busy signal below this (and not idle) → underutilized
    busy_util: float = 0.6
    #: SM activity below this on a busy GPU → low_sm_efficiency (DCGM: < 0.5 "likely ineffective")
    low_sm: float = 0.5
    #: SM activity per unit of busy time (sm_active / busy) at or above which a job's low SM
    #: activity is its idle time, not its kernels: underutilized rather than low_sm_efficiency
    #: (the recorded input-stalled jobs read 0.84–0.88, jobs on a few SMs 0.008–0.03)
    sm_while_busy: float = 0.7
    #: PCIe RX + TX at or above this (bytes/s), while no kernel runs, → the copy_only finding
    #: speaks of a transfer-bound job (pinned host→device copies on an H200 read 59 GB/s RX)
    pcie_busy_bytes: float = 1e9
    #: tensor-pipe activity below this → the tensor cores are (nearly) idle: single-digit tensor
    #: activity is single-digit MFU (the recorded materialised-attention job: tensor 7.8 %, MFU
    #: 0.078), never a healthy job on a tensor-capable GPU
    tensor_idle: float = 0.1
    #: FP32/FP16-pipe activity below this → no CUDA-core pipe is doing math either
    math_pipe_idle: float = 0.05
    #: DRAM activity at or above this (with idle tensor pipes) → memory_bound; without the FP32
    #: pipe series this alone separates memory_bound from no_tensor_cores
    dram_busy: float = 0.3
    #: a healthy job whose tensor activity is below this gets an informational finding
    tensor_headroom: float = 0.3
    #: a healthy job's SM activity is at least 1 − this: its waste (GPU-hours without SM activity)
    #: is at most this share of its GPU-hours; a busy job below it is underutilized (idle time) or
    #: low_sm_efficiency (SMs half used while busy). The recorded healthy jobs waste 3–30 %
    healthy_max_waste: float = 0.35
    #: the share of the busy signal's samples in idle phases (whole idle buckets, and the low level
    #: of buckets that swing between idle and busy: auditor/core/accumulate.py) at or above which
    #: a job is underutilized with ``reason: periodic_stall`` (checkpoints, evaluation, data)
    stall_share: float = 0.15
    #: SM occupancy per unit of SM activity (resident warps / the SM's maximum while an SM has
    #: work) below this, with idle tensor pipes, a CUDA-core pipe between ``math_pipe_idle`` and
    #: ``math_pipe_busy`` and DRAM below ``dram_busy`` → low_sm_efficiency ``reason:
    #: low_occupancy`` (latency-bound: one warp per SM reads 1/64 = 0.016, a register-limited
    #: kernel of 8 warps 0.125; the recorded tensor-idle jobs read 0.147 (FP32 MLP, its FP32 pipe
    #: at 0.73) to 0.80)
    low_occupancy: float = 0.2
    #: a CUDA-core (FP32/FP16) pipe at or above this is throughput-bound, not latency-bound
    math_pipe_busy: float = 0.5
    #: PCIe RX and TX each at or above this (bytes/s) on an underutilized GPU →
    #: ``reason: host_offload`` (optimizer or parameters on the host, ZeRO-offload); the recorded
    #: jobs that run on the GPU alone send at most 30 MB/s
    pcie_offload_bytes: float = 2.5e8
    #: an MFU estimate below this fraction of the job's reference MFU (its workload class's, or
    #: its lineage's best run) → low_mfu (auditor/core/mfu.py; docs/verdicts.md "Reference MFU").
    #: So a healthy job's recoverable GPU-hours are at most 1 − this (35 %, as its waste); the
    #: recorded bf16 LLM trainings read 0.40 (the founding case, 0.158 of 0.40) or ≥ 0.86 of it
    low_mfu_ratio: float = 0.65
    #: straggler: a GPU at least this much less busy than the job's waiting GPUs
    imbalance_util_gap: float = 0.3
    #: spread of SM activity across one job's GPUs at or above this → gpu_imbalance
    imbalance_sm_gap: float = 0.3
    #: share of a job's GPU time on GPUs shared with other pods above which it is not judged
    max_shared_fraction: float = 0.5
    #: the share of the dense tensor peak a tensor pipe delivers per active cycle at the max clock,
    #: the MFU estimate's scale: a bf16 8192³ product on the H200 reads tensor 0.927 at 0.742 of
    #: the max clock and measures 0.668 of the peak (0.97); with it the recorded bf16/FP8 jobs'
    #: estimates fall within ±0.02 of measured MFU, without it they read up to +0.033 high
    mfu_tensor_rate: float = 0.97
    #: without an SM-clock series the MFU estimate assumes the clock at 1 − this × tensor activity
    #: of the max (fit on the H200's recorded clocks at its power cap: within ±0.06 of the clock
    #: share on the recorded jobs; the estimate within ±0.035 of measured on bf16/FP8, where assuming
    #: the max clock read a bf16 product 0.23 high)
    mfu_clock_drop: float = 0.3
    #: stalled (a hung collective, issue 33): every GPU of a multi-GPU job busy with SM activity
    #: below ``low_sm`` while the tensor, FP32 and FP16 pipes each read below this — ranks polling
    #: a flag that never changes do no math (the recorded hang: 0.000 on every pipe; the demo's
    #: spin-waiting kernel FP32 0.0014; a latency-bound kernel ≥ ``math_pipe_idle``)
    stall_pipe_idle: float = 0.01
    #: stalled: DRAM activity below this on every GPU (the recorded hang reads 0.000; a copy or a
    #: gather moves memory)
    stall_dram_idle: float = 0.01
    #: stalled: each GPU observed in that signature for at least this long (a collective that
    #: has not completed in minutes will not; a short wait for a slow peer is a straggler)
    stall_min_span: timedelta = timedelta(minutes=5)
    power_floor_w: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_POWER_FLOOR_W))
    max_sm_clock_mhz: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MAX_SM_CLOCK_MHZ))

    def power_floor(self, model: str) -> float | None:
        return match_model(self.power_floor_w, model)

    def max_clock(self, model: str) -> float | None:
        return match_model(self.max_sm_clock_mhz, model)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, *, where: str = "thresholds") -> "Thresholds":
        """Defaults overridden by ``values`` (a settings file's ``thresholds:`` section, or the
        ``GPU_AUDITOR_THRESHOLDS__*`` variables, whose values arrive as text).

        Every problem is a :class:`ThresholdError` naming the key: an unknown key, a value of the
        wrong type, one outside its unit's range (:data:`UNITS`), or a pair that contradicts the
        verdict order (:data:`ORDERED`) — a threshold that silently never fires is worse than a
        refusal at start."""
        base = cls()
        if not values:
            return base
        if not isinstance(values, Mapping):
            raise ThresholdError("", f"expected a mapping of threshold → value, got {values!r}", where)
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            key = str(key)
            if key not in UNITS:
                raise ThresholdError(key, f"unknown threshold (known: {', '.join(sorted(UNITS))})", where)
            if key in _TABLES:
                if not isinstance(raw, Mapping):
                    raise ThresholdError(
                        key, f"expected a mapping of GPU model → {UNITS[key].unit}, got {raw!r}", where
                    )
                merged = dict(getattr(base, key))
                for model, v in raw.items():
                    value = _number(v, f"{key}.{model}", UNITS[key], where)
                    merged = {m: x for m, x in merged.items() if m.casefold() != str(model).casefold()}
                    merged[str(model)] = value
                changes[key] = merged
            elif key in _SPANS:
                changes[key] = timedelta(seconds=_number(_seconds(raw, where, key), key, UNITS[key], where))
            elif key == "min_samples":
                changes[key] = int(_number(raw, key, UNITS[key], where))
            else:
                changes[key] = _number(raw, key, UNITS[key], where)
        out = replace(base, **changes)
        for low, high, why in ORDERED:
            if getattr(out, low) > getattr(out, high):
                raise ThresholdError(
                    low if low in changes else high,
                    f"{low} ({getattr(out, low):g}) must not exceed {high} ({getattr(out, high):g}): {why}",
                    where,
                )
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (for ``explain`` and the audit-run record)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.total_seconds() if isinstance(v, timedelta) else (dict(v) if isinstance(v, Mapping) else v)
        return out


class ThresholdError(BadInput):
    """A bad ``thresholds`` entry: ``key`` is its dotted path inside the section (``low_sm``,
    ``power_floor_w.H200``), ``reason`` what is wrong, so a caller can name the file or the
    environment variable it came from."""

    def __init__(self, key: str, reason: str, where: str = "thresholds") -> None:
        super().__init__(f"{where}.{key}: {reason}" if key else f"{where}: {reason}")
        self.key = key
        self.reason = reason


_SECONDS = Range("seconds")
#: every threshold's unit and valid range; for the per-model tables, the range of each entry
UNITS: dict[str, Range] = {
    **{f.name: RATIO for f in fields(Thresholds)},
    "min_samples": Range("samples", integer=True),
    "min_span": _SECONDS,
    "stall_min_span": _SECONDS,
    "power_floor_w": Range("W", 0.0, 5_000.0),
    "max_sm_clock_mhz": Range("MHz", 1.0, 10_000.0),  # a divisor of the MFU proxy: never 0
    "pcie_busy_bytes": Range("bytes/s", 0.0, 1e12),
    "pcie_offload_bytes": Range("bytes/s", 0.0, 1e12),
}
_TABLES = ("power_floor_w", "max_sm_clock_mhz")
#: thresholds that are durations: seconds, or a duration such as ``90s``/``2m``
_SPANS = ("min_span", "stall_min_span")
#: (lower, upper, why): pairs whose order the verdict rules rely on; equal turns the band off
ORDERED: tuple[tuple[str, str, str], ...] = (
    ("idle_util", "busy_util", "a job below idle_util is idle, one between the two underutilized"),
    ("tensor_idle", "tensor_headroom", "tensor_headroom is the band above tensor_idle where a healthy job gets a hint"),
    ("math_pipe_idle", "math_pipe_busy", "a latency-bound kernel's pipe is between the two (low_occupancy)"),
)


def _seconds(raw: Any, where: str, key: str = "min_span") -> Any:
    """A duration threshold (``min_span``, ``stall_min_span``) as seconds: a number, or a duration
    such as ``90s``/``2m`` (the settings' format)."""
    if not isinstance(raw, str) or _is_number_text(raw):
        return raw
    if re.fullmatch(r"\s*0+[smhd]?\s*", raw):
        return 0.0
    try:
        return parse_duration(raw, what=key).total_seconds()
    except BadInput:
        raise ThresholdError(key, f"expected seconds or a duration such as 90s or 2m, got {raw!r}", where) from None


def _is_number_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _number(raw: Any, key: str, unit: Range, where: str) -> float:
    """``raw`` as a float within ``unit``'s range; numeric text is accepted (environment values)."""
    if isinstance(raw, str) and _is_number_text(raw):
        raw = float(raw)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ThresholdError(key, f"expected a number ({unit.describe()}), got {raw!r}", where)
    problem = unit.problem(float(raw))
    if problem:
        raise ThresholdError(key, problem, where)
    return float(raw)
