"""Value types shared by every layer: who ran on which GPU, and the rollup buckets.

These are the nouns of the data flow in DESIGN.md. Sources produce :class:`Bucket` rows keyed
by pod and GPU; correlation maps each :class:`PodRef` to a :class:`JobRef`; the store persists
buckets per job; the summary and verdict code reads them back. All are immutable, hashable
values so they can be dictionary keys and compared in tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import NamedTuple

from auditor.core.identity import JobKey, format_job
from auditor.core.metrics import Metric

#: MIG profile "<g>g.<mem>" → slices; the fraction is slices / the GPU's max slices (7 on
#: A100/H100/H200/B200). "7g.141gb" is a whole GPU.
_MIG_SLICES = re.compile(r"^(\d+)g\.")
MIG_MAX_SLICES = 7


class Verdict(str, Enum):
    """One verdict per job; DESIGN.md's table, decided in this order (first match wins)."""

    INSUFFICIENT_DATA = "insufficient_data"
    IDLE = "idle"
    UNDERUTILIZED = "underutilized"
    LOW_SM_EFFICIENCY = "low_sm_efficiency"
    MEMORY_BOUND = "memory_bound"
    NO_TENSOR_CORES = "no_tensor_cores"
    #: SMs busy and tensor cores in use, but the MFU estimate far below the reference of the
    #: job's workload class or of its lineage's best run (docs/verdicts.md; issue 28)
    LOW_MFU = "low_mfu"
    HEALTHY = "healthy"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True, order=True)
class GpuId:
    """One GPU, or one MIG instance of a GPU, as the exporter labels it.

    ``uuid`` is always the parent GPU's UUID (dcgm-exporter puts it on MIG series too);
    ``instance`` is the MIG GPU-instance id (``GPU_I_ID``), empty for a whole GPU.
    """

    uuid: str
    instance: str = ""
    hostname: str = ""
    index: str = ""
    model: str = ""
    mig_profile: str = ""

    @property
    def key(self) -> str:
        """Stable identity: parent UUID plus MIG instance (the labels that name the device)."""
        return f"{self.uuid}/{self.instance}" if self.instance else self.uuid

    @property
    def fraction(self) -> float:
        """GPU equivalents this device counts for: 1 for a whole GPU, slices/7 for MIG."""
        if not self.instance:
            return 1.0
        m = _MIG_SLICES.match(self.mig_profile)
        if not m:
            return 1.0 / MIG_MAX_SLICES
        return min(1.0, int(m.group(1)) / MIG_MAX_SLICES)


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """A pod as metric labels name it."""

    namespace: str
    pod: str
    container: str = ""


@dataclass(frozen=True, slots=True, order=True)
class JobRef:
    """The top-level job a pod belongs to (``Pod/<name>`` for a bare pod or with ``--no-kube``)."""

    cluster: str
    namespace: str
    kind: str
    name: str
    uid: str | None = None
    team: str = ""
    queue: str | None = None
    #: the job's Kubernetes labels, sorted (a workload class is selected by them, auditor/core/mfu.py)
    labels: tuple[tuple[str, str], ...] = ()
    priority_class: str | None = None

    @property
    def identity(self) -> JobKey:
        return JobKey(self.cluster, self.namespace, self.kind, self.name)

    @property
    def job(self) -> str:
        """``Kind/name``, the job field of the audit JSON."""
        return format_job(self.kind, self.name)

    @property
    def key(self) -> str:
        """``cluster/namespace/Kind/name``: unique across clusters sharing one store."""
        return str(self.identity)


class Bucket(NamedTuple):
    """The rollup of one metric on one GPU for one pod over ``[start, end)``.

    ``total``/``count`` are the sum and number of valid samples (in the metric's unit, see
    :mod:`auditor.core.metrics`), so means over any set of buckets combine exactly;
    ``minimum``/``maximum`` bound them; ``dropped`` counts garbage samples that were discarded.
    A bucket with ``count == 0`` carries only a ``dropped`` count.

    A named tuple rather than a frozen dataclass: an audit of a large cluster holds millions of
    buckets, and a frozen dataclass costs about ten times as much to create (one
    ``object.__setattr__`` per field). It is just as immutable and hashable, with the same fields.
    """

    pod: PodRef
    gpu: GpuId
    metric: Metric
    start: datetime
    end: datetime
    total: float
    count: int  # type: ignore[assignment]  # hides tuple.count(), which no caller wants of a Bucket
    minimum: float
    maximum: float
    dropped: int = 0

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class Window:
    """A half-open time range ``[start, end)`` in UTC."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("Window times must be timezone-aware")
        if self.end <= self.start:
            raise ValueError(f"empty window: end {self.end.isoformat()} <= start {self.start.isoformat()}")

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    def aligned(self, width: timedelta) -> "Window":
        """The smallest window on ``width``-aligned boundaries (since the epoch) that covers this one."""
        step = width.total_seconds()
        s = self.start.timestamp() // step * step
        e = -(-self.end.timestamp() // step) * step
        return Window(datetime.fromtimestamp(s, timezone.utc), datetime.fromtimestamp(e, timezone.utc))

    def buckets(self, width: timedelta) -> list["Window"]:
        """The aligned buckets of ``width`` that cover this window."""
        a = self.aligned(width)
        out, t = [], a.start
        while t < a.end:
            out.append(Window(t, t + width))
            t += width
        return out


@dataclass(frozen=True, slots=True)
class Finding:
    """One observation behind a verdict; ``code`` is documented in docs/findings.md."""

    code: str
    message: str
    evidence: dict[str, object] = field(default_factory=dict)
