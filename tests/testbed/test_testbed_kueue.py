"""The real Kueue controller in the test bed: its configuration, its webhooks on loopback, and what
it does to a queued Job (issue 14, item 1). On the floor (v0.17.0) and, with
``GPU_AUDITOR_TESTBED_KUEUE_VERSION=v0.19.2``, on the newest the Go module proxy serves (issue 29)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubeobjects import batch_job
from kueue_objects import KV, job_workload, kueue_running

from auditor.kube.client import call_json, resource_path
from auditor.testbed import binaries, config, kueue
from auditor.testbed.bed import health


def _module_base() -> dict:
    base, _ = binaries.kueue_manifests()
    return yaml.safe_load(base.read_text())


def test_configuration_is_the_modules_with_loopback_overrides(tmp_path):
    base = _module_base()
    cfg = kueue.configuration(base, health_port=1111, webhook_port=2222, cert_dir=tmp_path)
    assert (cfg["apiVersion"], cfg["kind"]) == ("config.kueue.x-k8s.io/v1beta2", "Configuration")
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:1111"
    assert cfg["webhook"] == {"port": 2222, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert cfg["metrics"]["bindAddress"] == "0"
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["leaderElection"]["resourceNamespace"] == "kueue-system"
    assert cfg["leaderElection"]["resourceName"] == base["leaderElection"]["resourceName"]  # the module's
    assert cfg["controller"] == base["controller"] and cfg["clientConnection"] == base["clientConnection"]
    assert cfg["integrations"]["frameworks"] == list(kueue.FRAMEWORKS)
    # names Kueue knows: v0.19 ships the kubeflow v1 kinds commented out of its base list (still registered)
    base_text = binaries.kueue_manifests()[0].read_text()
    known = set(base["integrations"]["frameworks"]) | set(re.findall(r'#\s*-\s*"([^"]+)"', base_text))
    assert set(kueue.FRAMEWORKS) <= known
    assert cfg["featureGates"] == {"AdmissionGatedBy": True, "PriorityBoost": True, "VisibilityOnDemand": False}


def test_webhooks_are_the_modules_pointed_at_loopback():
    _, manifests = binaries.kueue_manifests()
    docs = list(yaml.safe_load_all(manifests.read_text()))
    hooks = kueue.webhook_configurations(docs, 9443, b"CA")
    assert [h["metadata"]["name"] for h in hooks] == [
        "kueue-mutating-webhook-configuration",
        "kueue-validating-webhook-configuration",
    ]
    served = {w["name"] for h in hooks for w in h["webhooks"]}
    for name in (
        "mjob.kb.io",
        "vjob.kb.io",
        "mworkload.kb.io",
        "vworkload.kb.io",
        "vclusterqueue.kb.io",
        "mpytorchjob.kb.io",
        "vtrainjob.kb.io",
        "mjobset.kb.io",
        "vrayjob.kb.io",
        "mraycluster.kb.io",
    ):
        assert name in served
    for name in (
        "mpod.kb.io",
        "vpod.kb.io",
        "mdeployment.kb.io",
        "vstatefulset.kb.io",
        "mmpijob.kb.io",
        "mleaderworkerset.kb.io",
        "vrayservice.kb.io",
        "mappwrapper.kb.io",
    ):
        assert name not in served  # integrations the bed leaves off
    for h in hooks:
        for w in h["webhooks"]:
            assert w["clientConfig"]["url"].startswith("https://127.0.0.1:9443/")
            assert w["clientConfig"]["caBundle"] == "Q0E="
            assert w["failurePolicy"] == "Fail"
    original = {w["name"]: w["clientConfig"]["service"]["path"] for d in docs if d for w in d["webhooks"]}
    assert all(w["clientConfig"]["url"].endswith(original[w["name"]]) for h in hooks for w in h["webhooks"])


pytestmark_live = pytest.mark.skipif(not kueue_running(), reason="the bed runs without Kueue")


@pytestmark_live
def test_kueue_runs_and_answers(testbed):
    report = health(Path(testbed.state_dir))
    assert report["kueue"]["running"] and report["kueue"]["healthy"], report["kueue"]
    assert testbed.kueue_namespace == "kueue-system" and testbed.env()["KUEUE_NAMESPACE"] == "kueue-system"
    log = Path(report["kueue"]["log"]).read_text()
    assert f'"gitVersion":"{config.KUEUE_VERSION}"' in log.replace(" ", "")
    for gate in ("AdmissionGatedBy", "PriorityBoost"):
        assert gate in log
    # the metrics certificate lives in Kueue's private mount namespace, not on the host
    assert not Path("/etc/kueue").exists()


@pytestmark_live
def test_a_queued_job_is_suspended_and_gets_kueues_workload(kube_admin, namespace):
    job = batch_job(kube_admin, namespace, "train", labels={"kueue.x-k8s.io/queue-name": "nowhere"})
    assert job["spec"]["suspend"] is True  # mutating webhook
    wl = job_workload(kube_admin, namespace, job)
    assert wl["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert wl["spec"]["queueName"] == "nowhere"
    deadline = time.monotonic() + 30
    while True:
        wl = call_json(kube_admin, resource_path(KV, "workloads", namespace, wl["metadata"]["name"]))
        cond = {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}
        if "QuotaReserved" in cond:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert cond["QuotaReserved"]["status"] == "False" and "nowhere" in cond["QuotaReserved"]["message"]


@pytestmark_live
def test_validating_webhooks_deny_what_kueue_forbids(testbed, kube_admin, namespace):
    batch_job(kube_admin, namespace, "gated", labels={"kueue.x-k8s.io/queue-name": "lq"})
    out = subprocess.run(
        [
            testbed.kubectl,
            f"--kubeconfig={testbed.kubeconfig}",
            "annotate",
            "job",
            "gated",
            "-n",
            namespace,
            "kueue.x-k8s.io/admission-gated-by=example.com/ack",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "cannot add admission gate after creation" in out.stderr, out.stderr
