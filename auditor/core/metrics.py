"""The DCGM metrics gpu-auditor reads: their exporter names, units and valid ranges.

Everything downstream of a source works in one unit per metric: activities as ratios 0–1,
power in watts, framebuffer in MiB, clocks in MHz. Exporters name and scale the same quantity
differently, so every exporter name carries its own scale and the naming generation it belongs
to (:class:`Naming`); sources match all names and convert each by its own scale.

The names and units come from upstream (copies with their origin in ``tests/fixtures/dcgm/``):
DCGM's deprecation-alias table (4.6 renamed fields by keeping their ids: same values, new names),
go-dcgm's base-unit fields (DCGM 4.7: new field ids in hertz and bytes), and dcgm-exporter
4.9.0's release notes (default fields renamed to the DCGM 4.7 names, utilization as a 0–1 ratio,
clocks in hertz).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, NamedTuple, TypedDict


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
    PCIE_RX = "pcie_rx"
    PCIE_TX = "pcie_tx"

    def __str__(self) -> str:
        return self.value


class Naming(str, Enum):
    """Which generation of exporter names a Prometheus holds.

    ``classic``: dcgm-exporter up to 4.8 with its shipped CSVs (``DCGM_FI_PROF_SM_ACTIVE``,
    ``DCGM_FI_DEV_GPU_UTIL`` in percent). ``dcgm-4.6``: DCGM 4.6's renamed fields
    (``*_UTIL_RATIO``, ``DCGM_FI_DEV_BOARD_POWER_WATTS``) as a custom CSV selects them; they are
    aliases of the same field ids, so ``DCGM_FI_DEV_GPU_UTIL_RATIO`` is still field 203, an
    integer percent. ``exporter-4.9``: dcgm-exporter 4.9's defaults, DCGM 4.7 names, where
    utilization is a 0–1 ratio and clocks are in hertz. ``exporter-4.10``: 4.9's names with the
    PCIe rates renamed ``DCGM_FI_PROF_PCIE_{RX,TX}_BYTES_PER_SECOND`` (same unit, bytes/s).
    """

    CLASSIC = "classic"
    DCGM46 = "dcgm-4.6"
    EXPORTER49 = "exporter-4.9"
    EXPORTER410 = "exporter-4.10"

    def __str__(self) -> str:
        return self.value


_ALL = frozenset(Naming)
#: dcgm-exporter 4.9 and later (DCGM 4.7 names and base units); 4.10 renamed only the PCIe rates
_EXPORTER = frozenset({Naming.EXPORTER49, Naming.EXPORTER410})
_RENAMED = frozenset({Naming.DCGM46}) | _EXPORTER
_BEFORE_410 = _ALL - {Naming.EXPORTER410}


@dataclass(frozen=True, slots=True)
class ExportedName:
    """One exporter name of a metric: ``raw × scale`` is the value in the project's unit.

    ``namings`` are the generations that export this name with this scale; a name spelled
    alike in two generations with different units has one entry per unit.
    """

    name: str
    metric: Metric
    scale: float
    unit: str
    namings: frozenset[Naming]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """How one metric is exported and what a sane value looks like.

    ``names`` lists every exporter name, classic first, then the DCGM 4.6 name, then a DCGM 4.7
    base-unit name (see :data:`EXPORTED`, which carries each name's own scale); ``scale`` is
    the classic name's. Values outside ``[low, high]`` after scaling are garbage (e.g. GPU_UTIL
    4294967295): sources drop and count them, never average them. ``clamp_above`` tolerates
    small overshoots that are known bugs (SM_ACTIVE slightly above 1 on MIG, DCGM #152) by
    clamping them to ``high`` instead of dropping them.
    """

    metric: Metric
    names: tuple[str, ...]
    unit: str
    scale: float = 1.0
    low: float = 0.0
    high: float = 1.0
    clamp_above: float | None = None
    is_ratio: bool = True


def _e(name: str, metric: Metric, scale: float, unit: str, namings: frozenset[Naming]) -> ExportedName:
    return ExportedName(name, metric, scale, unit, namings)


#: every exporter name the audit reads, with its unit and scale (upstream origin of each name:
#: tests/fixtures/dcgm/README.md)
EXPORTED: tuple[ExportedName, ...] = (
    _e("DCGM_FI_DEV_GPU_UTIL", Metric.GPU_UTIL, 0.01, "%", _ALL),
    # field 203 under its DCGM 4.6 name: still an integer percent ...
    _e("DCGM_FI_DEV_GPU_UTIL_RATIO", Metric.GPU_UTIL, 0.01, "%", frozenset({Naming.DCGM46})),
    # ... and the same name as dcgm-exporter 4.9 serves it: a ratio 0–1
    _e("DCGM_FI_DEV_GPU_UTIL_RATIO", Metric.GPU_UTIL, 1.0, "ratio", _EXPORTER),
    _e("DCGM_FI_PROF_GR_ENGINE_ACTIVE", Metric.GR_ENGINE_ACTIVE, 1.0, "ratio", _ALL),
    _e("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", Metric.GR_ENGINE_ACTIVE, 1.0, "ratio", _RENAMED),
    _e("DCGM_FI_PROF_SM_ACTIVE", Metric.SM_ACTIVE, 1.0, "ratio", _ALL),
    _e("DCGM_FI_PROF_SM_UTIL_RATIO", Metric.SM_ACTIVE, 1.0, "ratio", _RENAMED),
    _e("DCGM_FI_PROF_SM_OCCUPANCY", Metric.SM_OCCUPANCY, 1.0, "ratio", _ALL),
    _e("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", Metric.SM_OCCUPANCY, 1.0, "ratio", _RENAMED),
    _e("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", Metric.TENSOR_ACTIVE, 1.0, "ratio", _ALL),
    _e("DCGM_FI_PROF_TENSOR_UTIL_RATIO", Metric.TENSOR_ACTIVE, 1.0, "ratio", _RENAMED),
    _e("DCGM_FI_PROF_PIPE_FP32_ACTIVE", Metric.FP32_ACTIVE, 1.0, "ratio", _ALL),
    _e("DCGM_FI_PROF_FP32_UTIL_RATIO", Metric.FP32_ACTIVE, 1.0, "ratio", _RENAMED),
    _e("DCGM_FI_PROF_PIPE_FP16_ACTIVE", Metric.FP16_ACTIVE, 1.0, "ratio", _ALL),
    _e("DCGM_FI_PROF_FP16_UTIL_RATIO", Metric.FP16_ACTIVE, 1.0, "ratio", _RENAMED),
    _e("DCGM_FI_PROF_DRAM_ACTIVE", Metric.DRAM_ACTIVE, 1.0, "ratio", _ALL),
    _e("DCGM_FI_PROF_DRAM_UTIL_RATIO", Metric.DRAM_ACTIVE, 1.0, "ratio", _RENAMED),
    # field 252 kept its name in 4.6; dcgm-exporter 4.9 exports GPU memory in bytes under a
    # name no stored upstream file spells out, so it is not read under that naming
    _e("DCGM_FI_DEV_FB_USED", Metric.FB_USED, 1.0, "MiB", _ALL),
    _e("DCGM_FI_DEV_POWER_USAGE", Metric.POWER, 1.0, "W", _ALL),
    _e("DCGM_FI_DEV_BOARD_POWER_WATTS", Metric.POWER, 1.0, "W", _RENAMED),
    # fields 100 and 113 (MHz) kept their names; DCGM 4.7 adds new field ids in hertz
    _e("DCGM_FI_DEV_SM_CLOCK", Metric.SM_CLOCK, 1.0, "MHz", _ALL),
    _e("DCGM_FI_DEV_SM_CLOCK_HERTZ", Metric.SM_CLOCK, 1e-6, "Hz", _EXPORTER),
    _e("DCGM_FI_DEV_MAX_SM_CLOCK", Metric.MAX_SM_CLOCK, 1.0, "MHz", _ALL),
    _e("DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ", Metric.MAX_SM_CLOCK, 1e-6, "Hz", _EXPORTER),
    # fields 1009/1010: a rate in bytes per second (dcgm-exporter's help text), headers included
    _e("DCGM_FI_PROF_PCIE_RX_BYTES", Metric.PCIE_RX, 1.0, "B/s", _BEFORE_410),
    _e("DCGM_FI_PROF_PCIE_TX_BYTES", Metric.PCIE_TX, 1.0, "B/s", _BEFORE_410),
    # dcgm-exporter 4.10 renames them, same unit (origin: tests/fixtures/dcgm/README.md; no stored
    # upstream file spells these names yet)
    _e("DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND", Metric.PCIE_RX, 1.0, "B/s", frozenset({Naming.EXPORTER410})),
    _e("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", Metric.PCIE_TX, 1.0, "B/s", frozenset({Naming.EXPORTER410})),
)


def _only(namings: frozenset[Naming]) -> frozenset[str]:
    return frozenset(e.name for e in EXPORTED if e.namings == namings and sum(x.name == e.name for x in EXPORTED) == 1)


#: names only dcgm-exporter 4.9 and later (DCGM 4.7 base units) export: one present settles 4.9+
EXPORTER49_ONLY: frozenset[str] = _only(_EXPORTER)
#: names only dcgm-exporter 4.10 exports (the renamed PCIe rates): one present settles 4.10
EXPORTER410_ONLY: frozenset[str] = _only(frozenset({Naming.EXPORTER410}))
#: the one name whose unit depends on the generation (percent under 4.6, ratio under 4.9)
UTIL_RATIO = "DCGM_FI_DEV_GPU_UTIL_RATIO"


def _names(metric: Metric) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.name for e in EXPORTED if e.metric is metric))


class _Limits(TypedDict, total=False):
    """The MetricSpec arguments of a metric that is not a 0..1 ratio."""

    high: float
    is_ratio: bool


_LIMITS: dict[Metric, _Limits] = {
    Metric.FB_USED: {"high": 16_777_216.0, "is_ratio": False},
    Metric.POWER: {"high": 5_000.0, "is_ratio": False},
    Metric.SM_CLOCK: {"high": 10_000.0, "is_ratio": False},
    Metric.MAX_SM_CLOCK: {"high": 10_000.0, "is_ratio": False},
    # far above any link (PCIe 6 x16 moves ~128 GB/s each way): beyond it a value is garbage
    Metric.PCIE_RX: {"high": 1e12, "is_ratio": False},
    Metric.PCIE_TX: {"high": 1e12, "is_ratio": False},
}
_UNITS = {
    Metric.FB_USED: "MiB",
    Metric.POWER: "W",
    Metric.SM_CLOCK: "MHz",
    Metric.MAX_SM_CLOCK: "MHz",
    Metric.PCIE_RX: "B/s",
    Metric.PCIE_TX: "B/s",
}
_NO_CLAMP = {
    Metric.GPU_UTIL,
    Metric.FB_USED,
    Metric.POWER,
    Metric.SM_CLOCK,
    Metric.MAX_SM_CLOCK,
    Metric.PCIE_RX,
    Metric.PCIE_TX,
}

SPECS: dict[Metric, MetricSpec] = {
    m: MetricSpec(
        m,
        _names(m),
        _UNITS.get(m, "ratio"),
        scale=next(e.scale for e in EXPORTED if e.metric is m),
        clamp_above=None if m in _NO_CLAMP else 1.05,
        **_LIMITS.get(m, _Limits()),
    )
    for m in Metric
}

#: exporter name → metric, for every known name
BY_NAME: dict[str, Metric] = {e.name: e.metric for e in EXPORTED}


def scale_of(name: str, naming: Naming = Naming.CLASSIC) -> float:
    """The factor that turns ``name``'s exported value into the project's unit under ``naming``.

    Only :data:`UTIL_RATIO` differs between generations; every other name has one scale.
    """
    entries = [e for e in EXPORTED if e.name == name]
    if not entries:
        raise KeyError(name)
    for e in entries:
        if naming in e.namings:
            return e.scale
    return entries[0].scale


def name_for(metric: Metric, naming: Naming) -> str:
    """The name ``naming``'s exporter gives ``metric`` (the newest spelling it exports)."""
    names = [e.name for e in EXPORTED if e.metric is metric and naming in e.namings]
    return names[-1]


class NamingGuess(NamedTuple):
    """:func:`detect_naming`'s answer: the naming, why (for reports and ``doctor``), and whether
    :data:`UTIL_RATIO`'s unit stayed unknown (then its series must not be read at all)."""

    naming: Naming
    why: str
    util_unknown: bool = False


def detect_naming(names: Iterable[str], util_ratio_values: Iterable[float] = ()) -> NamingGuess:
    """The naming generation of a set of exporter names, and why.

    A renamed PCIe rate (``*_BYTES_PER_SECOND``) means dcgm-exporter 4.10; a DCGM 4.7 base-unit
    name (``*_HERTZ``) without one means 4.9 (a 4.10 without the PCIe rates in its CSV reads
    alike: the two differ in no other name the audit reads). Without either, the unit of
    ``DCGM_FI_DEV_GPU_UTIL_RATIO`` decides between DCGM 4.6 (field 203: integers 0–100) and
    4.9 (a ratio): ``util_ratio_values`` are samples of that name (bucket minima and maxima
    will do); one in (1, 100] is a percent, one that is not a whole number is a ratio (field 203
    is an integer), anything above 100 is garbage either way. Values that are all 0 or 1 cannot
    tell (a GPU at 0–1 % or one at 0 or 100 %): no unit is guessed, since either guess turns a
    busy GPU idle or an idle one busy; ``util_unknown`` says so.
    """
    present = set(names)
    marker = sorted(present & EXPORTER410_ONLY)
    if marker:
        return NamingGuess(Naming.EXPORTER410, f"dcgm-exporter 4.10 names ({', '.join(marker)})")
    marker = sorted(present & EXPORTER49_ONLY)
    if marker:
        return NamingGuess(Naming.EXPORTER49, f"dcgm-exporter 4.9 names ({', '.join(marker)})")
    renamed = sorted(n for n in present if not any(e.name == n and Naming.CLASSIC in e.namings for e in EXPORTED))
    if not renamed:
        return NamingGuess(Naming.CLASSIC, "classic names, as dcgm-exporter up to 4.8 ships them")
    if UTIL_RATIO in present:
        values = [v for v in util_ratio_values if v == v and v not in (float("inf"), float("-inf"))]
        if any(1.0 < v <= 100.0 for v in values):
            return NamingGuess(Naming.DCGM46, f"DCGM 4.6 names; {UTIL_RATIO} reads above 1, so a percent")
        if any(v != int(v) for v in values if v <= 100.0):
            return NamingGuess(
                Naming.EXPORTER49, f"dcgm-exporter 4.9 names; {UTIL_RATIO} has fractional values, so a 0–1 ratio"
            )
        return NamingGuess(
            Naming.DCGM46,
            f"DCGM 4.6 or dcgm-exporter 4.9 names; {UTIL_RATIO} only reads 0 or 1, which cannot tell a percent "
            "(DCGM 4.6) from a ratio (4.9): GPU utilization is left unread (GR_ENGINE_ACTIVE serves); with "
            "dcgm-exporter 4.9 keep DCGM_FI_DEV_SM_CLOCK_HERTZ in the counters CSV",
            util_unknown=True,
        )
    return NamingGuess(Naming.DCGM46, f"DCGM 4.6 names ({', '.join(renamed)})")


def normalize(metric: Metric, raw: float, scale: float | None = None) -> float | None:
    """Return ``raw`` in the project's unit, or ``None`` when it is garbage.

    Garbage is NaN, ±Inf, or a value outside the metric's valid range after scaling (small
    known overshoots are clamped, see :class:`MetricSpec`). ``scale`` is the exporter name's
    (:func:`scale_of`); without it, the classic name's.
    """
    spec = SPECS[metric]
    if raw != raw or raw in (float("inf"), float("-inf")):
        return None
    value = raw * (spec.scale if scale is None else scale)
    if value < spec.low:
        return None
    if value > spec.high:
        if spec.clamp_above is not None and value <= spec.clamp_above:
            return spec.high
        return None
    return value


class HealthField(str, Enum):
    """A GPU health quantity (issue 33): what says the GPU, not the job, is at fault.

    Kept apart from :class:`Metric`: these are codes, bitmasks and error counters, never
    averaged into rollup buckets, so they have no ratio range and no place in a verdict's means.
    """

    XID = "xid"
    CLOCK_EVENTS = "clock_events"
    ECC_DBE_VOLATILE = "ecc_dbe_volatile"
    ECC_SBE_VOLATILE = "ecc_sbe_volatile"
    REMAP_UNCORRECTABLE = "remap_uncorrectable"
    REMAP_FAILED = "remap_failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class HealthName:
    """One exporter name of a health field.

    ``current`` marks DCGM's own name (the header's ``#define <name> <id>``); the others are its
    deprecated aliases, which dcgm-exporter's shipped CSVs still spell. ``by_default`` says
    dcgm-exporter's ``default-counters.csv`` exports it uncommented: a cluster on the default
    counters has only those.
    """

    name: str
    field: HealthField
    dcgm_id: int
    current: bool
    by_default: bool = False


#: every exporter name of the health fields (origin: tests/fixtures/dcgm/dcgm_health_fields.txt,
#: DCGM 4.6.0's dcgm_fields.h and dcgm-exporter's default-counters.csv)
HEALTH_EXPORTED: tuple[HealthName, ...] = (
    # the last Xid seen on the GPU, a gauge holding the code (not a count)
    HealthName("DCGM_FI_DEV_XID_ERRORS", HealthField.XID, 230, current=False, by_default=True),
    HealthName("DCGM_FI_DEV_XID_ERROR", HealthField.XID, 230, current=True),
    # bitmask of DCGM_CLOCKS_EVENT_REASON_* (1:1 NVML's nvmlClocksEventReason*); in no shipped CSV
    HealthName("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", HealthField.CLOCK_EVENTS, 112, current=True),
    HealthName("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", HealthField.CLOCK_EVENTS, 112, current=False),
    # volatile ECC totals (since the last driver load); commented out in the default CSV
    HealthName("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", HealthField.ECC_DBE_VOLATILE, 311, current=True),
    HealthName("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", HealthField.ECC_SBE_VOLATILE, 310, current=True),
    HealthName(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", HealthField.REMAP_UNCORRECTABLE, 393, current=False, by_default=True
    ),
    HealthName("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", HealthField.REMAP_UNCORRECTABLE, 393, current=True),
    HealthName("DCGM_FI_DEV_ROW_REMAP_FAILURE", HealthField.REMAP_FAILED, 395, current=False, by_default=True),
    HealthName("DCGM_FI_DEV_ROW_REMAP_FAILED", HealthField.REMAP_FAILED, 395, current=True),
)

#: exporter name → health field, for every known health name
HEALTH_BY_NAME: dict[str, HealthField] = {h.name: h.field for h in HEALTH_EXPORTED}
