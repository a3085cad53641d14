"""Every number the verdicts depend on, in one documented, configurable place.

``docs/verdicts.md`` explains each threshold and how the shipped H200 traces land against it.
The defaults are starting points chosen from those measurements and DCGM's own guidance
(SM activity ≥ 0.8 "necessary but not sufficient", < 0.5 "likely ineffective"); operators tune
them through :meth:`Thresholds.from_mapping` (settings file, ``GPU_AUDITOR_*``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any, Mapping

from auditor.errors import BadInput

#: Per GPU model: the power (W) above which a GPU is clearly doing work. Used by the silent-zero
#: guard only (profiling fields reading exactly 0 on a GPU drawing this much are suspect
#: telemetry). Roughly twice the idle draw: an idle H200 draws ~120 W, four spinning thread
#: blocks 124 W, real work 400–700 W (../shared/traces). Matched by substring of ``modelName``,
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
}


def match_model(table: Mapping[str, float], model: str) -> float | None:
    """The value of the longest key of ``table`` contained in ``model`` (None when none is)."""
    best: tuple[int, float] | None = None
    for key, value in table.items():
        if key and key in model and (best is None or len(key) > best[0]):
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
    #: tensor-pipe activity below this → the tensor cores are idle
    tensor_idle: float = 0.05
    #: FP32/FP16-pipe activity below this → no CUDA-core pipe is doing math either
    math_pipe_idle: float = 0.05
    #: DRAM activity at or above this (with idle tensor pipes) → memory_bound; without the FP32
    #: pipe series this alone separates memory_bound from no_tensor_cores
    dram_busy: float = 0.3
    #: a healthy job whose tensor activity is below this gets an informational finding
    tensor_headroom: float = 0.3
    #: straggler: a GPU at least this much less busy than the job's waiting GPUs
    imbalance_util_gap: float = 0.3
    #: spread of SM activity across one job's GPUs at or above this → gpu_imbalance
    imbalance_sm_gap: float = 0.3
    #: share of a job's GPU time on GPUs shared with other pods above which it is not judged
    max_shared_fraction: float = 0.5
    power_floor_w: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_POWER_FLOOR_W))
    max_sm_clock_mhz: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MAX_SM_CLOCK_MHZ))

    def power_floor(self, model: str) -> float | None:
        return match_model(self.power_floor_w, model)

    def max_clock(self, model: str) -> float | None:
        return match_model(self.max_sm_clock_mhz, model)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, *, where: str = "thresholds") -> "Thresholds":
        """Defaults overridden by ``values`` (e.g. a settings file section); unknown keys and
        out-of-range numbers are :class:`BadInput` naming the key."""
        base = cls()
        if not values:
            return base
        known = {f.name: f for f in fields(cls)}
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in known:
                raise BadInput(f"{where}: unknown threshold {key!r} (known: {', '.join(sorted(known))})")
            if key in ("power_floor_w", "max_sm_clock_mhz"):
                if not isinstance(raw, Mapping):
                    raise BadInput(f"{where}.{key}: expected a mapping of GPU model → number")
                merged = dict(getattr(base, key))
                for model, v in raw.items():
                    merged[str(model)] = _number(v, f"{where}.{key}.{model}", low=0.0, high=None)
                changes[key] = merged
            elif key == "min_span":
                changes[key] = timedelta(seconds=_number(raw, f"{where}.{key} (seconds)", low=0.0, high=None))
            elif key == "min_samples":
                changes[key] = int(_number(raw, f"{where}.{key}", low=0.0, high=None))
            else:
                changes[key] = _number(raw, f"{where}.{key}", low=0.0, high=1.0)
        return replace(base, **changes)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (for ``explain`` and the audit-run record)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.total_seconds() if isinstance(v, timedelta) else (dict(v) if isinstance(v, Mapping) else v)
        return out


def _number(raw: Any, where: str, *, low: float | None, high: float | None) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise BadInput(f"{where}: expected a number, got {raw!r}")
    v = float(raw)
    if v != v or (low is not None and v < low) or (high is not None and v > high):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise BadInput(f"{where}: {raw!r} is out of range {rng}")
    return v
