"""``doctor --kubeconfig`` on the bed's real Kueue: its PriorityBoost gate, and the efficiency gate's
AdmissionCheck (Active or not, as Kueue and our controller leave it) and the ClusterQueues that run
it (scoped to the GPU flavors or not, GPU queues without it).

The bed starts Kueue v0.17.0 with ``PriorityBoost`` on (auditor/testbed/kueue.py), so its Workload
webhook refuses a non-integer ``kueue.x-k8s.io/priority-boost``: the probe's dry-run patch is
refused and the check says "on", leaving the Workload as it was. Without the rights to list and
patch Workloads the probe cannot tell and says so, as advice (never a failed doctor).
"""

from __future__ import annotations

import json
import uuid

import pytest
from gate_objects import gate_queue, is_true, running_gate, until
from kueue_objects import KV, delete_cluster_object, gpu_job, gpu_quota, job_workload, kueue_running

from auditor.cli.main import main
from auditor.kube.client import KubeConfig, api_client, call_json, resource_path
from auditor.kube.kueue_features import PRIORITY_BOOST, probe_priority_boost

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller"),
]


def test_doctor_sees_the_priority_boost_gate_on(testbed, kube_admin, namespace, prometheus, capsys) -> None:
    with gpu_quota(kube_admin, namespace):
        wl = job_workload(kube_admin, namespace, gpu_job(kube_admin, namespace, "probe"))
        main(["doctor", "--prometheus", prometheus.url, "--kubeconfig", testbed.kubeconfig, "--output", "json"])
        (check,) = [c for c in json.loads(capsys.readouterr().out) if c["name"] == "Kueue PriorityBoost gate"]
        assert check["status"] == "ok" and check["detail"].startswith("on: Kueue's webhook refused"), check
        assert not check["failed"]
        capsys.readouterr()
        main(["doctor", "--kueue-only", "--kubeconfig", testbed.kubeconfig, "--output", "json"])
        lines = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
        # the bed runs Kueue as a process, not as the Deployment kueue-system/kueue-controller-manager
        assert lines["Kueue version"]["status"] == "info" and "unknown" in lines["Kueue version"]["detail"]
        assert "Prometheus reachable" not in lines and "Kueue PriorityBoost gate" in lines
        after = call_json(kube_admin, resource_path(KV, "workloads", namespace, wl["metadata"]["name"]))
        assert PRIORITY_BOOST not in (after["metadata"].get("annotations") or {})  # a dry run stores nothing


def test_without_rights_the_probe_cannot_tell(testbed, kube_admin, namespace) -> None:
    with gpu_quota(kube_admin, namespace):
        job_workload(kube_admin, namespace, gpu_job(kube_admin, namespace, "probe"))
        nobody = api_client(
            KubeConfig(kubeconfig=testbed.kubeconfig, impersonate=f"system:serviceaccount:{namespace}:nobody")
        )
        try:
            probe = probe_priority_boost(nobody)
        finally:
            nobody.close()
    assert probe.state == "unknown" and "403" in probe.detail, probe


def doctor_lines(capsys, testbed, prometheus, *names: str) -> list[dict]:
    """doctor's JSON checks whose name is one of ``names``."""
    main(["doctor", "--prometheus", prometheus.url, "--kubeconfig", testbed.kubeconfig, "--output", "json"])
    return [c for c in json.loads(capsys.readouterr().out) if c["name"] in names]


def mine(lines: list[dict], name: str, start: str) -> list[dict]:
    """The lines ``name`` says about this test's objects (other tests' may exist meanwhile)."""
    return [c for c in lines if c["name"] == name and c["detail"].startswith(start)]


def test_doctor_says_the_check_inactive_then_active_and_the_queue_scoped_to_its_gpu_flavor(
    testbed, kube_admin, namespace, prometheus, capsys, tmp_path
) -> None:
    from auditor.store import Store

    with gate_queue(kube_admin, namespace) as q:
        lines = doctor_lines(capsys, testbed, prometheus, "gate: AdmissionCheck", "gate: ClusterQueues")
        (ac,) = mine(lines, "gate: AdmissionCheck", q.check + " ")
        assert ac["status"] == "warn" and "not Active" in ac["detail"] and "admits nothing" in ac["detail"], ac
        (cq,) = mine(lines, "gate: ClusterQueues", q.cluster_queue + " ")
        assert cq["status"] == "warn" and cq["detail"].startswith(
            f"{q.cluster_queue} runs {q.check} onFlavors [{q.gpu_flavor}], scoped to its GPU flavors; "
            "the ClusterQueue is not Active (False AdmissionCheckInactive:"
        ), cq
        store = Store.open(f"sqlite:///{tmp_path}/gate.db")
        try:
            with running_gate(kube_admin, store):
                until(lambda: is_true(_cq(kube_admin, q.cluster_queue), "Active"), "the ClusterQueue Active")
                lines = doctor_lines(capsys, testbed, prometheus, "gate: AdmissionCheck", "gate: ClusterQueues")
        finally:
            store.close()
        (ac,) = mine(lines, "gate: AdmissionCheck", q.check + " ")
        assert ac["status"] == "ok" and ac["detail"].startswith(f"{q.check} Active (True Active:"), ac
        (cq,) = mine(lines, "gate: ClusterQueues", q.cluster_queue + " ")
        assert (cq["status"], cq["detail"]) == (
            "ok",
            f"{q.cluster_queue} runs {q.check} onFlavors [{q.gpu_flavor}], scoped to its GPU flavors",
        )


def test_doctor_warns_on_a_check_on_every_flavor_of_a_mixed_queue(
    testbed, kube_admin, namespace, prometheus, capsys
) -> None:
    with gate_queue(kube_admin, namespace, on_flavors=False) as q:
        lines = doctor_lines(capsys, testbed, prometheus, "gate: ClusterQueues")
    (cq,) = mine(lines, "gate: ClusterQueues", q.cluster_queue + " ")
    assert cq["status"] == "warn" and f"non-GPU flavor(s) {q.cpu_flavor} wait for the gate too" in cq["detail"], cq
    assert f'"onFlavors":["{q.gpu_flavor}"]' in cq["fix"]


def test_doctor_warns_on_a_check_no_queue_lists_and_a_gpu_queue_without_it(
    testbed, kube_admin, namespace, prometheus, capsys
) -> None:
    from auditor.gate.kueue import CONTROLLER_NAME

    lone = f"gpu-efficiency-{uuid.uuid4().hex[:8]}"
    body = {"apiVersion": KV, "kind": "AdmissionCheck", "metadata": {"name": lone}}
    call_json(
        kube_admin,
        resource_path(KV, "admissionchecks"),
        method="POST",
        body=body | {"spec": {"controllerName": CONTROLLER_NAME}},
    )
    bare = f"cq-bare-{uuid.uuid4().hex[:8]}"
    try:
        with gate_queue(kube_admin, namespace) as q:
            group = {"coveredResources": ["nvidia.com/gpu"], "flavors": [_flavor(q.gpu_flavor)]}
            cq = {"apiVersion": KV, "kind": "ClusterQueue", "metadata": {"name": bare}}
            call_json(
                kube_admin,
                resource_path(KV, "clusterqueues"),
                method="POST",
                body=cq | {"spec": {"resourceGroups": [group]}},
            )
            try:
                lines = doctor_lines(capsys, testbed, prometheus, "gate: ClusterQueues")
            finally:
                delete_cluster_object(kube_admin, "clusterqueues", bare)
    finally:
        delete_cluster_object(kube_admin, "admissionchecks", lone)
    (unlisted,) = mine(lines, "gate: ClusterQueues", f"no ClusterQueue lists {lone} ")
    assert unlisted["status"] == "warn" and unlisted["detail"].startswith(f"no ClusterQueue lists {lone} "), unlisted
    assert f"kubectl patch clusterqueue {bare} --type=merge" in unlisted["fix"]
    (without,) = [c for c in lines if c["detail"].startswith("ClusterQueue(s) with GPU quota without the gate:")]
    assert bare in without["detail"].split(": ", 1)[1].split(", "), without


def _flavor(name: str) -> dict:
    return {"name": name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "1"}]}


def _cq(api, name: str) -> dict:
    return call_json(api, resource_path(KV, "clusterqueues", None, name))


def test_without_list_on_clusterqueues_the_checks_are_still_read(testbed, kube_admin, namespace) -> None:
    """The operator's ServiceAccount may list AdmissionChecks but only get ClusterQueues (the
    chart's RBAC): doctor run as it still says the check's state, and why the queues are missing."""
    from auditor.gate.kueue import CONTROLLER_NAME
    from auditor.kube.gate_objects import read_gate_objects

    role = f"doctor-{namespace}"
    rules = [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks"], "verbs": ["list"]}]
    binding = {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "doctor", "namespace": namespace}],
    }
    rbac = "rbac.authorization.k8s.io/v1"
    call_json(
        kube_admin,
        resource_path(rbac, "clusterroles"),
        method="POST",
        body={"metadata": {"name": role}, "rules": rules},
    )
    call_json(
        kube_admin,
        resource_path(rbac, "clusterrolebindings"),
        method="POST",
        body={"metadata": {"name": role}, **binding},
    )
    sa = api_client(KubeConfig(kubeconfig=testbed.kubeconfig, impersonate=f"system:serviceaccount:{namespace}:doctor"))
    nobody = api_client(KubeConfig(kubeconfig=testbed.kubeconfig, impersonate=f"system:serviceaccount:{namespace}:x"))
    try:
        with gate_queue(kube_admin, namespace) as q:
            got = until(lambda: (g := read_gate_objects(sa, CONTROLLER_NAME)).checks is not None and g, "RBAC in force")
            none = read_gate_objects(nobody, CONTROLLER_NAME)
    finally:
        sa.close()
        nobody.close()
        for plural in ("clusterrolebindings", "clusterroles"):
            call_json(kube_admin, resource_path(rbac, plural, None, role), method="DELETE")
    assert q.check in [c["metadata"]["name"] for c in got.checks or []]
    assert got.queues is None and got.error.startswith("cannot list clusterqueues (403"), got.error
    assert (none.checks, none.queues) == (None, None) and none.error.startswith("cannot list admissionchecks (403")
