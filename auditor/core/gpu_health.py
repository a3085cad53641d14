"""GPU health beside efficiency (issue 33, part 3): a sick GPU is not a bad job.

A job on a GPU that raises hardware Xid errors, loses memory rows or is clocked down by its own
hardware protection runs slowly through no fault of its owner; without this evaluation it gets an
efficiency verdict and the owner the alert. This module reads a window of one GPU's health
samples (DCGM fields 230, 112, 311, 393, 395; names in :data:`auditor.core.metrics.HEALTH_EXPORTED`)
and says whether the GPU was sick, why, and with what evidence, so the verdict can say "slowed
by the GPU, not the job" and the admin can be told which node and GPU to drain.

What counts as sickness, and why:

- **xid**: a hardware Xid (:data:`HARDWARE_XIDS`, from NVIDIA's Xid catalog). Xids that a
  program's own bug raises (13, 31, 43, 45: exceptions, page faults, a stopped channel) do not
  exonerate the job; they are kept as evidence. The exporter's field is a gauge holding the last
  Xid, so a code already present at the window's first sample happened before or during the
  window (``held_from_before_window``): the GPU has not been reset since, so it still counts.
- **ecc**: the volatile double-bit ECC total rises within the window.
- **row_remap**: uncorrectable remapped rows rise within the window, or row remapping has failed
  (a permanent state: the GPU needs service).
- **hw_slowdown** / **thermal**: the clock-event bitmask carries HW slowdown or HW power brake
  (``hw_slowdown``), SW or HW thermal slowdown (``thermal``) in at least
  :attr:`HealthThresholds.min_slowdown_share` of its samples and at least
  :attr:`HealthThresholds.min_slowdown_samples` of them: DCGM's header says HW slowdown "may be
  also reported during PState or clock change", so one blip is no sickness.

``SW_POWER_CAP`` alone is never sickness: recorded on an H200 under a bf16 matmul, every second
reads ``0x4`` at 1500 of 1980 MHz (auditor/data/README.md, ``h200-hang``); that is how a busy GPU
runs under its default power limit. Its share is reported as context only.

Pure: no I/O, no clock; timestamps come in with the samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import IntFlag

from auditor.core.metrics import HEALTH_BY_NAME, HealthField
from auditor.core.model import Finding
from auditor.core.rfc3339 import format_rfc3339

#: what a gpu_health finding's verdict says about the job
SLOWED_BY_GPU = "slowed by the GPU, not the job"


class ClockEvent(IntFlag):
    """DCGM_CLOCKS_EVENT_REASON_* bits (1:1 NVML's nvmlClocksEventReason*; DCGM 4.6 dcgm_fields.h)."""

    GPU_IDLE = 0x1
    CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL = 0x20
    HW_THERMAL = 0x40
    HW_POWER_BRAKE = 0x80
    DISPLAY_CLOCKS = 0x100


#: the bits that are the hardware's protection, by the health reason they raise
SICK_BITS: dict[str, ClockEvent] = {
    "hw_slowdown": ClockEvent.HW_SLOWDOWN | ClockEvent.HW_POWER_BRAKE,
    "thermal": ClockEvent.SW_THERMAL | ClockEvent.HW_THERMAL,
}

#: Xids NVIDIA's catalog attributes to the GPU, its memory or its links (not to the program)
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    63: "row remapping / page retirement recorded",
    64: "row remapping / page retirement failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

#: Xids a program's own fault usually raises: evidence, never an exoneration
APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after earlier errors",
}

#: the order reasons are listed in (the first is the finding's ``reason``)
REASONS: tuple[str, ...] = ("xid", "ecc", "row_remap", "hw_slowdown", "thermal")


@dataclass(frozen=True, slots=True)
class HealthSample:
    """One scrape of one GPU's health fields; ``None`` where the field was not exported."""

    t: datetime
    xid: int | None = None
    clock_events: int | None = None
    ecc_dbe: float | None = None
    remap_uncorrectable: float | None = None
    remap_failed: float | None = None


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """How much HW slowdown or thermal clocking makes a GPU sick (see the module docstring)."""

    min_slowdown_share: float = 0.05
    min_slowdown_samples: int = 2


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's health over a window: ``reasons`` (in :data:`REASONS` order) empty when healthy."""

    gpu: str
    reasons: tuple[str, ...]
    evidence: dict[str, object]

    @property
    def healthy(self) -> bool:
        return not self.reasons

    def finding(self) -> Finding | None:
        """The ``gpu_health`` finding of a sick GPU (``None`` when healthy)."""
        if self.healthy:
            return None
        return Finding(
            "gpu_health",
            f"GPU {self.gpu} is unhealthy ({'; '.join(_describe(r, self.evidence) for r in self.reasons)}): "
            f"the job was {SLOWED_BY_GPU}. Drain the GPU and run the job elsewhere; the admin is told.",
            {
                "reason": self.reasons[0],
                "reasons": list(self.reasons),
                "gpu": self.gpu,
                "slowed_by_gpu": True,
                **self.evidence,
            },
        )


_SAMPLE_FIELD = {
    HealthField.XID: "xid",
    HealthField.CLOCK_EVENTS: "clock_events",
    HealthField.ECC_DBE_VOLATILE: "ecc_dbe",
    HealthField.REMAP_UNCORRECTABLE: "remap_uncorrectable",
    HealthField.REMAP_FAILED: "remap_failed",
}


def samples_from_series(series: Mapping[str, Sequence[tuple[datetime, float]]]) -> list[HealthSample]:
    """One GPU's samples from its exported series, keyed by exporter name (either spelling of
    :data:`~auditor.core.metrics.HEALTH_EXPORTED`; other names are ignored), one per timestamp.

    Codes and bitmasks are integers on the wire; they are read as such.
    """
    rows: dict[datetime, dict[str, float]] = {}
    for name, points in series.items():
        health_field = HEALTH_BY_NAME.get(name)
        field = None if health_field is None else _SAMPLE_FIELD.get(health_field)
        if field is None:
            continue
        for t, v in points:
            if v == v:  # NaN: a stale marker or a broken read, no evidence
                rows.setdefault(t, {})[field] = v
    out = []
    for t in sorted(rows):
        r = rows[t]
        out.append(
            HealthSample(
                t,
                xid=None if "xid" not in r else int(r["xid"]),
                clock_events=None if "clock_events" not in r else int(r["clock_events"]),
                ecc_dbe=r.get("ecc_dbe"),
                remap_uncorrectable=r.get("remap_uncorrectable"),
                remap_failed=r.get("remap_failed"),
            )
        )
    return out


def _increase(values: Sequence[float]) -> float:
    """The rise of a counter over the window; a drop (a driver reload resets volatile totals)
    starts it again, so only rises are summed."""
    return sum(max(0.0, b - a) for a, b in zip(values, values[1:]))


def _xid(samples: Sequence[HealthSample]) -> dict[str, object] | None:
    seen: dict[int, datetime] = {}
    for s in samples:
        if s.xid:
            seen.setdefault(int(s.xid), s.t)
    if not seen:
        return None
    codes = sorted(seen)
    return {
        "codes": codes,
        "hardware": [c for c in codes if c in HARDWARE_XIDS],
        "application": [c for c in codes if c in APPLICATION_XIDS],
        "unclassified": [c for c in codes if c not in HARDWARE_XIDS and c not in APPLICATION_XIDS],
        "first_seen": {str(c): format_rfc3339(seen[c]) for c in codes},
        "held_from_before_window": bool(samples[0].xid),
    }


def _clock_shares(samples: Sequence[HealthSample]) -> tuple[int, dict[str, float], dict[str, int]]:
    """Samples with a bitmask, each bit's share of them, and each sick reason's count."""
    masks = [int(s.clock_events) for s in samples if s.clock_events is not None]
    if not masks:
        return 0, {}, {}
    shares = {
        bit.name.lower(): round(sum(bool(m & bit) for m in masks) / len(masks), 4)
        for bit in ClockEvent
        if bit.name and any(m & bit for m in masks)
    }
    sick = {reason: sum(bool(m & bits) for m in masks) for reason, bits in SICK_BITS.items()}
    return len(masks), shares, sick


def evaluate_gpu(gpu: str, samples: Sequence[HealthSample], th: HealthThresholds | None = None) -> GpuHealth:
    """One GPU's health over the window ``samples`` (in time order) cover."""
    th = th or HealthThresholds()
    reasons: set[str] = set()
    evidence: dict[str, object] = {"samples": len(samples)}
    if not samples:
        return GpuHealth(gpu, (), evidence)
    if (xid := _xid(samples)) is not None:
        evidence["xid"] = xid
        if xid["hardware"]:
            reasons.add("xid")
    dbe = [s.ecc_dbe for s in samples if s.ecc_dbe is not None]
    if dbe:
        new_dbe = _increase(dbe)
        evidence["ecc_dbe"] = {"first": dbe[0], "last": dbe[-1], "new": new_dbe}
        if new_dbe > 0:
            reasons.add("ecc")
    rows = [s.remap_uncorrectable for s in samples if s.remap_uncorrectable is not None]
    failed = [s.remap_failed for s in samples if s.remap_failed is not None]
    if rows or failed:
        new_rows = _increase(rows)
        remap_failed = any(f > 0 for f in failed)
        evidence["row_remap"] = {
            "uncorrectable_new": new_rows,
            "uncorrectable_last": rows[-1] if rows else None,
            "failed": remap_failed,
        }
        if new_rows > 0 or remap_failed:
            reasons.add("row_remap")
    n, shares, sick = _clock_shares(samples)
    if n:
        evidence["clock_events"] = {
            "samples": n,
            "share": shares,
            **{f"{reason}_share": round(count / n, 4) for reason, count in sick.items()},
        }
        # context only: the normal state of a busy GPU under its power limit
        evidence["sw_power_cap_share"] = shares.get("sw_power_cap", 0.0)
        for reason, count in sick.items():
            if count >= th.min_slowdown_samples and count / n >= th.min_slowdown_share:
                reasons.add(reason)
    return GpuHealth(gpu, tuple(r for r in REASONS if r in reasons), evidence)


def job_health(per_gpu: Mapping[str, Sequence[HealthSample]], th: HealthThresholds | None = None) -> list[Finding]:
    """One ``gpu_health`` finding per sick GPU of a job (none when all are healthy)."""
    out = []
    for gpu in sorted(per_gpu):
        f = evaluate_gpu(gpu, per_gpu[gpu], th).finding()
        if f is not None:
            out.append(f)
    return out


def _describe(reason: str, ev: Mapping[str, object]) -> str:
    if reason == "xid":
        xid = ev["xid"]
        assert isinstance(xid, dict)
        return "Xid " + ", ".join(f"{c} ({HARDWARE_XIDS[c]})" for c in xid["hardware"])
    if reason == "ecc":
        dbe = ev["ecc_dbe"]
        assert isinstance(dbe, dict)
        return f"{dbe['new']:g} new double-bit ECC errors"
    if reason == "row_remap":
        rr = ev["row_remap"]
        assert isinstance(rr, dict)
        return (
            "row remapping failed"
            if rr["failed"]
            else f"{rr['uncorrectable_new']:g} rows remapped for uncorrectable errors"
        )
    ce = ev["clock_events"]
    assert isinstance(ce, dict)
    label = "HW slowdown / power brake" if reason == "hw_slowdown" else "thermal slowdown"
    return f"{label} in {ce[f'{reason}_share']:.0%} of {ce['samples']} clock-event samples"
