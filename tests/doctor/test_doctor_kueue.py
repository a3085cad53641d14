"""``doctor --kubeconfig``: whether the bed's real Kueue has its PriorityBoost gate on.

The bed starts Kueue v0.17.0 with ``PriorityBoost`` on (auditor/testbed/kueue.py), so its Workload
webhook refuses a non-integer ``kueue.x-k8s.io/priority-boost``: the probe's dry-run patch is
refused and the check says "on", leaving the Workload as it was. Without the rights to list and
patch Workloads the probe cannot tell and says so, as advice (never a failed doctor).
"""

from __future__ import annotations

import json

import pytest
from kueue_objects import KV, gpu_job, gpu_quota, job_workload, kueue_running

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
