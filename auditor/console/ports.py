"""What the console needs from outside: a reader of the store's facts and, when writes are on,
the acknowledgement log. Plain values cross the port, so pages are rendered without SQL."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol, Sequence

from auditor.core.admission import AdmissionFacts
from auditor.core.gate import AckKind, Acknowledgement, LineageHistory
from auditor.core.lineage import LineageKey
from auditor.core.model import Bucket

#: the columns the job list sorts on (server-side, over every job of the filter)
SORT_KEYS = (
    "job",
    "namespace",
    "team",
    "verdict",
    "gpu_hours",
    "waste_gpu_hours",
    "sm_active",
    "tensor_active",
    "mfu_estimate",
    "recoverable_gpu_hours",
    "start",
    "end",
)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The job list's filter, sort and page (every field from the query string, checked)."""

    team: str = ""
    namespace: str = ""
    verdict: str = ""
    text: str = ""
    state: str = ""  # "" all, "running", "ended"
    sort: str = "waste_gpu_hours"
    descending: bool = True
    offset: int = 0
    limit: int = 100
    #: a job is running when it has not ended and was seen since this time (the cluster page's
    #: definition, so its count and the list's agree); None: not ended is enough
    running_since: datetime | None = None


class JobRow(NamedTuple):
    """One job of the list: identity and the indexed columns of its latest summary (a named
    tuple: a page may hold 10,000 of them, and a frozen dataclass costs several times more)."""

    id: int
    cluster: str
    namespace: str
    kind: str
    name: str
    team: str
    verdict: str
    gpu_hours: float | None
    waste_gpu_hours: float | None
    sm_active: float | None
    tensor_active: float | None
    start: datetime | None
    end: datetime | None
    running: bool
    #: the MFU estimate, its reference (class or lineage best) and the gap (issue 28); None: n/a
    mfu_estimate: float | None = None
    mfu_reference: float | None = None
    mfu_class: str | None = None
    recoverable_gpu_hours: float | None = None


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of the job list, the total that matched, and the values the filters offer."""

    rows: Sequence[JobRow]
    total: int
    teams: Sequence[str]
    namespaces: Sequence[str]
    verdicts: Sequence[str]


@dataclass(frozen=True, slots=True)
class MfuSums:
    """The MFU of a set of jobs and its gap (issue 28): GPU-hours × MFU over the GPU-hours of the
    jobs with an estimate, and the recoverable GPU-hours of the jobs with a reference MFU."""

    mfu_gpu_hours: float = 0.0
    mfu_measured_gpu_hours: float = 0.0
    recoverable_gpu_hours: float = 0.0
    referenced_jobs: int = 0

    @property
    def mfu(self) -> float | None:
        """GPU-hour-weighted MFU of the jobs with an estimate (None: none has one)."""
        return self.mfu_gpu_hours / self.mfu_measured_gpu_hours if self.mfu_measured_gpu_hours > 0 else None

    @property
    def recoverable(self) -> float | None:
        """The recoverable GPU-hours, None when no job has a reference (unknown, not 0)."""
        return self.recoverable_gpu_hours if self.referenced_jobs else None


@dataclass(frozen=True, slots=True)
class ClusterNow:
    """The cluster as the store has it now: running jobs and their GPUs, the recent verdicts."""

    running_jobs: int
    gpus_allocated: float
    #: distinct GPUs with samples in the recent window (those with a job)
    gpus_seen: int
    #: GPUs that reported samples in the last day but have none in the recent window
    gpus_idle_seen: int
    gpu_hours_by_verdict: dict[str, float]
    #: the flagged jobs' idle-SM GPU-hours (auditor/core/figures.py)
    waste_gpu_hours: float
    jobs_by_verdict: dict[str, int]
    last_cycle: datetime | None
    since: datetime
    #: the MFU and its gap over the same jobs
    gap: "MfuSums" = field(default_factory=lambda: MfuSums())
    #: the healthy jobs' idle-SM GPU-hours: headroom, never added to waste
    headroom_gpu_hours: float = 0.0
    #: jobs with a wasteful verdict among them
    flagged_jobs: int = 0


@dataclass(frozen=True, slots=True)
class TeamWeek:
    """One team's sums over one ISO week (the weekly report's figures)."""

    team: str
    week: str
    gpu_hours: float
    waste_gpu_hours: float
    jobs: int
    cost: float | None = None
    #: waste GPU-hours by verdict: why the team wasted them
    waste_by_verdict: dict[str, float] = field(default_factory=dict)
    #: the MFU and its gap over the team's week
    gap: "MfuSums" = field(default_factory=lambda: MfuSums())
    #: efficiency's terms (auditor/core/figures.py): GPU-hours of the jobs with SM data, and
    #: their idle-SM share, healthy jobs' included; the healthy jobs' part (headroom, not waste)
    measured_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    headroom_gpu_hours: float = 0.0

    @property
    def main_waste(self) -> str:
        """The verdict behind most of the waste ("" without waste)."""
        top = max(self.waste_by_verdict.items(), key=lambda kv: kv[1], default=("", 0.0))
        return top[0] if top[1] > 0 else ""

    @property
    def efficiency(self) -> float | None:
        """The GPU-hour-weighted SM activity of the jobs with SM data, as the report's."""
        m = self.measured_gpu_hours
        return max(0.0, m - self.idle_gpu_hours) / m if m > 0 else None


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """A policy decision on a job with the actions it started and their outcomes."""

    id: int
    policy: str
    mode: str
    step: int
    decided_at: datetime
    dry_run: bool
    verdict: str
    reason: str
    actions: Sequence["ActionRow"] = ()


@dataclass(frozen=True, slots=True)
class ActionRow:
    """One action (notify, annotate, requeue, ...) and where it stands."""

    id: int
    job: str  # namespace/Kind/name
    cluster: str
    policy: str
    action: str
    state: str
    attempts: int
    created_at: datetime
    updated_at: datetime
    due_at: datetime | None
    error: str | None
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ViolationRow:
    """An open violation: which job broke which policy since when, and how far up the ladder."""

    id: int
    cluster: str
    job: str  # namespace/Kind/name
    job_id: int | None
    policy: str
    episode: int
    opened_at: datetime
    last_seen_at: datetime
    next_step: int
    last_step_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """A weekly report delivery (team, week, channel) and its state in the ledger."""

    cluster: str
    week: str
    team: str
    channel: str
    status: str
    attempts: int
    claimed_at: datetime
    sent_at: datetime | None
    error: str | None


@dataclass(frozen=True, slots=True)
class JobDetail:
    """Everything the job page shows of one job."""

    row: JobRow
    uid: str | None
    queue: str | None
    first_seen: datetime
    last_seen: datetime
    ended_at: datetime | None
    summary: dict[str, Any]
    buckets: Sequence[Bucket]
    lineage: LineageHistory | None
    admission: AdmissionFacts | None
    decisions: Sequence[DecisionRow]
    violations: Sequence[ViolationRow]


class ConsoleReader(Protocol):
    """The store's facts the pages show (one read transaction each)."""

    def cluster_now(self, now: datetime, *, recent: float, since: datetime) -> ClusterNow: ...

    def team_weeks(
        self, weeks: Sequence[tuple[str, datetime, datetime]], prices: dict[str, float]
    ) -> Sequence[TeamWeek]: ...

    def jobs(self, f: JobFilter) -> JobPage: ...

    def job(self, job_id: int, now: datetime) -> JobDetail | None: ...

    def open_violations(self) -> Sequence[ViolationRow]: ...

    def lineages(self, since: datetime) -> Sequence[LineageHistory]: ...

    def actions(self, since: datetime) -> Sequence[ActionRow]: ...

    def deliveries(self, since_week: str) -> Sequence[DeliveryRow]: ...


class AckWriter(Protocol):
    """The path ``gpu-auditor ack`` takes (:class:`auditor.store.lineage.AckLog`)."""

    def acknowledge(
        self,
        key: LineageKey,
        by: str,
        until: datetime | None,
        reason: str,
        now: datetime,
        *,
        via: str = "cli",
        link_id: str | None = None,
        kind: AckKind = AckKind.ACK,
    ) -> Acknowledgement: ...
