"""What a job's MFU estimate is measured against: its workload class's reference MFU, or its
lineage's own best run, and the GPU-hours the gap would free (issue 28). Pure.

Why a reference at all: an MFU of 0.16 is a scandal for a bf16 LLM training (the same model,
fused, runs at 0.40–0.47 on an H200) and normal for an embedding-heavy recommender, whose work
is gathers, not matmuls. So the estimate alone judges nothing; the class says what the job
*could* reach, and only a class with a reference (or the lineage's own best run) is ever
charged recoverable GPU-hours or called ``low_mfu``. docs/verdicts.md gives the defaults and
the measurements behind them.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Sequence

from auditor.core.model import JobRef

#: the job label that selects a default class (``gpu-auditor.io/workload-class=llm-training``)
CLASS_LABEL = "gpu-auditor.io/workload-class"
#: the ``source`` of a reference that is the lineage's own best run
LINEAGE_BEST = "lineage-best"
#: kinds that run inference servers: their idle time between requests is a serving question
SERVING_KINDS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet", "InferenceService", "RayService"})


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """A kind of workload and the MFU it can reach on the precision's dense tensor peak.

    Selectors are fnmatch globs; a class matches a job when *every* non-empty selector matches
    (``labels``: every (key, value-glob) pair is on the job). ``reference_mfu=None``: the class
    has no reference (a non-matmul workload): never charged. ``serving``: an inference server,
    whose idle time between requests is a serving question, not a pipeline one."""

    name: str
    reference_mfu: float | None
    serving: bool = False
    namespaces: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    priority_classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.reference_mfu is not None and not 0.0 < self.reference_mfu <= 1.0:
            raise ValueError(f"workload class {self.name!r}: reference_mfu must be in (0, 1], got {self.reference_mfu}")

    def matches(self, job: JobRef) -> bool:
        """Every non-empty selector matches (a class with none matches every job)."""
        if self.namespaces and not _any_glob(job.namespace, self.namespaces):
            return False
        if self.teams and not _any_glob(job.team or job.namespace, self.teams):
            return False
        if self.priority_classes and not _any_glob(job.priority_class or "", self.priority_classes):
            return False
        if self.labels:
            have = dict(job.labels)
            if not all(k in have and fnmatchcase(have[k], v) for k, v in self.labels):
                return False
        return True


def _any_glob(value: str, patterns: Sequence[str]) -> bool:
    return any(fnmatchcase(value, p) for p in patterns)


def _by_label(name: str, reference: float | None, *, serving: bool = False) -> WorkloadClass:
    return WorkloadClass(name, reference, serving=serving, labels=((CLASS_LABEL, name),))


#: the shipped classes, selected by the job label ``gpu-auditor.io/workload-class=<name>``;
#: references measured on an H200 (docs/verdicts.md "Reference MFU"). Classes without a
#: reference are listed so that a label naming them is understood (and never charged).
DEFAULT_CLASSES: tuple[WorkloadClass, ...] = (
    # bf16 LLM training: the founding case's 35–45 %; fused transformer steps on an H200 measure
    # 0.40 (SDPA, s1024 and s4096) to 0.47 (SDPA + torch.compile)
    _by_label("llm-training", 0.40),
    _by_label("llm-finetuning", 0.40),
    # inference servers: MFU follows the request rate, not the code; no reference
    _by_label("llm-inference", None, serving=True),
    _by_label("serving", None, serving=True),
    # non-LLM training: convolutions, gathers and UNets reach very different MFUs by design
    _by_label("cnn-training", None),
    _by_label("recsys-training", None),
    _by_label("diffusion-training", None),
)


@dataclass(frozen=True, slots=True)
class MfuReference:
    """The MFU a job is measured against and where it comes from (a class name or ``lineage-best``)."""

    value: float
    source: str


@dataclass(frozen=True, slots=True)
class MfuContext:
    """What :func:`auditor.core.summary.summarize_job` needs beyond the buckets: the job's
    reference MFU (None: never low_mfu, no recoverable GPU-hours) and whether it is a server."""

    reference: MfuReference | None = None
    serving: bool = False


def select_class(job: JobRef, classes: Sequence[WorkloadClass]) -> WorkloadClass | None:
    """The first class that matches ``job`` (None when none does)."""
    return next((c for c in classes if c.matches(job)), None)


def reference_for(job: JobRef, classes: Sequence[WorkloadClass], lineage_best: float | None) -> MfuContext:
    """The job's reference: the higher of its class's reference and its lineage's best MFU
    (either alone when only one exists). ``serving``: the class is marked serving or the job's
    kind is one of :data:`SERVING_KINDS`.

    Why the higher: a lineage that once ran at 0.45 can run at 0.45 again, whatever its class
    says; one whose best is below its class's reference is still measured against what its kind
    of work reaches elsewhere. A serving class takes no lineage reference (a server's MFU
    follows its traffic, so its best hour says nothing about the code)."""
    cls = select_class(job, classes)
    serving = bool(cls and cls.serving) or job.kind in SERVING_KINDS
    ref = MfuReference(cls.reference_mfu, cls.name) if cls and cls.reference_mfu is not None else None
    if lineage_best is not None and lineage_best > 0 and not serving:
        if ref is None or lineage_best > ref.value:
            ref = MfuReference(min(1.0, lineage_best), LINEAGE_BEST)
    return MfuContext(reference=ref, serving=serving)


def recoverable_gpu_hours(gpu_hours: float | None, mfu: float | None, reference: float | None) -> float | None:
    """GPU-hours the job would not have needed at the reference MFU: the same work at
    ``reference`` instead of ``mfu`` takes ``mfu / reference`` of the time.
    ``gpu_hours × max(0, 1 − mfu / reference)``; None when any input is None."""
    if gpu_hours is None or mfu is None or reference is None or reference <= 0:
        return None
    return gpu_hours * max(0.0, 1.0 - mfu / reference)
