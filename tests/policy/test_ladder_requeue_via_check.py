"""The policy ladder's requeue through the efficiency gate's AdmissionCheck (issue 16 item 6), on
the test bed's real Kueue v0.17.0 (and v0.19.2: ``make test-kueue-newest``, issue 29).

The ladder (:class:`PolicyRunner`) is given the gate's requeue port as the operator wires it
(:func:`auditor.compose.check_requeue` on a running controller). A running Workload it requeues
while another waits in its ClusterQueue goes through the check's ``Retry``: Kueue evicts it, the
waiting job is admitted on the freed quota, and ours is re-admitted behind it; the action row,
the job's annotation and the Event say which path was used. With nobody waiting it keeps the
``spec.active`` path, and the row says why the check was not used.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from gate_objects import (
    check_state,
    cluster_queue,
    condition,
    events,
    gate_queue,
    gpu_job,
    is_true,
    job,
    running_gate,
    until,
    workload_of,
)
from kueue_objects import KV, kueue_running
from test_policy_testbed import T0, _summary

from auditor import compose
from auditor.actions import KubeActions
from auditor.core.identity import JobKey
from auditor.kube.client import call_json, resource_path
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RequeueSettings, RunnerConfig
from auditor.store import Store
from auditor.store.decisions import DecisionStore

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller"),
]

POLICY = """
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: low-sm}
spec:
  mode: enforce
  verdicts: [low_sm_efficiency]
  conditions:
    - {field: sm_active, op: "<=", value: 0.3}
  escalation:
    - actions: [event]
    - actions: [requeue]
      cooldown: 1m
  requeue: {backoff: 3s, maxPerJob: 1}
"""


@pytest.fixture
def store(tmp_path):
    s = Store.open(f"sqlite:///{tmp_path}/ladder.db")
    yield s
    s.close()


def _wl(api: Any, ns: str, name: str) -> dict:
    return call_json(api, resource_path(KV, "workloads", ns, name))


def _ladder(api: Any, store: Store, ns: str, ctl: Any) -> PolicyRunner:
    return PolicyRunner(
        parse_policies(POLICY, "p.yaml"),
        store,
        KubeActions(api, "test"),
        RunnerConfig(requeue=RequeueSettings(enabled=True, namespaces=frozenset({ns}))),
        # as the operator wires it: the gate's controller of this replica (compose.check_requeue)
        check_requeue=compose.check_requeue(SimpleNamespace(controller=ctl)),
    )


def _requeue_until_done(runner: PolicyRunner, summary: Any) -> dict:
    """Cycles a minute apart (the ladder's clock) until its requeue step has run; its result."""
    for minute in range(4):
        for d in runner.run_cycle([summary], now=T0 + timedelta(minutes=minute), act=True):
            if "requeue" in d.results:
                return d.results["requeue"]
    raise AssertionError("the ladder never reached its requeue step")


def _running(api: Any, ns: str, q: Any, name: str) -> tuple[dict, str]:
    """A one-GPU Job admitted through the gate's ClusterQueue: the Job and its Workload's name."""
    until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
    created = gpu_job(api, ns, name)
    wl = workload_of(api, ns, created)["metadata"]["name"]
    until(lambda: is_true(_wl(api, ns, wl), "Admitted"), f"{name} admitted")
    return created, wl


def _flagged(created: dict) -> Any:
    """The job's summary as an audit cycle flags it (3 % SM activity at 97 % utilization)."""
    name = created["metadata"]["name"]
    return _summary(
        created["metadata"]["namespace"],
        name,
        f"{name}-0",
        created["metadata"]["uid"],
        "low_sm_efficiency",
        0.97,
        0.03,
        queue="lq",
    )


def _requeue_row(store: Store, ns: str, name: str) -> Any:
    (row,) = [a for a in DecisionStore(store).actions(job=JobKey("default", ns, "Job", name)) if a.action == "requeue"]
    return row


def test_the_ladder_requeues_a_running_job_through_the_check_behind_a_waiting_one(kube_admin, namespace, store):
    api, ns = kube_admin, namespace
    with gate_queue(api, ns) as q, running_gate(api, store) as ctl:
        first_job, first = _running(api, ns, q, "bad")
        waiting = workload_of(api, ns, gpu_job(api, ns, "waiting"))["metadata"]["name"]
        until(lambda: condition(_wl(api, ns, waiting), "QuotaReserved").get("reason") == "Pending", "it waits")
        until(lambda: ctl.kube.pending_workloads(q.cluster_queue) == 1, "the ClusterQueue counts it pending")

        result = _requeue_until_done(_ladder(api, store, ns, ctl), _flagged(first_job))
        assert result["state"] == "done" and result["path"] == "admission-check", result
        assert (result["checks"], result["cluster_queue"], result["pending_workloads"]) == (
            [q.check],
            q.cluster_queue,
            1,
        )
        row = _requeue_row(store, ns, "bad")
        assert row.state == "done" and row.due_at is None  # nothing for the ladder to reactivate
        assert row.result["path"] == "admission-check" and row.result["backoff_s"] == 3
        assert job(api, ns, "bad")["metadata"]["annotations"]["gpu-auditor.io/requeue-path"] == (
            f"admission check {q.check}"
        )
        (ev,) = [e for e in events(api, ns, "bad") if e["reason"] == "GpuAuditorRequeue"]
        assert "through its admission check" in ev["note"] and q.cluster_queue in ev["note"]

        # Kueue evicts it through the check; the waiting job takes the quota
        until(lambda: is_true(_wl(api, ns, waiting), "Admitted"), "the waiting job admitted on the freed quota")
        wl = _wl(api, ns, first)
        assert not is_true(wl, "Admitted") and wl["spec"].get("active", True) is True  # never deactivated
        evictions = wl["status"]["schedulingStats"]["evictions"]
        assert [(e["reason"], e["count"]) for e in evictions] == [("AdmissionCheck", 1)], evictions
        # the backoff over, it waits behind the job now holding the quota, then is re-admitted after it
        until(lambda: condition(_wl(api, ns, first), "Requeued").get("reason") == "BackoffFinished", "backoff over")
        assert not is_true(_wl(api, ns, first), "QuotaReserved") and is_true(_wl(api, ns, waiting), "Admitted")
        call_json(
            api,
            resource_path("batch/v1", "jobs", ns, "waiting"),
            method="DELETE",
            query=[("propagationPolicy", "Background")],
        )
        wl = until(lambda: (w := _wl(api, ns, first)) and is_true(w, "Admitted") and w, "re-admitted behind it")
        assert check_state(wl, q.check)["state"] == "Ready"


def test_with_nobody_waiting_the_ladder_requeues_through_spec_active(kube_admin, namespace, store):
    api, ns = kube_admin, namespace
    with gate_queue(api, ns) as q, running_gate(api, store) as ctl:
        created, name = _running(api, ns, q, "bad")
        assert ctl.kube.pending_workloads(q.cluster_queue) == 0

        result = _requeue_until_done(_ladder(api, store, ns, ctl), _flagged(created))
        assert result["state"] == "waiting" and result["path"] == "spec.active", result
        assert result["admission_check_not_used"] == f"no Workload waits in ClusterQueue {q.cluster_queue}"
        row = _requeue_row(store, ns, "bad")
        assert row.state == "waiting" and row.result["path"] == "spec.active"
        wl = until(lambda: (w := _wl(api, ns, name)) and w["spec"].get("active") is False and w, "deactivated")
        # Kueue may already have dropped the check's entry from a deactivated Workload's status
        # (seen once in CI: KeyError 'state'); absent is "not Retry" too
        assert check_state(wl, q.check).get("state") != "Retry"
        assert "gpu-auditor.io/requeue-path" not in job(api, ns, "bad")["metadata"]["annotations"]
