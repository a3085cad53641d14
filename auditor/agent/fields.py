"""What the agent exports: dcgm-exporter's classic names, DCGM field ids, NVML GPM metric ids, units.

Names are dcgm-exporter's classic ones (``DCGM_FI_PROF_SM_ACTIVE``, not the DCGM 4.6 ``*_RATIO``
spellings): they are what every dashboard, recording rule and the audit's first-choice query use,
and the audit matches both spellings anyway. Units are dcgm-exporter's: profiling fields are
ratios 0–1, ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_MEM_COPY_UTIL`` stay percents, power in W,
framebuffer in MiB, clocks in MHz, PCIe in bytes per second.

Each sampler returns values already in these units, keyed by :attr:`AgentField.name`:

- pydcgm reads fields by numeric id (stable across the 4.6 renaming) and DCGM already reports in
  the exporter's units.
- NVML GPM reports percents for every utilization metric (DCGM divides by 100, see
  reference/metrics.md §5) and MiB/s for PCIe; ``gpm_scale`` converts.
- Plain NVML gives GPU and memory-copy utilization (percent), power (mW → W), memory (bytes → MiB)
  and clocks, never profiling fields: those series are then absent, never zero.

The health fields (issue 33; :data:`HEALTH`) are codes, bitmasks and error counters: a scrape
serves the clock-event bits seen in any of its samples (``agg="or"``) and the latest Xid code and
counter values (``agg="last"``), never a mean (the mean of Xid 79 and 0 is no Xid). Xid,
uncorrectable remapped rows and the remap failure keep the deprecated names dcgm-exporter's
``default-counters.csv`` ships; field 112 is in no shipped CSV, so it has DCGM's current name
(``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``; the audit reads ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` too).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AgentField:
    """One exported series family.

    ``dcgm_id`` is the DCGM field id; ``gpm_id`` the ``NVML_GPM_METRIC_*`` value (``None`` when
    plain NVML, not GPM, supplies it); ``gpm_scale`` turns the GPM value into the exported unit.
    ``mig`` says whether the field exists per MIG instance (dcgm-exporter has no GPU_UTIL for MIG:
    a MIG instance gets only the fields marked here). ``profiling`` marks the fields that only
    DCGM profiling or GPM can give: with plain NVML they are absent. ``agg`` is how a scrape
    combines its window's samples: ``mean``, ``or`` (bitmasks) or ``last`` (codes, counters).
    """

    name: str
    help: str
    dcgm_id: int
    gpm_id: int | None = None
    gpm_scale: float = 0.01
    mig: bool = False
    profiling: bool = False
    agg: str = "mean"


#: the efficiency series (means over a scrape)
EFFICIENCY: tuple[AgentField, ...] = (
    AgentField("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 203),
    AgentField("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 204),
    AgentField("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 100),
    AgentField("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", 101),
    AgentField("DCGM_FI_DEV_MAX_SM_CLOCK", "Maximum supported SM clock (in MHz).", 113),
    AgentField("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 155),
    AgentField("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", 251, mig=True),
    AgentField("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 252, mig=True),
    AgentField(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        1001,
        gpm_id=1,
        mig=True,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_SM_ACTIVE",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        1002,
        gpm_id=2,
        mig=True,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "The ratio of number of warps resident on an SM.",
        1003,
        gpm_id=3,
        mig=True,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        1004,
        gpm_id=5,
        mig=True,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        1005,
        gpm_id=10,
        mig=True,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "Ratio of cycles the fp64 pipes are active.",
        1006,
        gpm_id=11,
        mig=True,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "Ratio of cycles the fp32 pipes are active.",
        1007,
        gpm_id=12,
        mig=True,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "Ratio of cycles the fp16 pipes are active.",
        1008,
        gpm_id=13,
        mig=True,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        1009,
        gpm_id=20,
        gpm_scale=1024.0 * 1024.0,
        profiling=True,
    ),
    AgentField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        1010,
        gpm_id=21,
        gpm_scale=1024.0 * 1024.0,
        profiling=True,
    ),
)

#: GPU health (issue 33): ids and meanings from DCGM's dcgm_fields.h (tests/fixtures/dcgm/dcgm_health_fields.txt)
HEALTH: tuple[AgentField, ...] = (
    AgentField(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Clock event reasons seen in the scrape interval (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        112,
        agg="or",
    ),
    AgentField("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", 230, agg="last"),
    AgentField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", 311, agg="last"),
    AgentField("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", 310, agg="last"),
    AgentField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", 393, agg="last"
    ),
    AgentField(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", 394, agg="last"
    ),
    AgentField("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", 395, agg="last"),
)
FIELDS: tuple[AgentField, ...] = EFFICIENCY + HEALTH

BY_NAME: dict[str, AgentField] = {f.name: f for f in FIELDS}
BY_DCGM_ID: dict[int, AgentField] = {f.dcgm_id: f for f in FIELDS}
GPM_FIELDS: tuple[AgentField, ...] = tuple(f for f in FIELDS if f.gpm_id is not None)
PROFILING: frozenset[str] = frozenset(f.name for f in FIELDS if f.profiling)
#: how a scrape combines samples, for the fields that are not means (codes, bitmasks, counters)
AGGREGATION: dict[str, str] = {f.name: f.agg for f in FIELDS if f.agg != "mean"}
