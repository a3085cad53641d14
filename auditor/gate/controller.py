"""The AdmissionCheck controller: watches, a small work queue, the release sweep.

Two reconcilers, as Kueue's guide for external check controllers asks: one keeps each of our
AdmissionChecks (``spec.controllerName: gpu-auditor.io/efficiency-gate``) ``Active``; one answers
our ``Pending`` check on every Workload that holds quota (Kueue adds the check only for the flavors
its ClusterQueue's ``admissionChecksStrategy`` names). A third loop, the sweep, releases what the
gate held once its lineage is acknowledged: it removes our admission gate from gated Jobs and
deletes the Workloads the check rejected (Kueue recreates them from the suspended Job; re-activating
them sticks on Kueue v0.17), and drops released lineages from the holds.

The operator runs it on the leader only (:meth:`start` on leadership, :meth:`stop` on its loss).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from kubernetes import client

from auditor.core.action_target import ActionTarget
from auditor.core.lineage import LineageKey, lineage_of_object
from auditor.core.rfc3339 import parse_rfc3339
from auditor.errors import AuditorError
from auditor.gate.admission import READY, REJECTED, RETRY, AdmissionGate, Verdict, ack_hint, lineage_name
from auditor.gate.holds import HOLD, PROBATION, HoldList
from auditor.gate.kueue import (
    GATE_DECISION,
    GATE_REJECTED,
    GATE_RELEASED,
    GATED_BY,
    HOLD_REASON,
    KV,
    OUR_GATE,
    KueueGateApi,
    WorkloadView,
    rfc3339,
)
from auditor.kube.client import server_clock_offset
from auditor.kube.informer import Informer

log = logging.getLogger(__name__)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class ControllerConfig:
    """Where the controller keeps its holds and how often it sweeps."""

    cluster: str = "default"
    #: the GateHolds object (read by the chart's MutatingAdmissionPolicy); no namespace: no gated path
    holds_namespace: str | None = None
    holds_name: str = "gpu-auditor-holds"
    sweep_interval: float = 5.0
    workers: int = 8


@dataclass(frozen=True)
class Decided:
    """One answered check, for metrics and the latency benchmark."""

    namespace: str
    workload: str
    lineage: str
    state: str
    would: str
    failure: str | None
    #: the store read and decision
    decide_seconds: float
    #: from our watch seeing the Workload hold quota to the check state written
    seconds: float
    #: the server-side apply of the check state alone
    write_seconds: float = 0.0
    #: from our watch seeing the Workload to a worker taking it up (the work queue's wait)
    queued_seconds: float = 0.0
    #: the owner Job read from the API server (not in our Jobs cache yet, or gated: read fresh)
    owner_read: bool = False
    #: ``time.monotonic()`` when the check state was written (the benchmark lines it up with a watch)
    wrote_at: float = 0.0


#: Kueue writes a condition's lastTransitionTime in whole seconds, and its clock is not ours
_CLOCK_SLACK = timedelta(seconds=2)
#: a Workload whose answer failed (the API refused the write) is tried again, at most this far apart
_RETRY_MAX = 10.0


#: a requeue whose backoff lost the race with Kueue's re-admission is evicted again, this often in all
_REQUEUE_TRIES = 3


@dataclass
class _Requeue:
    """A Workload being requeued through the check: evicted by ``Retry``, then given its backoff."""

    message: str
    backoff: int
    tries: int = 1
    backed_off: bool = False


def _gates(job: Mapping[str, Any]) -> list[str]:
    ann = (job.get("metadata") or {}).get("annotations") or {}
    return [g.strip() for g in str(ann.get(GATED_BY) or "").split(",") if g.strip()]


def _json(raw: Any) -> dict:
    try:
        out = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def held_by_check(job: Mapping[str, Any]) -> str | None:
    """The Workload the check rejected for this Job and not yet released (None: none)."""
    ann = (job.get("metadata") or {}).get("annotations") or {}
    rejected = _json(ann.get(GATE_REJECTED)).get("workload")
    if rejected and rejected != _json(ann.get(GATE_RELEASED)).get("workload"):
        return str(rejected)
    return None


def gated(job: Mapping[str, Any]) -> bool:
    return OUR_GATE in _gates(job)


def _queued_job(job: dict) -> dict | None:
    """What the gate keeps of a batch Job: Kueue-queued ones only, their metadata only."""
    meta = job.get("metadata") or {}
    if "kueue.x-k8s.io/queue-name" not in (meta.get("labels") or {}):
        return None
    keep = ("name", "namespace", "uid", "labels", "annotations", "ownerReferences", "generateName")
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {k: meta[k] for k in keep if k in meta}}


class GateController:
    """Runs the gate on one cluster through ``api`` with the admission use-case ``gate``."""

    def __init__(
        self,
        api: client.ApiClient,
        gate: AdmissionGate,
        config: ControllerConfig = ControllerConfig(),
        *,
        clock: Callable[[], datetime] = _utc_now,
        instance: str = "gpu-auditor",
        on_decided: Callable[[Decided], None] | None = None,
    ) -> None:
        self.api = api
        self.gate = gate
        self.config = config
        self.clock = clock
        self.kube = KueueGateApi(api, instance)
        self.holds = HoldList(api, config.holds_namespace, config.holds_name) if config.holds_namespace else None
        self.on_decided = on_decided
        self.decided: deque[Decided] = deque(maxlen=10000)
        self._checks: dict[str, dict] = {}
        self._latest: dict[str, tuple[dict, float]] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: when this controller started answering: a check that was due before it was missed
        self.started_at: datetime | None = None
        #: the API server's clock minus ours (:func:`server_clock_offset`), read at start: Kueue's
        #: timestamps are compared on the control plane's clock, whatever ours says
        self.clock_offset = timedelta(0)
        self._attempts: dict[str, int] = {}
        self._requeues: dict[str, _Requeue] = {}
        #: Workload → the resourceVersion our last answer produced: older versions (a watch event in
        #: flight when we wrote) still show the check Pending and are not answered twice
        self._answered: dict[str, int] = {}
        self._checks_informer = Informer(api, KV, "admissionchecks", self._on_check, name="gate-admissionchecks")
        self._workloads: Informer[None] = Informer(api, KV, "workloads", self._on_workload, name="gate-workloads")
        #: Kueue-queued batch Jobs, slimmed: the owner of a Workload is read here, not from the API
        self._jobs = Informer(api, "batch/v1", "jobs", _queued_job, name="gate-jobs")
        # telling the owner (annotation, Event) comes after the check state, off its path
        self._tell = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gate-tell")
        self._tell.shutdown()

    # ------------------------------------------------------------------ lifecycle

    def start(self, sync_timeout: float = 30.0) -> "GateController":
        self._stop.clear()
        self.started_at = self.clock()
        self.clock_offset = server_clock_offset(self.api, self.clock)
        if abs(self.clock_offset) > _CLOCK_SLACK:
            log.warning(
                "gate: this clock is %.1f s %s the API server's; Kueue's times are compared on the server's",
                abs(self.clock_offset.total_seconds()),
                "behind" if self.clock_offset > timedelta(0) else "ahead of",
            )
        self._tell = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gate-tell")
        self._checks_informer.start()
        if not self._checks_informer.wait_synced(sync_timeout):
            log.warning("gate: AdmissionChecks not listed after %.0f s", sync_timeout)
        for i in range(self.config.workers):
            t = threading.Thread(target=self._work, name=f"gate-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._workloads.start()
        self._jobs.start()
        t = threading.Thread(target=self._sweep_loop, name="gate-sweep", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def wait_synced(self, timeout: float = 30.0) -> bool:
        return all(i.wait_synced(timeout) for i in (self._checks_informer, self._workloads, self._jobs))

    def stop(self) -> None:
        self._stop.set()
        for i in (self._workloads, self._jobs, self._checks_informer):
            i.stop()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
        self._tell.shutdown(wait=True, cancel_futures=True)

    @property
    def check_names(self) -> set[str]:
        with self._lock:
            return set(self._checks)

    # ------------------------------------------------------------------ AdmissionChecks

    def _on_check(self, obj: dict) -> dict | None:
        name = (obj.get("metadata") or {}).get("name")
        ours = self.kube.our_checks([obj])
        with self._lock:
            if not ours:
                self._checks.pop(str(name), None)
                return None
            self._checks[str(name)] = obj
        try:
            if self.kube.ensure_active(obj, self.clock() + self.clock_offset):
                log.info("gate: AdmissionCheck %s set Active", name)
        except Exception as exc:  # noqa: BLE001 - the next watch event or relist retries
            log.warning("gate: %s", exc)
        return obj

    # ------------------------------------------------------------------ Workloads

    def _ours_pending(self, view: WorkloadView) -> list[str]:
        names = self.check_names
        return [n for n, c in view.checks.items() if n in names and c.get("state") == "Pending"]

    def _backing_off(self, key: str, view: WorkloadView) -> _Requeue | None:
        """The requeue to give its backoff now: Kueue is evicting the Workload (our ``Retry``), or
        has already taken its quota back (the backoff then keeps it waiting, holding nothing)."""
        with self._lock:
            rq = self._requeues.get(key)
        if rq is None or rq.backed_off or not (view.evicted or not view.quota_reserved):
            return None
        return rq if any(n in self.check_names for n in view.checks) else None

    def _stale(self, key: str, obj: Mapping[str, Any]) -> bool:
        try:
            return int((obj.get("metadata") or {}).get("resourceVersion") or 0) <= self._answered.get(key, 0)
        except ValueError:  # an opaque resourceVersion: answer, twice at worst
            return False

    def _on_workload(self, obj: dict) -> None:
        view = WorkloadView.parse(obj)
        key = f"{view.namespace}/{view.name}"
        if self._stale(key, obj):
            return None
        if self._backing_off(key, view) or (view.answerable and self._ours_pending(view)):
            with self._lock:
                fresh = key not in self._latest
                seen = self._latest[key][1] if not fresh else time.monotonic()
                self._latest[key] = (obj, seen)
            if fresh:
                self._queue.put(key)
        return None  # nothing cached: each event is handled as it comes

    def _work(self) -> None:
        while not self._stop.is_set():
            key = self._queue.get()
            if key is None or self._stop.is_set():
                return
            with self._lock:
                obj, seen = self._latest.pop(key, ({}, 0.0))
            if not obj:
                continue
            try:
                self.reconcile(obj, seen=seen)
                self._attempts.pop(key, None)
            except Exception as exc:
                log.warning("gate: Workload %s: %s", key, exc, exc_info=not isinstance(exc, AuditorError))
                self._retry_later(key, seen)

    def _retry_later(self, key: str, seen: float) -> None:
        """A check left Pending holds quota, and no watch event may come to answer it again: try the
        Workload again (read fresh), backing off up to ``_RETRY_MAX`` seconds, until it is answered
        or gone."""
        n = self._attempts.get(key, 0) + 1
        self._attempts[key] = n
        timer = threading.Timer(min(0.5 * 2 ** (n - 1), _RETRY_MAX), self._retry, (key, seen))
        timer.daemon = True
        timer.start()

    def _retry(self, key: str, seen: float) -> None:
        if self._stop.is_set():
            return
        namespace, _, name = key.partition("/")
        try:
            obj = self.kube.workload(namespace, name)
        except AuditorError as exc:
            log.warning("gate: Workload %s: %s", key, exc)
            self._retry_later(key, seen)
            return
        if obj is None:
            self._attempts.pop(key, None)
            return
        with self._lock:
            fresh = key not in self._latest
            if fresh:
                self._latest[key] = (obj, seen)
        if fresh:
            self._queue.put(key)

    def reconcile(self, obj: Mapping[str, Any], *, seen: float | None = None) -> Verdict | None:
        """Answer our pending checks on one Workload (None when there is nothing to answer)."""
        began = time.monotonic()
        seen = began if seen is None else seen
        view = WorkloadView.parse(obj)
        wkey = f"{view.namespace}/{view.name}"
        rq = self._backing_off(wkey, view)
        if rq is not None:
            self._back_off(view, rq)
            return None
        pending = self._ours_pending(view)
        if not (view.answerable and pending) or self._stale(wkey, obj):
            return None
        with self._lock:
            rq = self._requeues.pop(wkey, None)
        if rq is not None and not rq.backed_off:
            if rq.tries < _REQUEUE_TRIES:
                # Kueue re-reserved quota before the backoff was written: evict it again
                rq.tries += 1
                with self._lock:
                    self._requeues[wkey] = rq
                self._write_retry(view, pending, rq.message, 0)
                return None
            log.warning("gate: the requeue of %s lost to Kueue's re-admission %d times; admitted", wkey, rq.tries)
        now = self.clock()
        owner = self._jobs.get(f"{view.namespace}/{view.owner_name}") if view.owner_kind == "Job" else None
        stale = owner is None or owner["metadata"].get("uid") != view.owner_uid
        # a gated Job's annotations decide whether its owner acknowledged: read them fresh
        owner_read = stale or HOLD_REASON in (owner or {}).get("metadata", {}).get("annotations", {})
        if owner_read:
            owner = self.kube.owner(view)
        if owner is None:
            log.info("gate: Workload %s/%s has no owner we can read; not answering", view.namespace, view.name)
            return None
        key = lineage_of_object(owner, cluster=self.config.cluster)
        self._owner_acknowledged(owner, key, now)
        missed = None if self.gate.settings.fail_closed else self._missed(view, now)
        verdict = self.gate.undecided(key, missed) if missed else self.gate.verdict(key, now)
        ltt = rfc3339(now + self.clock_offset)  # Kueue reads check times on the control plane's clock
        states = {n: {"state": verdict.state, "message": verdict.message, "lastTransitionTime": ltt} for n in pending}
        t_write = time.monotonic()
        written = self.kube.write_checks(view, states)
        wrote = time.monotonic()
        self._remember_answer(wkey, written)
        done = Decided(
            view.namespace,
            view.name,
            str(key),
            verdict.state,
            verdict.would,
            verdict.failure,
            verdict.seconds,
            wrote - seen,
            wrote - t_write,
            began - seen,
            owner_read,
            wrote,
        )
        self.decided.append(done)
        if self.on_decided is not None:
            self.on_decided(done)
        if self._stop.is_set():
            return verdict
        self._tell.submit(self._after, view, key, verdict, now)
        return verdict

    def _remember_answer(self, key: str, written: Mapping[str, Any]) -> None:
        try:
            rv = int((written.get("metadata") or {}).get("resourceVersion") or 0)
        except ValueError:
            return
        with self._lock:
            if len(self._answered) > 50000:  # finished Workloads are not removed one by one
                self._answered.clear()
            self._answered[key] = rv

    def _missed(self, view: WorkloadView, now: datetime) -> str | None:
        """Why the deadline passed without us, when it did: the Workload reserved quota while no
        gate was running (the operator down, or between leaders) more than ``gate.timeout`` ago.
        Kueue has no deadline of its own for a Pending check, so the gate applies its own on its
        return, as a timeout would have: fail-open admits at once, without a decision. (Fail-closed
        decides as usual: rejecting now would only delay a decision the store can give.)"""
        try:
            reserved = parse_rfc3339(view.quota_reserved_at)
        except ValueError:
            return None
        if self.started_at is None or reserved + _CLOCK_SLACK >= self.started_at + self.clock_offset:
            return None  # reserved while we ran: decided, however late the watch delivered it
        waited = (now + self.clock_offset - reserved).total_seconds()
        if waited <= self.gate.settings.timeout:
            return None
        return (
            f"the gate was not running when the Workload reserved quota ({rfc3339(reserved)}, {waited:.0f} s before "
            f"this answer; gate.timeout {self.gate.settings.timeout:g} s)"
        )

    def _after(self, view: WorkloadView, key: LineageKey, verdict: Verdict, now: datetime) -> None:
        self._tell_owner(view, key, verdict, now)
        self._list_hold(key, verdict)

    def _owner_acknowledged(self, owner: Mapping[str, Any], key: LineageKey, now: datetime) -> None:
        """The owner removed our admission gate from a Job the policy gated: that is their ack."""
        meta = owner.get("metadata") or {}
        ann = meta.get("annotations") or {}
        if HOLD_REASON in ann and not gated(owner) and GATE_RELEASED not in ann:
            by = "the Job's owner (removed the admission gate)"
            what = f"removed {GATED_BY} from {owner.get('kind', 'Job')} {meta.get('namespace')}/{meta.get('name')}"
            try:
                self.gate.acknowledge(key, by=by, reason=what, now=now)
                log.info("gate: %s acknowledged: %s", lineage_name(key), what)
            except Exception as exc:  # noqa: BLE001 - the decision below still runs (and says why)
                log.warning("gate: could not record the acknowledgement of %s: %s", lineage_name(key), exc)

    def _tell_owner(self, view: WorkloadView, key: LineageKey, verdict: Verdict, now: datetime) -> None:
        """Our own Event and annotation: Kueue replaces a Rejected check's message with its own."""
        decision = {
            "state": verdict.state,
            "would": verdict.would,
            "lineage": str(key),
            "message": verdict.message,
            "workload": view.name,
            "decided_at": now.isoformat(),
            "decide_seconds": round(verdict.seconds, 4),
        }
        if verdict.failure:
            decision["failure"] = verdict.failure
        ann: dict[str, Any] = {GATE_DECISION: decision}
        if verdict.state == REJECTED:
            ann[GATE_REJECTED] = {
                "workload": view.name,
                "lineage": str(key),
                "reason": verdict.message,
                "how": ack_hint(key),
                "at": now.isoformat(),
            }
        if verdict.failure:
            reason = "EfficiencyGateFailClosed" if verdict.state == REJECTED else "EfficiencyGateFailOpen"
        elif verdict.state == REJECTED:
            reason = "EfficiencyGateHeld"
        elif (
            verdict.would in ("hold", "admit-deprioritized")
            and verdict.decision
            and verdict.would != verdict.decision.action
        ):
            reason = "EfficiencyGateWouldHold" if verdict.would == "hold" else "EfficiencyGateWouldDeprioritize"
        elif verdict.probation:
            reason = "EfficiencyGateProbation"
        else:
            reason = "EfficiencyGateAdmitted"
        try:
            self.kube.annotate(view, ann)
            self.kube.event(
                view,
                key=f"gate/{view.uid}/{verdict.state}",
                reason=reason,
                note=verdict.message,
                now=now,
                warning=reason != "EfficiencyGateAdmitted",
            )
        except Exception as exc:  # noqa: BLE001 - the check state is written; telling is best effort
            log.warning("gate: could not annotate or record an Event on %s: %s", view.job["job"], exc)

    def _list_hold(self, key: LineageKey, verdict: Verdict) -> None:
        """Enforce's holds and probations go into the holds, so the next submission is gated
        before it takes quota (or gets the probation priority class)."""
        if self.holds is None or verdict.decision is None or self.gate.settings.mode != "enforce":
            return
        kind = HOLD if verdict.hold else PROBATION if verdict.probation else None
        if kind is None:
            return
        try:
            self.holds.set(key, kind, verdict.decision.reason)
        except Exception as exc:  # noqa: BLE001 - the check path still holds this submission
            log.warning("gate: could not list %s in the gate's holds: %s", lineage_name(key), exc)

    # ------------------------------------------------------------------ requeue through the check

    def requeue(
        self,
        namespace: str,
        workload: str,
        message: str,
        now: datetime | None = None,
        *,
        backoff: int = 10,
        current: Mapping[str, Any] | None = None,
    ) -> dict | None:
        """Requeue an admitted Workload through our check, behind the Workloads waiting for its quota.

        Two writes, because of how Kueue v0.17 treats ``Retry`` (measured on the bed, and in its
        workload controller): ``Retry`` without delay evicts at once but requeues at once too, and the
        requeued Workload takes the freed quota back before a waiting one (parked as inadmissible) is
        looked at again; ``Retry`` with ``requeueAfterSeconds`` on an admitted Workload delays the
        eviction itself (the Workload keeps its quota until the time is up). So: ``Retry`` without
        delay now, and as soon as Kueue marks the Workload ``Evicted`` (its quota not yet released),
        ``Retry`` with ``requeueAfterSeconds: backoff``: Kueue then releases the quota and keeps the
        Workload out of the queue for ``backoff`` seconds (``Requeued=False``,
        ``status.requeueState.requeueAt``), the waiting Workload is admitted, and ours is queued
        behind it (queue order: its eviction time). ``backoff`` 0: the plain ``Retry``. Kueue counts
        the retry (``retryCount``). None when no check of ours is on the Workload, or it is not
        admitted (the caller then uses the ``spec.active`` path). ``current``: the Workload as just
        read by the caller (else it is read here)."""
        obj = current if current is not None else self.kube.workload(namespace, workload)
        if obj is None:
            return None
        view = WorkloadView.parse(obj)
        ours = [n for n in view.checks if n in self.check_names]
        if not ours or not view.admitted or view.finished:
            return None
        if backoff > 0:
            with self._lock:
                self._requeues[f"{namespace}/{workload}"] = _Requeue(message, backoff)
        self._write_retry(view, ours, message, 0, now)
        return {
            "type": "workload-check",
            "namespace": namespace,
            "name": workload,
            "checks": ours,
            "state": RETRY,
            "backoff_s": backoff,
        }

    def _back_off(self, view: WorkloadView, rq: _Requeue) -> None:
        ours = [n for n in view.checks if n in self.check_names]
        self._write_retry(view, ours, rq.message, rq.backoff)
        rq.backed_off = True
        log.info(
            "gate: %s/%s evicted for its requeue; back in the queue in %d s", view.namespace, view.name, rq.backoff
        )

    def _write_retry(
        self, view: WorkloadView, checks: list[str], message: str, after: int, now: datetime | None = None
    ) -> None:
        # Kueue evicts at lastTransitionTime + requeueAfterSeconds on its own clock
        at = rfc3339((now or self.clock()) + self.clock_offset)
        entry = {"state": RETRY, "message": message[:32768], "lastTransitionTime": at, "requeueAfterSeconds": after}
        self.kube.write_checks(view, {n: entry for n in checks})

    # ------------------------------------------------------------------ the release sweep

    def held_jobs(self) -> list[dict]:
        return [j for j in self._jobs.items().values() if gated(j) or held_by_check(j)]

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.config.sweep_interval):
            try:
                self.sweep(self.clock())
            except Exception as exc:  # noqa: BLE001 - the next sweep retries
                log.warning("gate sweep: %s", exc)

    def sweep(self, now: datetime, jobs: list[dict] | None = None) -> list[str]:
        """Release every held Job whose lineage the gate now admits (acknowledged, or the store
        answering again after a fail-closed rejection); drop released lineages from the holds
        list. Returns what it released (``Kind ns/name``)."""
        verdicts: dict[LineageKey, Verdict] = {}

        def verdict(key: LineageKey) -> Verdict:
            if key not in verdicts:
                verdicts[key] = self.gate.verdict(key, now)
            return verdicts[key]

        released: list[str] = []
        for job in self.held_jobs() if jobs is None else jobs:
            key = lineage_of_object(job, cluster=self.config.cluster)
            v = verdict(key)
            if v.decision is None or v.state != READY:
                continue  # still held, or no answer: a hold is never released on a failure
            if self._release(job, key, v, now):
                meta = job["metadata"]
                released.append(f"{job.get('kind', 'Job')} {meta['namespace']}/{meta['name']}")
        if self.holds is not None:
            for entry, value in self.holds.read().items():
                namespace, _, lineage = entry.partition(".")
                if not lineage:
                    continue
                v = verdict(LineageKey(self.config.cluster, namespace, lineage))
                if v.decision is None:
                    continue
                kind = HOLD if v.hold else PROBATION if v.probation else None
                if kind is None:
                    self.holds.remove(entry)
                elif not value.startswith(kind):
                    self.holds.set(v.key, kind, v.decision.reason)
        return released

    def _still_held(self, view: WorkloadView) -> bool:
        """Rejected by our check and not re-admitted: deactivated by Kueue (it had quota), or, when
        rejected while queued, kept out of admission by the Rejected state (Kueue deactivates only
        Workloads holding quota). Deleting it lets Kueue recreate it from the suspended Job."""
        ours = [c for n, c in view.checks.items() if n in self.check_names]
        return not view.active or (not view.quota_reserved and any(c.get("state") == REJECTED for c in ours))

    def _release(self, job: dict, key: LineageKey, v: Verdict, now: datetime) -> bool:
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        summary = {"namespace": ns, "job": f"{job.get('kind', 'Job')}/{name}"}
        note = f"gpu-auditor: released, {v.decision.reason if v.decision else v.message}"
        done = False
        if gated(job):
            done = self.kube.ungate(job, released=json.dumps({"at": now.isoformat(), "lineage": str(key)}))
        workload = held_by_check(job)
        if workload:
            for wl in self.kube.workloads_of(ns, str(meta.get("uid") or "")):
                if wl["metadata"]["name"] == workload and self._still_held(WorkloadView.parse(wl)):
                    self.kube.delete_workload(ns, workload)
            self.kube.actions.annotate(
                ActionTarget.of_ref(summary),
                {GATE_RELEASED: json.dumps({"workload": workload, "at": now.isoformat(), "lineage": str(key)})},
            )
            done = True
        if done:
            log.info("gate: released %s/%s (%s)", ns, name, lineage_name(key))
            try:
                self.kube.actions.event(
                    ActionTarget.of_ref(summary),
                    key=f"gate-release/{meta.get('uid')}/{workload or 'gated'}",
                    reason="EfficiencyGateReleased",
                    note=note,
                    action="AdmissionCheck",
                    now=now,
                    type_="Normal",
                )
            except Exception as exc:  # noqa: BLE001 - released either way
                log.warning("gate: no Event for the release of %s/%s: %s", ns, name, exc)
        return done
