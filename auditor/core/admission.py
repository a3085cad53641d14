"""Kueue's view of a job's admission, read from its Workload: the queue, the wait, evictions.

A team lead asks first how long their jobs waited for quota, next to how well they used the GPUs.
Kueue records it on the job's Workload (``kueue.x-k8s.io/v1beta2``, fields as in Kueue v0.17.0's
``apis/kueue/v1beta2/workload_types.go``): ``metadata.creationTimestamp``, the ``QuotaReserved``,
``Admitted``, ``Evicted`` and ``Requeued`` conditions (each with its latest ``lastTransitionTime``),
``status.admission.clusterQueue``, ``status.schedulingStats.evictions[{reason, underlyingCause,
count}]`` and ``status.requeueState.count``.

Waits follow Kueue's own ``QueuedWaitTime`` (pkg/workload): a Workload is queued since its
``Requeued`` condition's transition, or since its creation when it was never requeued. The
conditions keep only their latest transition, so the first admission is known from the Workload
alone only while it was never evicted; :func:`merge` keeps it across the operator's readings.
Pure: no I/O, times come from the document.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from auditor.core.rfc3339 import parse_rfc3339
from auditor.errors import BadInput


@dataclass(frozen=True, slots=True)
class AdmissionFacts:
    """What Kueue says about one job's admission, as read from its Workload.

    ``admitted_at``/``queue_wait_s``: the first admission and the wait before it (None when the
    reading came after an eviction and no earlier reading saw the first one).
    ``last_admitted_at``/``last_wait_s``: the current admission and its wait since the Workload
    was last queued (the same as the first until an eviction). ``evictions``: Kueue's counts by
    reason (``reason`` or ``reason/underlyingCause``). ``requeues``: how often Kueue put the
    Workload back in the queue after an eviction. ``pending``: waiting for (re-)admission now.
    """

    workload: str
    created: datetime
    workload_uid: str | None = None
    local_queue: str | None = None
    cluster_queue: str | None = None
    quota_reserved_at: datetime | None = None
    admitted_at: datetime | None = None
    queue_wait_s: float | None = None
    last_admitted_at: datetime | None = None
    last_wait_s: float | None = None
    evictions: Mapping[str, int] = field(default_factory=dict)
    requeues: int = 0
    last_eviction_reason: str | None = None
    last_evicted_at: datetime | None = None
    pending: bool = False

    @property
    def eviction_count(self) -> int:
        return sum(self.evictions.values())

    def to_json(self) -> dict[str, Any]:
        """The facts as the audit JSON and ``explain --output json`` show them."""
        return {
            "workload": self.workload,
            "local_queue": self.local_queue,
            "cluster_queue": self.cluster_queue,
            "created": _iso(self.created),
            "quota_reserved_at": _iso(self.quota_reserved_at),
            "admitted_at": _iso(self.admitted_at),
            "queue_wait_s": self.queue_wait_s,
            "last_admitted_at": _iso(self.last_admitted_at),
            "last_wait_s": self.last_wait_s,
            "evictions": dict(sorted(self.evictions.items())),
            "eviction_count": self.eviction_count,
            "requeues": self.requeues,
            "last_eviction_reason": self.last_eviction_reason,
            "last_evicted_at": _iso(self.last_evicted_at),
            "pending": self.pending,
        }


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _time(value: Any, where: str) -> datetime:
    try:
        return parse_rfc3339(value)
    except ValueError as exc:
        raise BadInput(f"{where}: {exc}") from None


def _seconds(since: datetime | None, until: datetime | None) -> float | None:
    if since is None or until is None:
        return None
    return max(0.0, (until - since).total_seconds())


def admission_facts(workload: Mapping[str, Any]) -> AdmissionFacts:
    """The admission facts of one Workload document (as the API returns it).

    Raises :class:`BadInput` naming the Workload and field when a time cannot be read.
    """
    meta = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    status = workload.get("status") or {}
    name = str(meta.get("name") or "")
    where = f"Workload {meta.get('namespace') or ''}/{name}"
    created = _time(meta.get("creationTimestamp"), f"{where} metadata.creationTimestamp")
    conds: dict[str, tuple[bool, str, datetime]] = {}
    for i, c in enumerate(status.get("conditions") or []):
        kind = c.get("type")
        if kind in ("QuotaReserved", "Admitted", "Evicted", "Requeued", "Finished"):
            at = _time(c.get("lastTransitionTime"), f"{where} status.conditions[{i}].lastTransitionTime")
            conds[kind] = (c.get("status") == "True", str(c.get("reason") or ""), at)

    def when_true(kind: str) -> datetime | None:
        c = conds.get(kind)
        return c[2] if c and c[0] else None

    evictions: dict[str, int] = {}
    for e in (status.get("schedulingStats") or {}).get("evictions") or []:
        reason = str(e.get("reason") or "")
        cause = str(e.get("underlyingCause") or "")
        key = f"{reason}/{cause}" if cause else reason
        evictions[key] = evictions.get(key, 0) + int(e.get("count") or 0)
    evicted = sum(evictions.values())

    admitted = when_true("Admitted")
    requeued = conds.get("Requeued")
    # Kueue's QueuedWaitTime: queued since the Requeued transition, else since creation; the
    # first admission's wait counts from creation (a restarted ClusterQueue also sets Requeued)
    requeued_before = requeued is not None and (admitted is None or requeued[2] <= admitted)
    queued_since = requeued[2] if requeued is not None and requeued_before and evicted else created
    last_wait = _seconds(queued_since, admitted)
    # every eviction puts the Workload back in the queue except while it is deactivated
    # (``Requeued`` False, reason ``Deactivated``, until ``spec.active`` is true again)
    held = requeued is not None and not requeued[0]
    requeues = max(evicted - (1 if held else 0), 0)
    requeues = max(requeues, int((status.get("requeueState") or {}).get("count") or 0))
    ev = conds.get("Evicted")
    last_reason = ev[1] if ev and ev[0] else (next(iter(evictions)).split("/")[0] if len(evictions) == 1 else None)
    return AdmissionFacts(
        workload=name,
        created=created,
        workload_uid=meta.get("uid") or None,
        local_queue=spec.get("queueName") or None,
        cluster_queue=(status.get("admission") or {}).get("clusterQueue") or None,
        quota_reserved_at=when_true("QuotaReserved"),
        admitted_at=admitted if evicted == 0 else None,
        queue_wait_s=last_wait if evicted == 0 else None,
        last_admitted_at=admitted,
        last_wait_s=last_wait,
        evictions=evictions,
        requeues=requeues,
        last_eviction_reason=last_reason,
        last_evicted_at=ev[2] if ev and ev[0] else None,
        pending=admitted is None and when_true("Finished") is None,
    )


def merge(previous: AdmissionFacts | None, current: AdmissionFacts) -> AdmissionFacts:
    """The facts of a new reading, keeping what only an earlier reading could see.

    Kept from ``previous`` (of the same Workload): the first admission and its wait, the
    ClusterQueue that admitted it while the Workload waits again (``status.admission`` is cleared
    on eviction), the last eviction's reason and time, and counts that never go down (Kueue
    resets ``requeueState`` when a deactivated Workload is reactivated). Another Workload (a new
    uid: the job was re-created) starts afresh.
    """
    if previous is None or (previous.workload_uid and previous.workload_uid != current.workload_uid):
        return current
    evictions = dict(previous.evictions)
    for k, n in current.evictions.items():
        evictions[k] = max(evictions.get(k, 0), n)
    first = previous.admitted_at is not None
    return replace(
        current,
        cluster_queue=current.cluster_queue or previous.cluster_queue,
        quota_reserved_at=current.quota_reserved_at or previous.quota_reserved_at,
        admitted_at=previous.admitted_at if first else current.admitted_at,
        queue_wait_s=previous.queue_wait_s if first else current.queue_wait_s,
        last_admitted_at=current.last_admitted_at or previous.last_admitted_at,
        last_wait_s=current.last_wait_s if current.last_admitted_at else previous.last_wait_s,
        evictions=evictions,
        requeues=max(previous.requeues, current.requeues),
        last_eviction_reason=current.last_eviction_reason or previous.last_eviction_reason,
        last_evicted_at=current.last_evicted_at or previous.last_evicted_at,
    )


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation; None for no values.

    For the report's median and p90 of queue waits: a handful of jobs per team and week, so the
    interpolated value (numpy's default) reads better than a nearest-rank step.
    """
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def format_wait(seconds: float | None) -> str:
    """A queue wait for people: ``42 s``, ``12 min``, ``3.4 h`` (``–`` when unknown)."""
    if seconds is None:
        return "–"
    s = int(round(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{round(s / 60)} min"
    return f"{s / 3600:.1f} h"
