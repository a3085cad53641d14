"""Which Kueue a cluster runs, read as the operator and doctor read it (issue 29), from what
upstream's own installer writes: Kueue's Helm chart (``charts/kueue`` of the module, v0.17.0 and
the newest served, v0.19.2) rendered by the bed's helm, its Deployment and manager ConfigMap
created on the bed's real apiserver in a test namespace (no controller runs them), and read back
through :func:`read_install`. Then the same lines against the bed's running Kueue, whose webhook
answers the PriorityBoost probe.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml
from kueue_objects import KV, gpu_job, gpu_quota, job_workload, kueue_running

from auditor.kube.client import call_json, resource_path
from auditor.kube.kueue_features import (
    ADMISSION_GATED_BY_GATE,
    PRIORITY_BOOST_GATE,
    kueue_findings,
    read_install,
)
from auditor.testbed import binaries, config

pytestmark = pytest.mark.testbed


def _render(helm: str, version: str, namespace: str, *sets: str) -> dict[str, dict]:
    """Kueue's own chart at ``version``: its Deployment and ConfigMap, by kind."""
    chart = binaries.module_dir("sigs.k8s.io/kueue", version) / "charts" / "kueue"
    argv = [helm, "template", "kueue", str(chart), "-n", namespace]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d and d.get("kind") in ("Deployment", "ConfigMap")]
    return {d["kind"]: d for d in docs if d["metadata"]["name"].startswith("kueue-")}


def _create(api, namespace: str, objs: dict[str, dict]) -> None:
    for kind, plural, gv in (("Deployment", "deployments", "apps/v1"), ("ConfigMap", "configmaps", "v1")):
        obj = objs[kind]
        obj["metadata"]["namespace"] = namespace
        call_json(api, resource_path(gv, plural, namespace), method="POST", body=obj)


@pytest.mark.parametrize("version", config.KUEUE_VERSIONS)
def test_a_helm_install_says_its_version_and_feature_gates(kube_admin, namespace, testbed, version):
    objs = _render(
        testbed.helm,
        version,
        namespace,
        "controllerManager.featureGates[0].name=PriorityBoost",
        "controllerManager.featureGates[0].enabled=true",
    )
    _create(kube_admin, namespace, objs)
    got = read_install(kube_admin, namespace)
    assert got.version == version, got
    assert got.version_from == f"label app.kubernetes.io/version of Deployment {namespace}/kueue-controller-manager"
    assert got.gates == {PRIORITY_BOOST_GATE: True}
    assert got.gates_from == f"--feature-gates of Deployment {namespace}/kueue-controller-manager"


@pytest.mark.parametrize("version", config.KUEUE_VERSIONS)
def test_a_stock_helm_install_falls_back_to_the_versions_defaults(kube_admin, namespace, testbed, version):
    _create(kube_admin, namespace, _render(testbed.helm, version, namespace))
    # the operator's call, pointed at the test namespace; no Workload is probed in a fresh cluster part
    lines = {x.subject: x for x in kueue_findings(kube_admin, needs=(ADMISSION_GATED_BY_GATE,), namespace=namespace)}
    assert lines["Kueue version"].level == "ok" and lines["Kueue version"].text.startswith(version)
    gated = lines["Kueue AdmissionGatedBy gate"]
    if version == config.KUEUE_FLOOR:  # alpha, off by default
        assert gated.level == "warn" and "alpha in v0.17.0" in gated.text, gated
    else:  # beta, on by default from v0.19
        assert gated.level == "ok" and f"beta in {version}" in gated.text, gated


@pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller")
def test_the_beds_kueue_shows_priority_boost_on_through_its_webhook(kube_admin, namespace):
    """The bed runs Kueue as a process (no Deployment): the version is unknown, and the webhook
    probe still sees the PriorityBoost gate the bed turns on."""
    with gpu_quota(kube_admin, namespace, gpus=1):
        job_workload(kube_admin, namespace, gpu_job(kube_admin, namespace, "probe-me"))
        assert call_json(kube_admin, resource_path(KV, "workloads", namespace)).get("items")
        lines = {x.subject: x for x in kueue_findings(kube_admin, needs=(PRIORITY_BOOST_GATE,), namespace=namespace)}
    assert lines["Kueue version"].level == "info" and lines["Kueue version"].text.startswith("unknown")
    boost = lines["Kueue PriorityBoost gate"]
    assert boost.level == "ok" and "webhook refused" in boost.text, boost


DEMOTE = """\
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: demote}
spec:
  mode: enforce
  verdicts: [low_sm_efficiency]
  escalation:
    - actions: [event]
    - actions: [requeue]
  requeue: {backoff: 10m, lowerPriorityBy: 10}
"""


@pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller")
def test_the_operator_logs_kueue_and_the_gates_its_options_need_at_start(testbed, tmp_path, caplog):
    """A policy that demotes (``requeue.lowerPriorityBy``) needs PriorityBoost: the operator's
    start says which Kueue runs (unknown on the bed: no Deployment) and that the gate is on."""
    import logging

    from operator_settings import operator_settings

    from auditor.operator_loop.service import Operator

    settings = operator_settings(
        tmp_path, policy=DEMOTE, kubernetes={"kubeconfig": testbed.kubeconfig}, prometheus={"url": "http://127.0.0.1:9"}
    )
    op = Operator(settings)
    try:
        with caplog.at_level(logging.INFO, logger="auditor.operator_loop.service"):
            op._log_kueue()
    finally:
        op.api.close()
        op.store.close()
    said = [r.getMessage() for r in caplog.records if r.name == "auditor.operator_loop.service"]
    assert any(
        m.startswith("Kueue version: unknown (no Deployment kueue-system/kueue-controller-manager") for m in said
    ), said
    boost = [m for m in said if m.startswith("Kueue PriorityBoost gate: ")]
    # on when the cluster holds a Workload to probe (other tests leave some), else unknown
    assert boost and ("on (" in boost[0] or "unknown" in boost[0]), said
    assert not any("AdmissionGatedBy" in m for m in said), said  # the gate's holdBeforeQuota is off
