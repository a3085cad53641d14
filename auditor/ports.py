"""Ports: what the use-cases need from the outside, as small protocols.

The use-cases (the audit in :mod:`auditor.engine`, the operator cycle, the policy run, the
reports, ``doctor``, next the admission gate) are written against these, never against an
adapter's class: the composition root (:mod:`auditor.compose`) hands them the real adapters
(Prometheus, the SQL store, the Kubernetes API, Slack/webhooks, the system clock), and a test
hands them fakes of its own. Each port lists only the calls its use-cases make, so a fake is a
few lines and the type checker names every use-case a new call would touch.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

from auditor.core.accumulate import JobAggregate
from auditor.core.action_target import ActionTarget
from auditor.core.model import Bucket, JobRef, Window
from auditor.core.readings import SourceResult
from auditor.correlate import JobResolver

if TYPE_CHECKING:
    from auditor.core.job_summary import JobSummary

__all__ = [
    "ChatNotifier",
    "CheckRequeue",
    "Clock",
    "ClusterActions",
    "DecisionLog",
    "Displacement",
    "EventNotifier",
    "JobResolver",
    "LeaderElection",
    "MetricSource",
    "OperatorStore",
    "SourceResult",
    "SummaryStore",
]


class MetricSource(Protocol):
    """Reads rollup buckets for all pods and GPUs of a window (Prometheus, a trace replay).

    The number of calls a source makes must not grow with the number of jobs.
    """

    def read(self, window: Window, width: timedelta) -> SourceResult:
        """Return the ``width``-aligned buckets that overlap ``window`` (half-open)."""
        ...

    def read_lazy(self, window: Window, width: timedelta) -> SourceResult:
        """The same read, its buckets possibly handed over as
        :class:`~auditor.core.rollup.LazyBuckets` (compact arrays; a job's buckets become objects
        only while the engine handles that job). The engine always reads this way; a source with
        no compact form returns :meth:`read`'s result."""
        ...


@runtime_checkable
class Clock(Protocol):
    """Time as the code outside the core sees it: "now", elapsed time, and waiting.

    ``now`` is timezone-aware UTC; ``monotonic`` only measures intervals (it never jumps);
    ``wait`` sleeps up to ``seconds`` or until ``event`` is set and returns whether it is — the
    one way a loop sleeps, so a fake clock can advance instead of sleeping.
    """

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...

    def wait(self, event: threading.Event, seconds: float) -> bool: ...


class Displacement(Protocol):
    """GPU time a write moved between two job identities (:class:`auditor.store.store.Displaced`)."""

    @property
    def job_id(self) -> int: ...

    @property
    def namespace(self) -> str: ...

    @property
    def pod(self) -> str: ...

    @property
    def buckets(self) -> int: ...

    @property
    def owner(self) -> int: ...


class SummaryStore(Protocol):
    """What one audit (:func:`auditor.engine.run_audit`) reads and writes: jobs, their bucket
    rollup and aggregates, their summaries, and the run's record."""

    def upsert_job(self, job: JobRef, first_seen: datetime, last_seen: datetime) -> int: ...

    def upsert_jobs(self, items: Sequence[tuple[JobRef, datetime, datetime]]) -> list[int]:
        """:meth:`upsert_job` of many jobs in one statement (the ids in ``items``' order)."""
        ...

    def job(self, job_id: int) -> JobRef | None: ...

    def replace_buckets(self, job_id: int, buckets: Sequence[Bucket]) -> Sequence[Displacement]: ...

    def replace_buckets_many(self, items: Sequence[tuple[int, Sequence[Bucket]]]) -> Sequence[Sequence[Displacement]]:
        """:meth:`replace_buckets` of many jobs at once: the same rows, in ``items``' order."""
        ...

    def buckets(self, job_id: int, window: Window | None = None) -> list[Bucket]: ...

    def aggregate(self, job_id: int) -> JobAggregate | None: ...

    def save_aggregate(self, job_id: int, agg: JobAggregate, now: datetime) -> None: ...

    def summary(self, job_id: int) -> dict | None: ...

    def save_summary(self, job_id: int, summary: dict) -> None: ...

    def save_job_summary(self, job_id: int, summary: "JobSummary") -> None:
        """Save the engine's own summary (its audit JSON document): a store may keep the object
        too (the operator's cycle does, so that its result need not read the document back)."""
        ...

    def delete_summary(self, job_id: int) -> bool: ...

    def lineage_best_mfu(self, jobs: Sequence[JobRef]) -> dict[str, float]:
        """By job key: the best MFU of the earlier runs of each job's lineage (jobs without one
        left out): the lineage-best MFU reference (issue 28), one read for all ``jobs``."""
        ...

    def record_run(
        self,
        window: Window,
        started: datetime,
        finished: datetime,
        *,
        jobs: int,
        queries: int,
        status: str,
        detail: dict,
    ) -> int: ...


class OperatorStore(SummaryStore, Protocol):
    """What the operator's cycle (:class:`auditor.operator_loop.cycle.CycleRunner`) asks of the
    store beyond one audit's calls: its cursor (the runs), the open jobs it ends, one transaction
    per chunk, and the grouped writes its write-behind store (``_CycleStore``) makes."""

    def runs(self, *, limit: int = 100) -> list[dict]: ...

    def open_jobs(self, cluster: str) -> list[tuple[int, JobRef, datetime, datetime]]: ...

    def set_job_ended(self, job_id: int, ended_at: datetime | None) -> None: ...

    def batch(self) -> AbstractContextManager[Any]: ...

    def save_summaries(self, items: Sequence[tuple[int, dict]]) -> None: ...

    def save_aggregates(self, items: Sequence[tuple[int, JobAggregate]], now: datetime) -> None: ...

    def advance_aggregates(self, items: Sequence[tuple[int, datetime]], now: datetime) -> int:
        """Move the stored ``through`` (and stamp) of aggregates whose state is not rewritten."""
        ...

    def aggregate_stamps(self, cluster: str) -> dict[int, tuple[datetime, datetime]]: ...

    def record_admission_facts(self, readings: Sequence[tuple[int, Any]], now: datetime) -> int:
        """Fold each ``(job_id, facts)`` Kueue admission reading into the job's stored facts;
        returns the rows written (:class:`auditor.store.admissions.AdmissionStore`)."""
        ...


class DecisionLog(Protocol):
    """The policies' memory (:class:`auditor.store.decisions.DecisionStore`) as a dry run uses it:
    would-do decisions (the escalation record itself is the policy runner's)."""

    def record_would_do(
        self,
        job: Any,
        policy: str,
        *,
        dedup_key: str,
        mode: str,
        step: int,
        action_names: list[str],
        now: datetime,
        verdict: str,
        reason: str,
        evidence: dict,
    ) -> bool: ...


class ClusterActions(Protocol):
    """The cluster reads and writes a policy step makes (:class:`auditor.actions.kube.KubeActions`)."""

    def facts(self, target: ActionTarget) -> Any: ...

    def annotate(self, target: ActionTarget, annotations: Mapping[str, Any]) -> dict: ...

    def event(
        self,
        target: ActionTarget,
        *,
        key: str,
        reason: str,
        note: str,
        action: str,
        now: datetime,
        type_: str = "Warning",
    ) -> dict: ...

    def requeue_target(self, target: ActionTarget) -> dict: ...

    def deactivate(self, target: dict, *, lower_priority_by: int = 0) -> dict: ...

    def holds_quota(self, target: Mapping[str, Any]) -> bool | None: ...

    def reactivate(self, target: dict) -> dict: ...


class CheckRequeue(Protocol):
    """The policy ladder's requeue through the efficiency gate's AdmissionCheck
    (:class:`auditor.gate.requeue.GateRequeue`): Kueue evicts the running Workload (check
    ``Retry``), keeps it out of its queue for the backoff and queues it again behind the Workloads
    that were waiting, counting the retry itself. Used only where it helps: the gate runs in this
    replica, its check is on the Workload, and the Workload's ClusterQueue has Workloads pending;
    otherwise the ladder uses the ``spec.active`` path (:meth:`ClusterActions.deactivate`)."""

    def requeue(
        self, workload: Mapping[str, Any], message: str, *, backoff_s: int, lower_priority_by: int, now: datetime
    ) -> dict:
        """Requeue ``workload`` (a :meth:`ClusterActions.requeue_target` of type ``workload``)
        through the check. Returns ``{"used": True, ...}`` with what was written (``checks``,
        ``cluster_queue``, ``pending_workloads``), or ``{"used": False, "why": ...}`` when the check
        path does not apply (nothing written)."""
        ...


class ChatNotifier(Protocol):
    """A chat destination (:class:`auditor.notify.slack.SlackNotifier`): text plus optional blocks."""

    def send(self, text: str, blocks: list[dict] | None = None) -> Any: ...


class EventNotifier(Protocol):
    """A machine destination (:class:`auditor.notify.webhook.WebhookNotifier`): a typed, signed event."""

    def send(self, kind: str, payload: dict, *, delivery_id: str | None = None) -> Any: ...


class LeaderElection(Protocol):
    """One Lease held (or waited for) by this replica (:class:`auditor.kube.lease.LeaderElector`):
    what the operator's loop asks of it."""

    namespace: str
    name: str
    #: why the last attempt to take or renew the Lease failed (None: it did not)
    last_error: str | None

    @property
    def is_leader(self) -> bool: ...

    def holder(self) -> str | None: ...

    def start(self) -> Any: ...

    def acquire(self, timeout: float) -> bool: ...

    def stop(self, release: bool = True) -> None: ...
