"""The operator's requeue on the real Kueue controller of the test bed (issue 14, item 3), v0.17.0 and,
by ``make test-kueue-newest`` (issue 29), v0.19.2: the demotion test below is the one that shows the
``PriorityBoost`` gate at work.

A Job is admitted through real quota (ResourceFlavor → ClusterQueue with one GPU → LocalQueue),
flagged by an enforcing policy and requeued by the policy runner: Kueue evicts its Workload
(``Evicted`` / ``Deactivated``), suspends the Job, releases the quota once the Job has no active
pods, and after our backoff re-admits it. No kubelet or Job controller runs in the bed, so the test
plays the Job controller's part: it starts a pod when Kueue unsuspends the Job and removes it when
Kueue suspends it, updating ``status.active`` as that controller would.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any, Callable

import pytest
from kubernetes import client as k8s
from kubernetes import watch
from kueue_objects import (
    KV,
    delete_cluster_object,
    gpu_job,
    gpu_quota,
    job_controller_starts,
    job_controller_stops,
    job_workload,
    kueue_running,
    workload_priority_class,
)
from policy_receivers import Receiver
from test_policy_testbed import FAST, POLICY, SECRET, T0, _store_job, _summary

from auditor.actions import KubeActions
from auditor.core.action_target import ActionTarget
from auditor.core.identity import JobKey
from auditor.kube.client import call_json, resource_path
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RequeueSettings, Route, RunnerConfig
from auditor.store import Store
from auditor.store.decisions import DecisionStore

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(
        not kueue_running(), reason="the bed runs without the Kueue controller (GPU_AUDITOR_TESTBED_KUEUE=0)"
    ),
]


def _condition(wl: dict, kind: str) -> dict:
    return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def _is(wl: dict, kind: str, status: str = "True", reason: str | None = None) -> bool:
    c = _condition(wl, kind)
    return c.get("status") == status and (reason is None or c.get("reason") == reason)


class Timeline:
    """Every version of one Workload, from a watch: (seconds since start, its conditions)."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        self.t0 = time.monotonic()
        self.seen: list[tuple[float, dict]] = []
        self._w = watch.Watch()
        custom = k8s.CustomObjectsApi(api)

        def run() -> None:
            try:
                for ev in self._w.stream(
                    custom.list_namespaced_custom_object,
                    "kueue.x-k8s.io",
                    "v1beta2",
                    namespace,
                    "workloads",
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=300,
                ):
                    self.seen.append((time.monotonic() - self.t0, ev["object"]))
            except Exception:
                if not self._stopped:
                    raise

        self._stopped = False
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def wait(self, what: str, pred: Callable[[dict], bool], timeout: float = 60, after: float = 0.0) -> float:
        """Seconds since the timeline started when ``pred`` first held for a version seen at or
        after ``after``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, obj in list(self.seen):
                if t >= after and pred(obj):
                    return t
            time.sleep(0.05)
        last = self.seen[-1][1].get("status") if self.seen else None
        raise AssertionError(f"Workload never reached: {what}; last status {last}")

    def transitions(self) -> list[tuple[str, str, str]]:
        """(type, status, reason) of each condition change, in the order the watch saw them."""
        out: list[tuple[str, str, str]] = []
        last: dict[str, tuple[str, str]] = {}
        for _, obj in self.seen:
            for c in (obj.get("status") or {}).get("conditions") or []:
                now = (c["status"], c.get("reason", ""))
                if last.get(c["type"]) != now:
                    last[c["type"]] = now
                    out.append((c["type"], *now))
        return out

    def stop(self) -> None:
        self._stopped = True
        self._w.stop()


def _in_order(seq: list, wanted: list) -> bool:
    it = iter(seq)
    return all(any(x == w for x in it) for w in wanted)


@pytest.fixture
def quota(kube_admin, namespace):
    """One GPU of quota: ResourceFlavor → ClusterQueue (all namespaces) → LocalQueue ``lq``."""
    with gpu_quota(kube_admin, namespace) as cq:
        yield cq


def _requeue_row(store: Store, ns: str) -> Any:
    (row,) = [a for a in DecisionStore(store).actions(job=JobKey("default", ns, "Job", "bad")) if a.action == "requeue"]
    return row


def _job(api: Any, ns: str, name: str) -> dict:
    return call_json(api, resource_path("batch/v1", "jobs", ns, name))


def _reactivate_at(api: Any, ns: str) -> datetime:
    return datetime.fromisoformat(
        _job(api, ns, "bad")["metadata"]["annotations"]["gpu-auditor.io/reactivate-at"].replace("Z", "+00:00")
    )


def test_requeue_evicts_suspends_and_kueue_readmits_after_the_backoff(kube_admin, namespace, tmp_path, quota, capsys):
    api, ns = kube_admin, namespace
    job = gpu_job(api, ns, "bad")
    assert job["spec"]["suspend"] is True  # Kueue's webhook suspends a queued Job at creation
    wl = job_workload(api, ns, job)
    timeline = Timeline(api, ns, wl["metadata"]["name"])
    slack, hook = Receiver(), Receiver()
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    try:
        # 1. admitted through the ClusterQueue's quota; Kueue unsuspends the Job
        admitted = timeline.wait("admitted", lambda w: _is(w, "Admitted"))
        wl = timeline.seen[-1][1]
        assert wl["status"]["admission"]["clusterQueue"] == quota
        deadline = time.monotonic() + 30
        while _job(api, ns, "bad")["spec"]["suspend"]:
            assert time.monotonic() < deadline, "Kueue never unsuspended the admitted Job"
            time.sleep(0.1)
        job_controller_starts(api, ns, _job(api, ns, "bad"), "bad-0-abcde", T0)

        # 2. the policy runner escalates and requeues (its backoff 10 minutes of its clock)
        _store_job(store, ns, "bad", job["metadata"]["uid"], "bad-0-abcde", 0.97, 0.1)
        summary = _summary(ns, "bad", "bad-0-abcde", job["metadata"]["uid"], "low_sm_efficiency", 0.97, 0.1, queue="lq")
        runner = PolicyRunner(
            parse_policies(POLICY, "p.yaml"),
            store,
            KubeActions(api, "test"),
            RunnerConfig(
                routes={"ml": Route(slack_url=slack.url, webhook_url=hook.url, webhook_secret=SECRET)},
                requeue=RequeueSettings(enabled=True, namespaces=frozenset({ns})),
                retry=FAST,
            ),
        )
        minute = 0
        while call_json(api, resource_path(KV, "workloads", ns, wl["metadata"]["name"]))["spec"].get("active", True):
            assert minute < 8, "the runner never requeued the job"
            runner.run_cycle([summary], now=T0 + timedelta(minutes=minute), act=True)
            minute += 1
        requeued_minute = minute - 1
        requeued = timeline.wait("our patch (spec.active false)", lambda w: w["spec"].get("active") is False)
        assert _reactivate_at(api, ns) == T0 + timedelta(minutes=requeued_minute + 10)  # the earliest time

        # 3. Kueue evicts and suspends; the quota stays reserved while the Job still has an active pod
        evicted = timeline.wait("Evicted/Deactivated", lambda w: _is(w, "Evicted", reason="Deactivated"))
        deadline = time.monotonic() + 30
        while not _job(api, ns, "bad")["spec"]["suspend"]:
            assert time.monotonic() < deadline, "Kueue never suspended the evicted Job"
            time.sleep(0.05)
        suspended = timeline.now()
        time.sleep(1.0)
        current = call_json(api, resource_path(KV, "workloads", ns, wl["metadata"]["name"]))
        assert _is(current, "QuotaReserved"), "quota released while the Job still had an active pod"
        # a cycle now sees the quota still held: the backoff has not started
        runner.run_cycle([summary], now=T0 + timedelta(minutes=requeued_minute + 1), act=True)
        assert "quota_released_at" not in _requeue_row(store, ns).result
        stopped = timeline.now()
        job_controller_stops(api, ns, "bad", "bad-0-abcde")
        released = timeline.wait("quota released", lambda w: _is(w, "QuotaReserved", "False"))
        timeline.wait("Requeued=False/Deactivated", lambda w: _is(w, "Requeued", "False", "Deactivated"))

        # 4. our backoff (10 minutes) counts from the release the next cycle sees: not from our
        # patch; Kueue would not take the Workload back while it is inactive
        seen = T0 + timedelta(minutes=requeued_minute + 2)
        runner.run_cycle([summary], now=seen, act=True)
        row = _requeue_row(store, ns)
        assert row.result["quota_released_at"] == seen.isoformat() and row.due_at == seen + timedelta(minutes=10)
        assert _reactivate_at(api, ns) == seen + timedelta(minutes=10)  # the job's annotation follows the late release
        runner.run_cycle([summary], now=seen + timedelta(minutes=9), act=True)  # patch + backoff is past
        assert call_json(api, resource_path(KV, "workloads", ns, wl["metadata"]["name"]))["spec"]["active"] is False
        assert not _is(call_json(api, resource_path(KV, "workloads", ns, wl["metadata"]["name"])), "QuotaReserved")
        back = seen + timedelta(minutes=10, seconds=30)  # the first cycle after the due time
        runner.run_cycle([summary], now=back, act=True)
        assert _reactivate_at(api, ns) == back  # when it really went back
        reactivated = timeline.wait(
            "our patch (spec.active true)", lambda w: w["spec"].get("active") is True, after=released
        )
        readmitted = timeline.wait(
            "re-admitted", lambda w: _is(w, "Admitted") and _is(w, "Requeued", reason="Reactivated"), after=reactivated
        )
        deadline = time.monotonic() + 30
        while _job(api, ns, "bad")["spec"]["suspend"]:
            assert time.monotonic() < deadline, "Kueue never unsuspended the re-admitted Job"
            time.sleep(0.05)
        resumed = timeline.now()

        final = call_json(api, resource_path(KV, "workloads", ns, wl["metadata"]["name"]))
        assert final["spec"].get("priority", 0) == 0  # Kueue's own, untouched
        assert final["metadata"]["annotations"]["kueue.x-k8s.io/priority-boost"] == "-10"  # lowerPriorityBy 10
        evictions = final["status"].get("schedulingStats", {}).get("evictions", [])
        assert [(e["reason"], e["count"]) for e in evictions] == [("Deactivated", 1)], evictions
        steps = timeline.transitions()
        assert _in_order(
            steps,
            [
                ("QuotaReserved", "True", "QuotaReserved"),
                ("Admitted", "True", "Admitted"),
                ("Evicted", "True", "Deactivated"),
                ("QuotaReserved", "False", "Pending"),
                ("Admitted", "False", "NoReservation"),
                ("Requeued", "False", "Deactivated"),
                ("Requeued", "True", "Reactivated"),
                ("QuotaReserved", "True", "QuotaReserved"),
                ("Evicted", "False", "QuotaReserved"),
                ("Admitted", "True", "Admitted"),
            ],
        ), steps
        with capsys.disabled():
            print(
                f"\nkueue requeue timings (s, watch clock): admitted at {admitted:.3f}; our deactivation → "
                f"Evicted +{evicted - requeued:.3f}, Job suspended by +{suspended - requeued:.3f}; pods removed → "
                f"quota released +{released - stopped:.3f}; our reactivation → re-admitted "
                f"+{readmitted - reactivated:.3f}, Job unsuspended by +{resumed - reactivated:.3f}\n{steps}"
            )
    finally:
        timeline.stop()
        store.close()
        slack.close()
        hook.close()


def _workload_now(api: Any, ns: str, job: dict) -> dict:
    return call_json(api, resource_path(KV, "workloads", ns, job_workload(api, ns, job)["metadata"]["name"]))


def test_quota_is_real_and_a_deleted_jobs_workload_releases_it(kube_admin, namespace, quota):
    """One GPU of quota: the second Job waits; deleting the first (the garbage collector removes
    its Workload through the owner reference) lets Kueue admit the second."""
    api, ns = kube_admin, namespace
    first = gpu_job(api, ns, "first")
    deadline = time.monotonic() + 30
    while not _is(_workload_now(api, ns, first), "Admitted"):
        assert time.monotonic() < deadline, "the first Job was never admitted"
        time.sleep(0.1)
    second = gpu_job(api, ns, "second")
    deadline = time.monotonic() + 30
    while not _condition(_workload_now(api, ns, second), "QuotaReserved"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    waiting = _condition(_workload_now(api, ns, second), "QuotaReserved")
    assert (waiting["status"], waiting["reason"]) == ("False", "Pending") and "insufficient" in waiting["message"], (
        waiting
    )
    assert _job(api, ns, "second")["spec"]["suspend"] is True
    first_wl = job_workload(api, ns, first)["metadata"]["name"]
    call_json(
        api,
        resource_path("batch/v1", "jobs", ns, "first"),
        method="DELETE",
        query=[("propagationPolicy", "Background")],
    )
    deadline = time.monotonic() + 60
    while not _is(_workload_now(api, ns, second), "Admitted"):
        assert time.monotonic() < deadline, "the second Job was never admitted after the first was deleted"
        time.sleep(0.2)
    items = call_json(api, resource_path(KV, "workloads", ns))["items"]
    assert first_wl not in {w["metadata"]["name"] for w in items}  # collected with its Job
    assert _workload_now(api, ns, second)["status"]["admission"]["clusterQueue"] == quota


def test_a_demoted_job_is_admitted_after_a_competing_one(kube_admin, namespace, quota):
    """Kueue orders pending Workloads by effective priority (spec.priority plus the
    ``kueue.x-k8s.io/priority-boost`` annotation, PriorityBoost gate on), then age: a requeue that
    lowers it (KubeActions.deactivate's ``lower_priority_by``, as ``requeue.lowerPriorityBy``
    does) puts an older job behind a newer one of the class it had, while the Workload's
    ``spec.priority`` stays what its WorkloadPriorityClass gives."""
    api, ns = kube_admin, namespace
    wpc = f"train-{uuid.uuid4().hex[:8]}"
    workload_priority_class(api, wpc, 100)
    try:
        blocker = gpu_job(api, ns, "blocker")
        deadline = time.monotonic() + 30
        while not _is(_workload_now(api, ns, blocker), "Admitted"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        older = gpu_job(api, ns, "older", priority_class=wpc)
        time.sleep(1.1)  # creation timestamps have one-second resolution
        newer = gpu_job(api, ns, "newer", priority_class=wpc)
        for job in (older, newer):
            assert _workload_now(api, ns, job)["spec"]["priority"] == 100
        actions = KubeActions(api, "test")
        target = actions.requeue_target(ActionTarget(key=JobKey("default", ns, "Job", "older")))
        demoted = actions.deactivate(target, lower_priority_by=10)
        assert (demoted["new_priority_boost"], demoted["effective_priority"]) == (-10, 90)
        actions.reactivate(target)
        wl = _workload_now(api, ns, older)
        assert wl["spec"]["priority"] == 100 and wl["spec"]["active"] is True
        assert wl["metadata"]["annotations"]["kueue.x-k8s.io/priority-boost"] == "-10"
        call_json(
            api,
            resource_path("batch/v1", "jobs", ns, "blocker"),
            method="DELETE",
            query=[("propagationPolicy", "Background")],
        )
        deadline = time.monotonic() + 60
        while not _is(_workload_now(api, ns, newer), "Admitted"):
            assert time.monotonic() < deadline, "the newer Job was never admitted"
            assert not _is(_workload_now(api, ns, older), "Admitted"), "the demoted Job went first"
            time.sleep(0.1)
        assert not _is(_workload_now(api, ns, older), "QuotaReserved")
        assert _job(api, ns, "older")["spec"]["suspend"] is True
    finally:
        delete_cluster_object(api, "workloadpriorityclasses", wpc)
