"""The efficiency gate's AdmissionCheck controller on the test bed's real Kueue (v0.17.0; ``make
test-kueue-newest`` runs this file again on v0.19.2, the newest the Go module proxy serves).

A ClusterQueue runs the gate's AdmissionCheck on its GPU flavor (``onFlavors``); the controller
(auditor/gate) runs against a real store (SQLite file, PostgreSQL for the store-failure cases)
whose lineage history is what earlier audit cycles would have recorded. No kubelet or Job
controller runs in the bed: a Job Kueue admits is unsuspended and has no pods, which is all the
gate needs to be seen at work.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Iterator

import pytest
from gate_objects import (
    check_state,
    cluster_queue,
    condition,
    events,
    gate_queue,
    gpu_job,
    holds_of,
    is_true,
    job,
    record_runs,
    running_gate,
    until,
    workload_of,
)
from kueue_objects import KV, kueue_running

from auditor.core.lineage import LineageKey
from auditor.gate.kueue import GATE_DECISION, GATE_REJECTED, GATED_BY, HOLD_REASON, OUR_GATE
from auditor.kube.client import call_json, resource_path
from auditor.store import Store
from auditor.store.lineage import AckLog

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller"),
]

FLAGGED = ["low_sm_efficiency", "low_sm_efficiency", "healthy", "low_sm_efficiency"]


def _now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def store(tmp_path):
    s = Store.open(f"sqlite:///{tmp_path}/gate.db")
    yield s
    s.close()


def _wl(api, ns, name):
    return call_json(api, resource_path(KV, "workloads", ns, name))


def _decision(ctl, workload: str):
    """The gate's decision on one Workload. Kueue v0.19.2 now and then sets an answered check back
    to Pending within ~30 ms (its admission status apply carries every check's state as its cache
    saw it; 3 of 24 runs of the clock test below, none of 12 on v0.17.0), and the gate answers again:
    every answer must then be the same decision (issue 29)."""
    answers = [d for d in ctl.decided if d.workload == workload]
    assert answers and len({(d.state, d.would, bool(d.failure)) for d in answers}) == 1, answers
    return answers[0]


def _reasons(api, ns, name):
    return {e.get("reason") for e in events(api, ns, name)}


def test_the_check_becomes_active_and_a_clean_lineage_is_admitted_at_once(kube_admin, namespace, store):
    api, ns = kube_admin, namespace
    with gate_queue(api, ns) as q:
        inactive = until(lambda: condition(cluster_queue(api, q.cluster_queue), "Active"), "the CQ's Active condition")
        assert inactive["status"] == "False" and "inactive AdmissionCheck" in inactive["message"], inactive
        with running_gate(api, store) as ctl:
            check = until(
                lambda: (
                    is_true(call_json(api, resource_path(KV, "admissionchecks", None, q.check)), "Active")
                    and call_json(api, resource_path(KV, "admissionchecks", None, q.check))
                ),
                "the AdmissionCheck Active",
            )
            assert condition(check, "Active")["reason"] == "Active"
            until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")

            created = gpu_job(api, ns, "clean-7f9c2")
            wl = workload_of(api, ns, created)
            wl = until(lambda: (w := _wl(api, ns, wl["metadata"]["name"])) and is_true(w, "Admitted") and w, "Admitted")
            state = check_state(wl, q.check)
            assert state["state"] == "Ready" and state["message"].startswith("gpu-auditor: admitted, lineage")
            assert "no gate rule fires" in state["message"]
            until(lambda: job(api, ns, "clean-7f9c2")["spec"]["suspend"] is False, "Kueue unsuspends the Job")
            decided = until(
                lambda: json.loads(
                    job(api, ns, "clean-7f9c2")["metadata"].get("annotations", {}).get(GATE_DECISION, "{}")
                ),
                "the decision annotation",
            )
            assert (
                decided["state"] == "Ready"
                and decided["lineage"] == f"{ns}/clean"
                and decided["workload"] == wl["metadata"]["name"]
            )
            assert 0 <= decided["decide_seconds"] < 2
            d = _decision(ctl, wl["metadata"]["name"])
            assert d.state == "Ready" and 0 < d.seconds < 5 and d.decide_seconds <= d.seconds

            # the check runs on the GPU flavor only: a CPU job is admitted without it
            cpu = gpu_job(api, ns, "cpu-only", cpu=True)
            cwl = workload_of(api, ns, cpu)
            cwl = until(
                lambda: (w := _wl(api, ns, cwl["metadata"]["name"])) and is_true(w, "Admitted") and w, "CPU Admitted"
            )
            assert check_state(cwl, q.check) == {}
            assert [x for x in ctl.decided if x.workload == cwl["metadata"]["name"]] == []


def test_observe_admits_a_flagged_lineage_and_says_it_would_hold(kube_admin, namespace, store):
    api, ns = kube_admin, namespace
    record_runs(store, LineageKey("default", ns, "train"), FLAGGED, _now())
    with gate_queue(api, ns) as q, running_gate(api, store, mode="observe"):
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        wl = workload_of(api, ns, gpu_job(api, ns, "train-x2kq9", lineage="train"))
        wl = until(lambda: (w := _wl(api, ns, wl["metadata"]["name"])) and is_true(w, "Admitted") and w, "Admitted")
        msg = check_state(wl, q.check)["message"]
        assert msg.startswith("gpu-auditor (observe mode): admitted; enforce would hold: would hold until acknowledged")
        assert f"acknowledge with `gpu-auditor ack {ns}/train`" in msg
        until(lambda: "EfficiencyGateWouldHold" in _reasons(api, ns, "train-x2kq9"), "the would-hold Event")
        (ev,) = [e for e in events(api, ns, "train-x2kq9") if e["reason"] == "EfficiencyGateWouldHold"]
        assert ev["type"] == "Warning" and ev["note"] == msg[:1024]


def test_enforce_rejects_with_quota_released_and_an_acknowledgement_readmits(kube_admin, namespace, store):
    api, ns = kube_admin, namespace
    key = LineageKey("default", ns, "train")
    record_runs(store, key, FLAGGED, _now())
    with gate_queue(api, ns) as q, running_gate(api, store, mode="enforce", holds_namespace=ns):
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        held = workload_of(api, ns, gpu_job(api, ns, "train-b7d2k", lineage="train"))["metadata"]["name"]
        wl = until(lambda: (w := _wl(api, ns, held)) and w["spec"].get("active") is False and w, "deactivated")
        until(lambda: condition(_wl(api, ns, held), "QuotaReserved").get("status") == "False", "quota released")
        evicted = condition(_wl(api, ns, held), "Evicted")
        assert (evicted["status"], evicted["reason"]) == ("True", "DeactivatedDueToAdmissionCheck"), evicted
        # Kueue replaced our message: the reason lives in our annotation and Event
        ann = job(api, ns, "train-b7d2k")["metadata"]["annotations"]
        rejected = json.loads(ann[GATE_REJECTED])
        assert rejected["workload"] == held and rejected["how"] == f"acknowledge with `gpu-auditor ack {ns}/train`"
        assert rejected["reason"].startswith("gpu-auditor: held, hold until acknowledged")
        until(lambda: "EfficiencyGateHeld" in _reasons(api, ns, "train-b7d2k"), "the held Event")
        # the gate lists the hold right after the Event (GateController._after): wait for it too
        holds = until(lambda: (h := holds_of(api, ns, "gpu-auditor-holds")) and f"{ns}.train" in h and h, "listed")
        assert holds[f"{ns}.train"].startswith("hold: hold until acknowledged")
        assert job(api, ns, "train-b7d2k")["spec"]["suspend"] is True

        # the released quota admits another job at once
        other = workload_of(api, ns, gpu_job(api, ns, "other"))["metadata"]["name"]
        until(lambda: is_true(_wl(api, ns, other), "Admitted"), "the other job admitted on the released quota")
        call_json(
            api,
            resource_path("batch/v1", "jobs", ns, "other"),
            method="DELETE",
            query=[("propagationPolicy", "Background")],
        )

        # acknowledged: the sweep deletes the rejected Workload, Kueue recreates it, the check admits
        AckLog(store).acknowledge(key, "alice@example.com", None, "fixed the input pipeline", _now())
        uid = job(api, ns, "train-b7d2k")["metadata"]["uid"]

        def readmitted():
            items = call_json(
                api, resource_path(KV, "workloads", ns), query=[("labelSelector", f"kueue.x-k8s.io/job-uid={uid}")]
            )["items"]
            return next(
                (w for w in items if w["metadata"]["name"] != held or w["metadata"]["uid"] != wl["metadata"]["uid"]),
                None,
            )

        fresh = until(readmitted, "the Workload recreated after the acknowledgement", timeout=60)
        fresh = until(
            lambda: (w := _wl(api, ns, fresh["metadata"]["name"])) and is_true(w, "Admitted") and w, "re-admitted", 60
        )
        assert check_state(fresh, q.check)["message"].startswith(
            "gpu-auditor: admitted, acknowledged by alice@example.com"
        )
        until(lambda: job(api, ns, "train-b7d2k")["spec"]["suspend"] is False, "the Job runs")
        until(
            lambda: f"{ns}.train" not in holds_of(api, ns, "gpu-auditor-holds"),
            "the lineage dropped from the holds ConfigMap",
        )
        assert "EfficiencyGateReleased" in _reasons(api, ns, "train-b7d2k")


def test_a_requeue_through_the_check_puts_a_running_job_behind_a_waiting_one(kube_admin, namespace, store):
    """Issue 16 item 6 on Kueue v0.17.0 and v0.19.2: ``Retry`` evicts the running job, and the second ``Retry``
    with ``requeueAfterSeconds`` written while Kueue evicts it keeps it out of the queue while the
    quota goes to the job that was waiting; after the backoff it waits behind that job, and is
    re-admitted (the gate answering again) once the quota is free. Without the backoff, Kueue
    gives the quota straight back to the evicted job (the waiting one parked as inadmissible)."""
    api, ns = kube_admin, namespace
    with gate_queue(api, ns) as q, running_gate(api, store) as ctl:
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        first = workload_of(api, ns, gpu_job(api, ns, "first"))["metadata"]["name"]
        until(lambda: is_true(_wl(api, ns, first), "Admitted"), "the first job admitted")
        waiting = workload_of(api, ns, gpu_job(api, ns, "waiting"))["metadata"]["name"]
        until(
            lambda: condition(_wl(api, ns, waiting), "QuotaReserved").get("reason") == "Pending", "the second job waits"
        )
        until(lambda: ctl.kube.pending_workloads(q.cluster_queue) == 1, "the ClusterQueue counts it pending")

        done = ctl.requeue(ns, first, "gpu-auditor: requeued by policy low-sm (3 % SM activity)", backoff=3)
        assert done == {
            "type": "workload-check",
            "namespace": ns,
            "name": first,
            "checks": [q.check],
            "state": "Retry",
            "backoff_s": 3,
        }
        until(lambda: is_true(_wl(api, ns, waiting), "Admitted"), "the waiting job admitted on the freed quota")
        wl = _wl(api, ns, first)
        assert not is_true(wl, "QuotaReserved") and not is_true(wl, "Admitted")
        evictions = wl["status"]["schedulingStats"]["evictions"]
        assert [(e["reason"], e["count"]) for e in evictions] == [("AdmissionCheck", 1)], evictions
        # the backoff over, it is queued again: behind the job that now holds the quota
        until(lambda: condition(_wl(api, ns, first), "Requeued").get("reason") == "BackoffFinished", "backoff over")
        time.sleep(1.0)
        assert not is_true(_wl(api, ns, first), "QuotaReserved") and is_true(_wl(api, ns, waiting), "Admitted")
        call_json(
            api,
            resource_path("batch/v1", "jobs", ns, "waiting"),
            method="DELETE",
            query=[("propagationPolicy", "Background")],
        )
        wl = until(lambda: (w := _wl(api, ns, first)) and is_true(w, "Admitted") and w, "re-admitted behind it")
        assert check_state(wl, q.check)["state"] == "Ready"  # the gate answered the re-admission
        assert len([d for d in ctl.decided if d.workload == first]) >= 2  # more where Kueue re-pended it
        assert ctl.requeue(ns, "no-such-workload", "x") is None


@contextmanager
def _store_not_answering(url: str) -> Iterator[None]:
    """PostgreSQL that accepts connections but does not answer the gate's read: another session
    holds an exclusive lock on the lineages table (as a long migration or a stuck vacuum would)."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("LOCK TABLE lineages IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


@pytest.fixture
def pg_store(postgres_url):
    s = Store.open(postgres_url)
    yield s, postgres_url
    s.close()


def test_with_the_store_not_answering_the_gate_admits_within_its_timeout(kube_admin, namespace, pg_store):
    api, ns = kube_admin, namespace
    store, url = pg_store
    record_runs(store, LineageKey("default", ns, "train"), FLAGGED, _now())
    with gate_queue(api, ns) as q, running_gate(api, store, mode="enforce", timeout=1.0) as ctl:
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        with _store_not_answering(url):
            wl = workload_of(api, ns, gpu_job(api, ns, "train-q8z5m", lineage="train"))["metadata"]["name"]
            until(lambda: is_true(_wl(api, ns, wl), "Admitted"), "admitted fail-open")
        msg = check_state(_wl(api, ns, wl), q.check)["message"]
        assert (
            msg
            == "gpu-auditor: admitted without a decision, no decision within 1 s (the store did not answer) (fail-open)"
        )
        d = _decision(ctl, wl)
        assert d.failure and 1.0 <= d.decide_seconds < 1.5 and d.seconds < 3.0
        until(lambda: "EfficiencyGateFailOpen" in _reasons(api, ns, "train-q8z5m"), "the fail-open Event")


def test_fail_closed_rejects_while_the_store_does_not_answer_and_readmits_after(kube_admin, namespace, pg_store):
    api, ns = kube_admin, namespace
    store, url = pg_store
    with gate_queue(api, ns) as q, running_gate(api, store, mode="enforce", timeout=1.0, fail_closed=True):
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        with _store_not_answering(url):
            wl = workload_of(api, ns, gpu_job(api, ns, "clean-r4t6w"))
            held = wl["metadata"]["name"]
            until(lambda: _wl(api, ns, held)["spec"].get("active") is False, "rejected (fail-closed)")
            until(lambda: condition(_wl(api, ns, held), "QuotaReserved").get("status") == "False", "quota released")
            until(lambda: "EfficiencyGateFailClosed" in _reasons(api, ns, "clean-r4t6w"), "the fail-closed Event")
            rejected = json.loads(job(api, ns, "clean-r4t6w")["metadata"]["annotations"][GATE_REJECTED])
            assert "no decision within 1 s" in rejected["reason"] and "fail-closed" in rejected["reason"]
            time.sleep(2.0)  # sweeps run meanwhile and release nothing without an answer
            assert _wl(api, ns, held)["metadata"]["uid"] == wl["metadata"]["uid"]
        # the store answers again: the sweep decides (clean lineage), re-creates the Workload, it is admitted
        uid = job(api, ns, "clean-r4t6w")["metadata"]["uid"]

        def admitted():
            items = call_json(
                api, resource_path(KV, "workloads", ns), query=[("labelSelector", f"kueue.x-k8s.io/job-uid={uid}")]
            )["items"]
            return next(
                (w for w in items if w["metadata"]["uid"] != wl["metadata"]["uid"] and is_true(w, "Admitted")), None
            )

        fresh = until(admitted, "re-admitted once the store answers", timeout=60)
        assert check_state(fresh, q.check)["message"].startswith("gpu-auditor: admitted, lineage")


def test_removing_the_gate_from_a_held_job_is_the_owners_acknowledgement(kube_admin, namespace, store):
    """A Job the policy gated at creation (the annotations the chart's MutatingAdmissionPolicy
    adds) waits without quota; its owner removes the gate: Kueue reserves quota, the gate records
    the owner's acknowledgement (via annotation) and admits it, and the Job runs."""
    api, ns = kube_admin, namespace
    key = LineageKey("default", ns, "train")
    record_runs(store, key, FLAGGED, _now())
    with gate_queue(api, ns) as q, running_gate(api, store, mode="enforce"):
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        gated = gpu_job(
            api,
            ns,
            "train-k7w2p",
            lineage="train",
            annotations={GATED_BY: OUR_GATE, HOLD_REASON: "hold: hold until acknowledged: lineage flagged"},
        )
        wl = workload_of(api, ns, gated)["metadata"]["name"]
        waiting = until(lambda: condition(_wl(api, ns, wl), "QuotaReserved"), "QuotaReserved condition")
        assert (waiting["status"], waiting["reason"]) == ("False", "AdmissionGated"), waiting
        call_json(
            api,
            resource_path("batch/v1", "jobs", ns, "train-k7w2p"),
            method="PATCH",
            body={"metadata": {"annotations": {GATED_BY: None}}},
            content_type="application/merge-patch+json",
        )

        def admitted():
            uid = gated["metadata"]["uid"]
            items = call_json(
                api, resource_path(KV, "workloads", ns), query=[("labelSelector", f"kueue.x-k8s.io/job-uid={uid}")]
            )["items"]
            return next((w for w in items if is_true(w, "Admitted")), None)

        done = until(admitted, "admitted after the owner removed the gate", 60)
        assert check_state(done, q.check)["message"].startswith(
            "gpu-auditor: admitted, acknowledged by the Job's owner (removed the admission gate)"
        )
        until(lambda: job(api, ns, "train-k7w2p")["spec"]["suspend"] is False, "the Job runs")
        (ack,) = AckLog(store).acks(key)
        assert (ack.via, ack.until) == ("annotation", None)
        assert ack.reason == f"removed {GATED_BY} from Job {ns}/train-k7w2p"


def test_a_check_left_pending_while_no_gate_ran_is_answered_on_its_return(kube_admin, namespace, store):
    """Kueue has no deadline for a Pending check: while no gate runs the Workload waits holding its
    quota. The returning gate applies ``gate.timeout`` to what it missed: fail-open admits at once
    without a decision (even a lineage enforce would hold), fail-closed decides as usual."""
    api, ns = kube_admin, namespace
    record_runs(store, LineageKey("default", ns, "train"), FLAGGED, _now())
    later = lambda: _now() + timedelta(hours=1)  # noqa: E731 - the gate returns an hour after the reservation

    def pending(name: str) -> str:
        wl = workload_of(api, ns, gpu_job(api, ns, name, lineage="train"))["metadata"]["name"]
        until(
            lambda: (w := _wl(api, ns, wl)) and is_true(w, "QuotaReserved") and check_state(w, q.check),
            "quota reserved, our check Pending with no gate running",
        )
        assert check_state(_wl(api, ns, wl), q.check)["state"] == "Pending"
        return wl

    with gate_queue(api, ns) as q:
        with running_gate(api, store):
            until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        first = pending("train-w6k2p")
        # the wait is measured on the control plane's clock (the gate's own runs an hour ahead,
        # which must change nothing): let more than gate.timeout pass since the reservation
        time.sleep(3.0)
        with running_gate(api, store, mode="enforce", timeout=2.0, clock=later) as ctl:
            wl = until(lambda: (w := _wl(api, ns, first)) and is_true(w, "Admitted") and w, "admitted fail-open")
            msg = check_state(wl, q.check)["message"]
            assert msg.startswith(
                "gpu-auditor: admitted without a decision, the gate was not running when the Workload"
            )
            assert "gate.timeout 2 s) (fail-open)" in msg, msg
            d = _decision(ctl, first)
            assert d.failure and d.decide_seconds == 0.0  # no store read
            until(lambda: "EfficiencyGateFailOpen" in _reasons(api, ns, "train-w6k2p"), "the fail-open Event")
        call_json(
            api,
            resource_path("batch/v1", "jobs", ns, "train-w6k2p"),
            method="DELETE",
            query=[("propagationPolicy", "Background")],
        )
        second = pending("train-x4m8q")
        with running_gate(api, store, mode="enforce", timeout=2.0, fail_closed=True, clock=later):
            until(lambda: _wl(api, ns, second)["spec"].get("active") is False, "decided: held (enforce)")
            rejected = json.loads(job(api, ns, "train-x4m8q")["metadata"]["annotations"][GATE_REJECTED])
            assert rejected["reason"].startswith("gpu-auditor: held, hold until acknowledged"), rejected


def test_a_gate_whose_clock_runs_ahead_decides_what_was_reserved_while_it_ran(kube_admin, namespace, store):
    """Kueue stamps ``QuotaReserved`` with the control plane's clock. A gate whose own clock is
    days ahead (a skewed node, a shifted test clock) must still see a Workload reserved while it
    ran as its own to decide, not as one it missed (which fail-open admits without a decision)."""
    api, ns = kube_admin, namespace
    ahead = lambda: _now() + timedelta(days=5, hours=3)  # noqa: E731
    with gate_queue(api, ns) as q, running_gate(api, store, clock=ahead) as ctl:
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        wl = workload_of(api, ns, gpu_job(api, ns, "clean-s5k3w"))
        wl = until(lambda: (w := _wl(api, ns, wl["metadata"]["name"])) and is_true(w, "Admitted") and w, "Admitted")
        msg = check_state(wl, q.check)["message"]
        assert msg.startswith("gpu-auditor: admitted, lineage") and "no gate rule fires" in msg, msg
        d = _decision(ctl, wl["metadata"]["name"])
        assert d.failure is None and d.state == "Ready"
        assert abs(ctl.clock_offset + timedelta(days=5, hours=3)) < timedelta(seconds=5), ctl.clock_offset


def _rbac(api, verb_path: str, body: dict) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        call_json(api, f"/apis/rbac.authorization.k8s.io/v1/{verb_path}", method="POST", body=body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def test_an_answer_the_api_refused_is_tried_again_until_it_is_written(kube_admin, namespace, store, testbed):
    """A refused status write leaves the check Pending (quota held) and no watch event may follow:
    the controller tries that Workload again with backoff. Proven by a gate whose account may not
    yet write Workload status: once the permission is granted, the check is answered without
    any change to the Workload."""
    from auditor.kube.client import KubeConfig, api_client

    api, ns = kube_admin, namespace
    user = f"system:serviceaccount:{ns}:gate-retry"
    rules = [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["admissionchecks", "workloads"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks/status"], "verbs": ["patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "get"]},
    ]
    roles = {
        f"{ns}-gate-read": rules,
        f"{ns}-gate-status": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["patch"]}],
    }
    for name, r in roles.items():
        _rbac(api, "clusterroles", {"metadata": {"name": name}, "rules": r})
    binding = {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}

    def bind(role: str) -> None:
        body = {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [binding],
        }
        _rbac(api, "clusterrolebindings", body)

    as_gate = api_client(KubeConfig(kubeconfig=testbed.kubeconfig, impersonate=user))
    try:
        bind(f"{ns}-gate-read")
        with gate_queue(api, ns) as q, running_gate(as_gate, store) as ctl:
            until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
            wl = workload_of(api, ns, gpu_job(api, ns, "clean-h3v9b"))["metadata"]["name"]
            until(lambda: ctl._attempts.get(f"{ns}/{wl}", 0) >= 2, "the refused write tried again")
            assert check_state(_wl(api, ns, wl), q.check)["state"] == "Pending"
            bind(f"{ns}-gate-status")
            admitted = until(lambda: (w := _wl(api, ns, wl)) and is_true(w, "Admitted") and w, "answered on a retry")
            assert check_state(admitted, q.check)["message"].startswith("gpu-auditor: admitted, lineage")
    finally:
        as_gate.close()
        for name in roles:
            for plural in ("clusterrolebindings", "clusterroles"):
                try:
                    call_json(api, f"/apis/rbac.authorization.k8s.io/v1/{plural}/{name}", method="DELETE")
                except Exception:  # noqa: BLE001 - the binding may never have been made
                    pass


def test_with_the_check_on_every_flavor_the_gate_answers_before_quota(kube_admin, namespace, store):
    """A check that runs for every flavor of its ClusterQueue is put on a Workload at its creation
    (Kueue matches ``onFlavors`` only once a flavor is assigned, so a check scoped to some flavors
    waits for the reservation). The gate answers it while the job is still queued: Kueue keeps a
    Ready and admits at the reservation itself (nothing decided after it); a Rejected keeps the
    Workload out of admission without its ever taking quota (Kueue deactivates only Workloads
    holding quota), and an acknowledgement releases it (the Workload recreated, then admitted)."""
    api, ns = kube_admin, namespace
    key = LineageKey("default", ns, "train")
    record_runs(store, key, FLAGGED, _now())
    with gate_queue(api, ns, on_flavors=False) as q, running_gate(api, store, mode="enforce") as ctl:
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        first = workload_of(api, ns, gpu_job(api, ns, "first"))["metadata"]["name"]
        until(lambda: is_true(_wl(api, ns, first), "Admitted"), "the first job admitted")
        held = workload_of(api, ns, gpu_job(api, ns, "train-p2k7d", lineage="train"))
        clean = workload_of(api, ns, gpu_job(api, ns, "clean-b5n8x"))["metadata"]["name"]
        queued = until(
            lambda: (w := _wl(api, ns, clean)) and check_state(w, q.check).get("state") == "Ready" and w,
            "the queued job answered before quota",
        )
        assert not is_true(queued, "QuotaReserved")
        h = until(
            lambda: (
                (w := _wl(api, ns, held["metadata"]["name"]))
                and check_state(w, q.check).get("state") == "Rejected"
                and w
            ),
            "the flagged one held while queued",
        )
        assert h["spec"].get("active") is not False and not is_true(h, "QuotaReserved")
        freed = time.monotonic()
        call_json(
            api,
            resource_path("batch/v1", "jobs", ns, "first"),
            method="DELETE",
            query=[("propagationPolicy", "Background")],
        )
        until(lambda: is_true(_wl(api, ns, clean), "Admitted"), "admitted at its reservation")
        answers = [d for d in ctl.decided if d.workload == clean]
        # none after quota: each answer was sent before the quota was freed (its response may come
        # back after the test saw the state, so ``wrote_at`` alone can be later)
        assert answers and all(d.state == "Ready" and d.wrote_at - d.write_seconds < freed for d in answers)
        assert not is_true(_wl(api, ns, held["metadata"]["name"]), "QuotaReserved")  # the clean one got it

        AckLog(store).acknowledge(key, "alice@example.com", None, "fixed the input pipeline", _now())
        uid = job(api, ns, "train-p2k7d")["metadata"]["uid"]

        def recreated():
            items = call_json(
                api, resource_path(KV, "workloads", ns), query=[("labelSelector", f"kueue.x-k8s.io/job-uid={uid}")]
            )["items"]
            return next((w for w in items if w["metadata"]["uid"] != held["metadata"]["uid"]), None)

        fresh = until(lambda: (w := recreated()) and check_state(w, q.check).get("state") == "Ready" and w, "released")
        assert "acknowledged" in check_state(fresh, q.check)["message"]


def _our_writes(wl: dict) -> set[str]:
    """How our field manager has written the Workload's status: ``Update`` (JSON patch), ``Apply``."""
    from auditor.gate.kueue import FIELD_MANAGER

    return {
        m["operation"]
        for m in wl["metadata"]["managedFields"]
        if m["manager"] == FIELD_MANAGER and m.get("subresource") == "status"
    }


def test_check_states_go_by_apply_or_by_json_patch_of_our_entry(kube_admin, namespace, store):
    """The gate answers by server-side apply; the JSON patch of our entry (the benchmark's
    comparison) writes at the index the Workload showed, and when that index no longer holds our
    check (the list moved) the patch's test fails and the entry is applied instead."""
    from auditor.gate.kueue import WorkloadView, rfc3339

    api, ns = kube_admin, namespace
    with gate_queue(api, ns) as q, running_gate(api, store) as ctl:
        until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the ClusterQueue Active")
        name = workload_of(api, ns, gpu_job(api, ns, "clean"))["metadata"]["name"]
        wl = until(lambda: (w := _wl(api, ns, name)) and is_true(w, "Admitted") and w, "Admitted")
        assert _our_writes(wl) == {"Apply"}  # the gate's own answer
        view = WorkloadView.parse(wl)
        assert view.check_order == (q.check,)

        def entry(message: str) -> dict:
            return {"state": "Ready", "message": message, "lastTransitionTime": rfc3339(_now())}

        written = ctl.kube.write_checks(view, {q.check: entry("written by patch")}, how="patch")
        assert check_state(written, q.check)["message"] == "written by patch" and "Update" in _our_writes(written)
        moved = WorkloadView.parse({**wl, "status": {"admissionChecks": [{"name": "other"}, {"name": q.check}]}})
        written = ctl.kube.write_checks(moved, {q.check: entry("applied, the list moved")}, how="patch")
        # index 1 does not exist: the patch's test fails (422), so only the apply can have written it
        assert check_state(written, q.check)["message"] == "applied, the list moved"
        assert check_state(written, q.check)["state"] == "Ready" and is_true(written, "Admitted")
