"""Recorded GPU traces → dcgm-exporter-format series (OpenMetrics text or raw samples).

The traces in ``auditor/data`` (and ``../shared/traces``) were recorded at 1 Hz on one H200: one
row per second, a ``phase`` column naming the workload, every activity as a percent. This module

- reads that CSV (both the microbench and the demo-cluster column sets; unknown columns are
  ignored, absent ones give absent series — never zeros),
- converts each value to the unit dcgm-exporter exports: profiling fields become ratios 0–1,
  ``DCGM_FI_DEV_GPU_UTIL`` stays a percent, power in W, framebuffer in MiB, clock in MHz,
- takes each phase's *steady state* (its samples from the second on: the first straddles the
  phase change) and repeats it in order to fill any duration at any scrape interval,
- places the series so that they end at a chosen ``end`` (so a backfill stays inside
  Prometheus's retention), for given pods and GPUs, in either label convention
  (``pod``/``namespace``/``container`` or ``exported_*`` as Prometheus writes them with
  ``honorLabels: false``) and either hostname spelling (``Hostname`` before dcgm-exporter 4.8.2,
  ``hostname`` after),
- renders OpenMetrics for ``promtool tsdb create-blocks-from openmetrics`` (gauges, families not
  interleaved, ``# EOF`` at the end), or yields :class:`auditor.core.rollup.Sample` values for the
  replay source — one generator feeds both, so the two paths cannot disagree.

MIG instances get no GPU_UTIL series (dcgm-exporter has none for MIG) but do get
``GPU_I_ID``/``GPU_I_PROFILE`` labels.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from auditor.core.metrics import SPECS, Metric, Naming, name_for, scale_of
from auditor.core.model import GpuId, PodRef
from auditor.core.rollup import Sample
from auditor.errors import BadInput

#: trace CSV column → (metric, factor from the CSV's unit to the exporter's unit)
COLUMNS: dict[str, tuple[Metric, float]] = {
    "gpu_util_pct": (Metric.GPU_UTIL, 1.0),  # stays a percent, as DCGM_FI_DEV_GPU_UTIL
    "sm_active_pct": (Metric.SM_ACTIVE, 0.01),
    "sm_occupancy_pct": (Metric.SM_OCCUPANCY, 0.01),
    "tensor_active_pct": (Metric.TENSOR_ACTIVE, 0.01),
    "dram_active_pct": (Metric.DRAM_ACTIVE, 0.01),
    "fp32_active_pct": (Metric.FP32_ACTIVE, 0.01),
    "fp16_active_pct": (Metric.FP16_ACTIVE, 0.01),
    "gr_engine_active_pct": (Metric.GR_ENGINE_ACTIVE, 0.01),
    "power_w": (Metric.POWER, 1.0),
    "fb_used_mib": (Metric.FB_USED, 1.0),
    "sm_clock_mhz": (Metric.SM_CLOCK, 1.0),
    "max_sm_clock_mhz": (Metric.MAX_SM_CLOCK, 1.0),
    "pcie_rx_bytes": (Metric.PCIE_RX, 1.0),  # bytes per second, as DCGM_FI_PROF_PCIE_RX_BYTES
    "pcie_tx_bytes": (Metric.PCIE_TX, 1.0),
}

#: the traces shipped with the package (``auditor/data/<name>.csv``)
BUNDLED = ("h200-demo-cluster", "h200-microbench", "h200-workloads", "h200-mfu-workloads")

#: phases that are not workloads (transitions between recorded phases)
NOT_WORKLOADS = frozenset({"gap", "warmup"})

_HELP = {
    Metric.GPU_UTIL: "GPU utilization (in %).",
    Metric.GR_ENGINE_ACTIVE: "Ratio of time the graphics engine is active.",
    Metric.SM_ACTIVE: "The ratio of cycles an SM has at least 1 warp assigned.",
    Metric.SM_OCCUPANCY: "The ratio of number of warps resident on an SM.",
    Metric.TENSOR_ACTIVE: "Ratio of cycles the tensor (HMMA) pipe is active.",
    Metric.FP32_ACTIVE: "Ratio of cycles the fp32 pipes are active.",
    Metric.FP16_ACTIVE: "Ratio of cycles the fp16 pipes are active.",
    Metric.DRAM_ACTIVE: "Ratio of cycles the device memory interface is active sending or receiving data.",
    Metric.FB_USED: "Framebuffer memory used (in MiB).",
    Metric.POWER: "Power draw (in W).",
    Metric.SM_CLOCK: "SM clock frequency (in MHz).",
    Metric.MAX_SM_CLOCK: "Maximum supported SM clock (in MHz).",
    Metric.PCIE_RX: "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    Metric.PCIE_TX: "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
}


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One recorded second: values already in the exporter's unit, absent columns absent."""

    t: float
    phase: str
    values: dict[Metric, float]


@dataclass(slots=True)
class Trace:
    """A recorded trace: rows in time order, plus the GPU model it was recorded on."""

    name: str
    rows: list[TraceRow]
    gpu_model: str = "NVIDIA H200"

    @property
    def metrics(self) -> set[Metric]:
        """Metrics the trace recorded (columns present)."""
        out: set[Metric] = set()
        for r in self.rows:
            out.update(r.values)
        return out

    def phases(self, *, workloads_only: bool = True) -> list[str]:
        """Phase names in recording order (without ``gap``/``warmup`` unless asked)."""
        seen: list[str] = []
        for r in self.rows:
            if r.phase not in seen and (not workloads_only or r.phase not in NOT_WORKLOADS):
                seen.append(r.phase)
        return seen

    def steady(self, phase: str) -> list[TraceRow]:
        """The steady state of ``phase``: its first contiguous run of rows, from the second on.

        The first row of a phase straddles the phase change (the README of the traces says so);
        a phase with a single row has no steady state and is refused.
        """
        run: list[TraceRow] = []
        for r in self.rows:
            if r.phase == phase:
                run.append(r)
            elif run:
                break
        if not run:
            raise BadInput(f"trace {self.name}: no phase {phase!r} (phases: {', '.join(self.phases())})")
        if len(run) < 2:
            raise BadInput(f"trace {self.name}: phase {phase!r} has one sample, no steady state")
        return run[1:]

    def steady_means(self, phase: str) -> dict[Metric, float]:
        """Mean of each metric over the steady state, in the project's unit (ratios 0–1)."""
        rows = self.steady(phase)
        out: dict[Metric, float] = {}
        for m in sorted({m for r in rows for m in r.values}, key=lambda m: m.value):
            vals = [r.values[m] * SPECS[m].scale for r in rows if m in r.values]
            out[m] = sum(vals) / len(vals)
        return out


def parse_trace(text: str, name: str = "trace", gpu_model: str = "NVIDIA H200") -> Trace:
    """Parse trace CSV text. Needs ``t`` and ``phase``; each known column becomes a metric.

    Empty cells (or ``-``/``NaN``) are absent values; a non-number is a :class:`BadInput`
    naming the line and column.
    """
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or "t" not in reader.fieldnames or "phase" not in reader.fieldnames:
        raise BadInput(f"{name}: not a trace CSV (needs columns t, phase, ...)")
    known = [c for c in reader.fieldnames if c in COLUMNS]
    if not known:
        raise BadInput(f"{name}: no known metric columns (expected e.g. {', '.join(list(COLUMNS)[:3])})")
    rows: list[TraceRow] = []
    for lineno, rec in enumerate(reader, start=2):
        try:
            t = float(rec["t"])
        except (TypeError, ValueError):
            raise BadInput(f"{name}:{lineno}: column t: not a number: {rec.get('t')!r}") from None
        values: dict[Metric, float] = {}
        for col in known:
            cell = (rec.get(col) or "").strip()
            if cell in ("", "-", "–") or cell.lower() == "nan":
                continue
            try:
                v = float(cell)
            except ValueError:
                raise BadInput(f"{name}:{lineno}: column {col}: not a number: {cell!r}") from None
            metric, factor = COLUMNS[col]
            values[metric] = v * factor
        rows.append(TraceRow(t=t, phase=(rec.get("phase") or "").strip(), values=values))
    rows.sort(key=lambda r: r.t)
    return Trace(name=name, rows=rows, gpu_model=gpu_model)


def load_trace(ref: str | Path) -> Trace:
    """Load a trace by bundled name (``h200-microbench``, ``h200-demo-cluster``) or by path."""
    ref_s = str(ref)
    if ref_s in BUNDLED:
        text = resources.files("auditor").joinpath("data", f"{ref_s}.csv").read_text(encoding="utf-8")
        return parse_trace(text, name=ref_s)
    path = Path(ref_s)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"trace {ref_s}: cannot read ({exc.strerror}); bundled traces: {', '.join(BUNDLED)}") from None
    return parse_trace(text, name=path.stem)


def make_gpus(n: int, host: str, *, model: str = "NVIDIA H200", first_index: int = 0) -> tuple[GpuId, ...]:
    """``n`` whole GPUs on ``host`` with stable, made-up UUIDs (same host+index → same UUID)."""
    return tuple(
        GpuId(uuid=fake_uuid(host, i), hostname=host, index=str(i), model=model)
        for i in range(first_index, first_index + n)
    )


def fake_uuid(host: str, index: int | str) -> str:
    """A deterministic ``GPU-xxxxxxxx-...`` UUID for a made-up GPU."""
    h = hashlib.sha1(f"{host}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One pod replaying trace phases on its GPUs.

    ``phase`` is replayed on every GPU unless ``gpu_phases`` gives one phase per GPU (e.g. a
    straggler rank). ``duration``/``end_offset`` override the global placement: the pod's series
    end at ``end - end_offset`` and last ``duration``. ``exclude`` drops metrics for this pod
    only (e.g. a node whose exporter has no SM_ACTIVE line).
    """

    pod: PodRef
    gpus: tuple[GpuId, ...]
    phase: str
    gpu_phases: tuple[str, ...] = ()
    duration: timedelta | None = None
    end_offset: timedelta = timedelta(0)
    exclude: frozenset[Metric] = field(default_factory=frozenset)

    def phase_of(self, i: int) -> str:
        return self.gpu_phases[i] if self.gpu_phases else self.phase


def _timestamps(end: datetime, duration: timedelta, interval: timedelta) -> list[float]:
    """``n = duration/interval`` scrape times ending one interval before ``end``.

    The samples then lie exactly inside ``[end - duration, end)``: an audit of that window sees
    all of them (coverage 1).
    """
    step = interval.total_seconds()
    if step <= 0:
        raise BadInput("scrape interval must be positive")
    n = int(math.floor(duration.total_seconds() / step + 1e-9))
    if n < 1:
        raise BadInput(f"duration {duration} is shorter than one scrape interval {interval}")
    e = end.timestamp()
    return [e - (n - k) * step for k in range(n)]


def trace_samples(
    trace: Trace,
    jobs: Iterable[TraceJob],
    *,
    end: datetime,
    duration: timedelta,
    interval: timedelta,
    include: set[Metric] | None = None,
) -> Iterator[Sample]:
    """Raw samples (exporter units) for every job, GPU and metric, in time order per series.

    Sample ``k`` of a series takes steady-state row ``k mod len(steady)``: the steady state is
    repeated in order to fill the duration. ``include`` limits the metrics (None: all the trace
    has). MIG instances get no GPU_UTIL.
    """
    if end.tzinfo is None:
        raise BadInput("end must be timezone-aware")
    for job in jobs:
        times = _timestamps(end - job.end_offset, job.duration or duration, interval)
        for i, gpu in enumerate(job.gpus):
            steady = trace.steady(job.phase_of(i))
            metrics = sorted({m for r in steady for m in r.values}, key=lambda m: m.value)
            for metric in metrics:
                if include is not None and metric not in include:
                    continue
                if metric in job.exclude or (metric is Metric.GPU_UTIL and gpu.instance):
                    continue
                for k, t in enumerate(times):
                    row = steady[k % len(steady)]
                    if metric in row.values:
                        yield Sample(job.pod, gpu, metric, t, row.values[metric])


CONVENTIONS = ("pod", "exported_pod")


def _labels(job: TraceJob, gpu: GpuId, *, convention: str, hostname_label: str) -> list[tuple[str, str]]:
    """dcgm-exporter's label set for one GPU series, in the exporter's order."""
    labels = [
        ("gpu", gpu.index or "0"),
        ("UUID", gpu.uuid),
        ("pci_bus_id", f"00000000:{(int(gpu.index or 0) * 16 + 0x18) & 0xFF:02X}:00.0"),
        ("device", f"nvidia{gpu.index or 0}"),
        ("modelName", gpu.model),
    ]
    if gpu.instance:
        labels += [("GPU_I_PROFILE", gpu.mig_profile), ("GPU_I_ID", gpu.instance)]
    if gpu.hostname:
        labels.append((hostname_label, gpu.hostname))
    if convention == "pod":
        labels += [("container", job.pod.container or "main"), ("namespace", job.pod.namespace), ("pod", job.pod.pod)]
    else:
        # Prometheus with honorLabels: false: the workload's labels become exported_*, and the
        # target's own labels name the exporter pod.
        labels += [
            ("exported_container", job.pod.container or "main"),
            ("exported_namespace", job.pod.namespace),
            ("exported_pod", job.pod.pod),
            ("container", "nvidia-dcgm-exporter"),
            ("namespace", "gpu-operator"),
            ("pod", f"nvidia-dcgm-exporter-{fake_uuid(gpu.hostname or 'node', 'exp')[4:9]}"),
        ]
    return labels


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def trace_to_openmetrics(
    trace: Trace,
    jobs: Sequence[TraceJob],
    *,
    end: datetime,
    duration: timedelta,
    interval: timedelta,
    convention: str = "pod",
    include: set[Metric] | None = None,
    hostname_label: str = "Hostname",
    dcgm46_names: bool = False,
    naming: Naming | None = None,
) -> str:
    """dcgm-exporter-format OpenMetrics text for ``jobs`` replaying ``trace``.

    ``convention`` is ``"pod"`` (honorLabels true) or ``"exported_pod"`` (honorLabels false);
    ``hostname_label`` is ``"Hostname"`` or ``"hostname"``; ``naming`` picks the exporter names
    and units (:class:`~auditor.core.metrics.Naming`: classic by default; ``dcgm46_names`` is
    short for DCGM 4.6's names; dcgm-exporter 4.9's give GPU_UTIL as a ratio and clocks in
    hertz; 4.10's are 4.9's with the PCIe rates named ``*_BYTES_PER_SECOND``). Timestamps are
    Unix seconds; the text ends with ``# EOF``.
    """
    naming = naming or (Naming.DCGM46 if dcgm46_names else Naming.CLASSIC)
    if convention not in CONVENTIONS:
        raise BadInput(f"label convention {convention!r}: use one of {', '.join(CONVENTIONS)}")
    if hostname_label not in ("Hostname", "hostname"):
        raise BadInput(f"hostname label {hostname_label!r}: use Hostname or hostname")
    by_pod = {(j.pod, g.key): (j, g) for j in jobs for g in j.gpus}
    # family → series label text → lines
    families: dict[Metric, dict[str, list[tuple[float, float]]]] = {}
    for s in trace_samples(trace, jobs, end=end, duration=duration, interval=interval, include=include):
        job, gpu = by_pod[(s.pod, s.gpu.key)]
        series = families.setdefault(s.metric, {})
        key = ",".join(
            f'{k}="{_escape(v)}"' for k, v in _labels(job, gpu, convention=convention, hostname_label=hostname_label)
        )
        series.setdefault(key, []).append((s.raw, s.t))
    out: list[str] = []
    for metric in sorted(families, key=lambda m: m.value):
        name = name_for(metric, naming)
        # trace values are in the classic name's unit: into this name's
        factor = SPECS[metric].scale / scale_of(name, naming)
        out.append(f"# HELP {name} {_HELP.get(metric, metric.value)}")
        out.append(f"# TYPE {name} gauge")
        for key, lines in families[metric].items():
            out.extend(f"{name}{{{key}}} {_fmt(raw * factor)} {t:.3f}" for raw, t in lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"
