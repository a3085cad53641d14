"""The figures every surface shows, defined once (issue 30; docs/figures.md is the user's page).

The table, ``explain``, ``status``, the weekly report, the console, the operator's ``/metrics``
and the alerts all read a job's stored summary; what differs between them is only *which jobs*
(each states its window) and how the per-job numbers are summed. The summing rules live here so
that a team's efficiency or waste reads the same everywhere:

- a job is **flagged** (one to look at) when its verdict judges it wasteful: every verdict but
  ``healthy`` and ``insufficient_data`` (``low_mfu`` included: it is the founding case);
- a job's own ``waste_gpu_hours`` is its idle-SM share, ``gpu_hours × (1 − sm_active)`` (the audit
  JSON's contract, on every job with SM data). **Summed**, waste counts flagged jobs only: the
  idle-SM share of a ``healthy`` job is **headroom** (shown apart, never called waste), and an
  ``insufficient_data`` job is not judged, so neither;
- **efficiency** is the GPU-hour-weighted SM activity over the jobs with SM data
  (``1 − idle / measured``, idle summed over *every* measured job, healthy or not): a measurement,
  not a judgement, so it does not depend on verdicts; GPU-hours without SM data are left out,
  never counted as efficient or wasted;
- **MFU** is GPU-hour-weighted over the jobs with an estimate; **recoverable GPU-hours** sum the
  MFU gap of the jobs with a reference (None when none has one: unknown, not 0).

Pure: no I/O; the store sums in SQL by (team, verdict) and hands the sums to :class:`Figures`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

#: verdicts that judge a job wasteful: the jobs "to look at" on every surface
FLAGGED: tuple[str, ...] = (
    "idle",
    "underutilized",
    "low_sm_efficiency",
    "memory_bound",
    "no_tensor_cores",
    "low_mfu",
)
#: the verdict whose idle-SM share is headroom, not waste
HEALTHY = "healthy"


def is_flagged(verdict: object) -> bool:
    """Whether a job of ``verdict`` is one to look at (its idle-SM share counts as waste)."""
    return str(verdict) in FLAGGED


def counted_waste(verdict: object, idle_gpu_hours: float | None) -> float:
    """The part of a job's (or a verdict group's) idle-SM GPU-hours that counts as waste."""
    return float(idle_gpu_hours or 0.0) if is_flagged(verdict) else 0.0


def gpus_text(gpus: float | None) -> str:
    """GPU equivalents as every surface prints them: whole GPUs as integers, a MIG slice (or a
    GPU shared by pods) with two decimals (``0.14``), so the table, the findings, ``explain`` and
    the console print the same figure."""
    if gpus is None:
        return "-"
    if abs(gpus - round(gpus)) < 0.005:
        return f"{round(gpus):d}"
    return f"{gpus:.2f}"


def gpu_name(hostname: str, index: str, uuid: str, instance: str = "") -> str:
    """A GPU as every surface names it: ``host:gpuN`` (a MIG instance ``host:gpuN/migM``), the
    parent UUID where the exporter gave no index, so a finding, ``explain`` and the console's
    charts name the same device the same way (they printed ``0``, a UUID, ``node:gpu0``)."""
    name = f"gpu{index}" if index else uuid
    if instance:
        name += f"/mig{instance}"
    return f"{hostname}:{name}" if hostname else name


def natural_key(text: str) -> tuple[tuple[int, str], ...]:
    """Sort key that orders ``gpu2`` before ``gpu10`` (digits as numbers): GPUs listed in order."""
    return tuple((0, f"{int(p):012d}") if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p)


@dataclass
class Figures:
    """Sums over a set of jobs (a team, a verdict, the cluster) in one window.

    Add verdict groups with :meth:`add`; read the derived figures as properties. ``idle`` is
    every measured job's idle-SM GPU-hours; ``waste`` the flagged jobs' part of it and
    ``headroom`` the healthy jobs' part.
    """

    jobs: int = 0
    flagged: int = 0
    gpu_hours: float = 0.0
    measured_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    waste_gpu_hours: float = 0.0
    headroom_gpu_hours: float = 0.0
    mfu_gpu_hours: float = 0.0
    mfu_measured_gpu_hours: float = 0.0
    recoverable_gpu_hours: float = 0.0
    referenced_jobs: int = 0
    #: flagged jobs' waste by verdict (what the waste comes from)
    waste_by_verdict: dict[str, float] = field(default_factory=dict)

    def add(
        self,
        verdict: object,
        *,
        jobs: int,
        gpu_hours: float,
        measured_gpu_hours: float,
        idle_gpu_hours: float | None,
        mfu_gpu_hours: float = 0.0,
        mfu_measured_gpu_hours: float = 0.0,
        recoverable_gpu_hours: float = 0.0,
        referenced_jobs: int = 0,
    ) -> None:
        """Add the sums of the jobs of one verdict (``idle_gpu_hours``: their ``waste_gpu_hours``)."""
        v = str(verdict)
        idle = float(idle_gpu_hours or 0.0)
        self.jobs += jobs
        self.gpu_hours += gpu_hours
        self.measured_gpu_hours += measured_gpu_hours
        self.idle_gpu_hours += idle
        if is_flagged(v):
            self.flagged += jobs
            self.waste_gpu_hours += idle
            self.waste_by_verdict[v] = self.waste_by_verdict.get(v, 0.0) + idle
        elif v == HEALTHY:
            self.headroom_gpu_hours += idle
        self.mfu_gpu_hours += mfu_gpu_hours
        self.mfu_measured_gpu_hours += mfu_measured_gpu_hours
        self.recoverable_gpu_hours += recoverable_gpu_hours
        self.referenced_jobs += referenced_jobs

    def add_group(self, g: Any) -> None:
        """Add a verdict group with the fields of :class:`auditor.store.reports.Group` (``verdict``,
        ``jobs``, ``gpu_hours``, ``measured_gpu_hours``, ``waste_gpu_hours``: its idle-SM hours, and
        the MFU sums): the report and the console sum the store's groups the same way."""
        self.add(
            g.verdict,
            jobs=g.jobs,
            gpu_hours=g.gpu_hours,
            measured_gpu_hours=g.measured_gpu_hours,
            idle_gpu_hours=g.waste_gpu_hours,
            mfu_gpu_hours=g.mfu_gpu_hours,
            mfu_measured_gpu_hours=g.mfu_measured_gpu_hours,
            recoverable_gpu_hours=g.recoverable_gpu_hours,
            referenced_jobs=g.referenced_jobs,
        )

    @property
    def unmeasured_gpu_hours(self) -> float:
        return max(0.0, self.gpu_hours - self.measured_gpu_hours)

    @property
    def sm_active_gpu_hours(self) -> float:
        return max(0.0, self.measured_gpu_hours - self.idle_gpu_hours)

    @property
    def efficiency(self) -> float | None:
        """GPU-hour-weighted SM activity of the jobs with SM data (None: none has any)."""
        return self.sm_active_gpu_hours / self.measured_gpu_hours if self.measured_gpu_hours > 0 else None

    @property
    def mfu(self) -> float | None:
        return self.mfu_gpu_hours / self.mfu_measured_gpu_hours if self.mfu_measured_gpu_hours > 0 else None

    @property
    def recoverable(self) -> float | None:
        """Recoverable GPU-hours, None when no job has a reference MFU (unknown, not 0)."""
        return self.recoverable_gpu_hours if self.referenced_jobs else None

    @property
    def main_waste(self) -> str:
        """The verdict behind most of the waste ("" without waste)."""
        top = max(self.waste_by_verdict.items(), key=lambda kv: kv[1], default=("", 0.0))
        return top[0] if top[1] > 0 else ""


def of_jobs(jobs: Iterable[Any]) -> Figures:
    """:class:`Figures` over job summaries (:class:`~auditor.core.job_summary.JobSummary`, or
    anything with its ``verdict``, ``gpu_hours``, ``waste_gpu_hours``, ``mfu_estimate`` and
    ``recoverable_gpu_hours``): the table's footer and the demo page sum them as the store does."""
    out = Figures()
    for j in jobs:
        hours = float(j.gpu_hours or 0.0)
        mfu, rec = j.mfu_estimate, j.recoverable_gpu_hours
        out.add(
            j.verdict.value if hasattr(j.verdict, "value") else j.verdict,
            jobs=1,
            gpu_hours=hours,
            measured_gpu_hours=hours if j.waste_gpu_hours is not None else 0.0,
            idle_gpu_hours=j.waste_gpu_hours,
            mfu_gpu_hours=hours * mfu if mfu is not None else 0.0,
            mfu_measured_gpu_hours=hours if mfu is not None else 0.0,
            recoverable_gpu_hours=float(rec or 0.0),
            referenced_jobs=1 if rec is not None else 0,
        )
    return out
