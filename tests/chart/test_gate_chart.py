"""The chart's efficiency gate (gate.enabled): what it renders, and its RBAC, write fence and
MutatingAdmissionPolicy proven on the test bed's real apiserver and Kueue.

The gate's own controller runs as the chart's ServiceAccount (impersonated: RBAC and the write
fence in the path) against a real store: it sets the chart's AdmissionCheck Active, admits a
clean lineage, rejects a flagged one and lists it in the holds ConfigMap; the chart's
MutatingAdmissionPolicy then gates the lineage's next Job before quota (Kueue: AdmissionGated);
an acknowledgement releases both (the gate removed from the Job, the rejected Workload recreated)
and the Jobs run. A lineage on probation gets the probation WorkloadPriorityClass at creation and
is admitted after a competing job under quota contention. Everything the gate does not need is
denied.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from chartlib import CHART, Chart, ServiceAccount, drop_release, find
from gate_objects import (
    check_state,
    cluster_queue,
    condition,
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
from auditor.gate.kueue import GATED_BY, HOLD_REASON, OUR_GATE
from auditor.kube.client import KubeConfig, api_client, call_json, resource_path
from auditor.store import Store
from auditor.store.lineage import AckLog

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller"),
]

FLAGGED = ["low_sm_efficiency", "low_sm_efficiency", "healthy", "low_sm_efficiency"]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def test_gate_off_renders_nothing_of_it_and_on_renders_the_contract(chart: Chart):
    off = chart.render()
    assert not find(off, "AdmissionCheck") and not find(off, "MutatingAdmissionPolicy")
    assert "gate:" not in find(off, "ConfigMap", "ga-gpu-auditor-settings")[0]["data"]["settings.yaml"]

    on = chart.render(sets=["gate.enabled=true"])
    (check,) = find(on, "AdmissionCheck")
    assert check["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert check["spec"] == {"controllerName": "gpu-auditor.io/efficiency-gate"}
    settings = json.loads(json.dumps(_settings(on)))
    assert settings["gate"] == {
        "enabled": True,
        "mode": "observe",
        "timeout": "2s",
        "fail_closed": False,
        "probation_priority_class": "gpu-auditor-probation",
    }
    (wpc,) = find(on, "WorkloadPriorityClass")
    assert (wpc["metadata"]["name"], wpc["value"]) == ("gpu-auditor-probation", -100)
    assert not find(on, "MutatingAdmissionPolicy")  # hold before quota is off unless enabled

    held = chart.render(sets=["gate.enabled=true", "gate.mode=enforce", "gate.holdBeforeQuota.enabled=true"])
    gate = _settings(held)["gate"]
    assert (gate["mode"], gate["holds_namespace"], gate["holds_name"]) == (
        "enforce",
        "gpu-auditor",
        "ga-gpu-auditor-holds",
    )
    (map_,) = find(held, "MutatingAdmissionPolicy")
    (binding,) = find(held, "MutatingAdmissionPolicyBinding")
    assert map_["spec"]["failurePolicy"] == "Ignore"
    assert binding["spec"]["paramRef"] == {
        "name": "ga-gpu-auditor-holds",
        "namespace": "gpu-auditor",
        "parameterNotFoundAction": "Allow",
    }
    (holds,) = find(held, "GateHolds")
    assert (holds["apiVersion"], holds["metadata"]["name"]) == ("gpu-auditor.io/v1alpha1", "ga-gpu-auditor-holds")
    assert map_["spec"]["paramKind"] == {"apiVersion": "gpu-auditor.io/v1alpha1", "kind": "GateHolds"}
    bad = chart.template_text(sets=["gate.enabled=true", "gate.mode=strict"], check=False)
    assert bad.rc != 0 and "mode" in bad.err


def test_the_ack_link_key_secret_is_mounted_and_named_in_the_settings(chart: Chart):
    sets = ["gate.enabled=true", "gate.ackLinks.keySecret.name=ack-key", "gate.ackLinks.keySecret.key=hmac"]
    objs = chart.render(sets=[*sets, "gate.ackLinks.baseUrl=https://auditor.example.com"])
    gate = _settings(objs)["gate"]
    assert gate["ack_link_key_file"] == "/etc/gpu-auditor/ack-link/key"
    assert (gate["ack_link_base_url"], gate["ack_link_ttl"], gate["ack_link_snooze"]) == (
        "https://auditor.example.com",
        "7d",
        "24h",
    )
    (pod,) = [o["spec"]["template"]["spec"] for o in find(objs, "Deployment")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "ack-link-key"]
    # optional: a missing Secret must not keep the operator (and so the audit) from starting
    assert volume["secret"] == {
        "secretName": "ack-key",
        "optional": True,
        "defaultMode": 0o444,
        "items": [{"key": "hmac", "path": "key"}],
    }
    (mount,) = [m for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == "ack-link-key"]
    assert mount == {"name": "ack-link-key", "mountPath": "/etc/gpu-auditor/ack-link", "readOnly": True}
    # no base URL: the endpoint still redeems links, alerts carry none
    assert "ack_link_base_url" not in _settings(chart.render(sets=sets))["gate"]
    # the gate off: neither the volume nor the settings, whatever the Secret
    off = chart.render(sets=["gate.ackLinks.keySecret.name=ack-key"])
    assert not [v for o in find(off, "Deployment") for v in o["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    bad = chart.template_text(sets=["gate.enabled=true", "gate.ackLinks.baseUrl=ftp://x"], check=False)
    assert bad.rc != 0 and "baseUrl" in bad.err


def _settings(objs: list[dict]) -> dict:
    import yaml

    return yaml.safe_load(find(objs, "ConfigMap", "ga-gpu-auditor-settings")[0]["data"]["settings.yaml"])


def _wl(api: Any, ns: str, name: str) -> dict:
    return call_json(api, resource_path(KV, "workloads", ns, name))


def _delete_job(api: Any, ns: str, name: str) -> None:
    call_json(
        api, resource_path("batch/v1", "jobs", ns, name), method="DELETE", query=[("propagationPolicy", "Background")]
    )


def test_the_gate_as_the_service_account(chart: Chart, namespace: str, kube_admin, testbed, tmp_path):
    from kubernetes import client

    release, other = namespace, f"{namespace}-g"
    case = uuid.uuid4().hex[:6]
    check, probation = f"gpu-efficiency-{case}", f"probation-{case}"
    client.CoreV1Api(kube_admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    store = Store.open(f"sqlite:///{tmp_path}/gate.db")
    try:
        chart.helm(
            "install",
            release,
            str(CHART),
            "-n",
            namespace,
            *chart.value_args(
                sets=[
                    "gate.enabled=true",
                    "gate.mode=enforce",
                    "gate.holdBeforeQuota.enabled=true",
                    f"gate.admissionCheckName={check}",
                    f"gate.probation.priorityClassName={probation}",
                ]
            ),
        )
        sa = ServiceAccount(chart, namespace, f"{release}-gpu-auditor", kube_admin)
        as_sa = api_client(KubeConfig(kubeconfig=testbed.kubeconfig, impersonate=sa.user))
        holds = f"{release}-gpu-auditor-holds"
        _grants(sa, namespace, holds)
        with gate_queue(kube_admin, other, check=check) as q:
            with running_gate(
                as_sa, store, mode="enforce", holds_namespace=namespace, holds_name=holds, api_admin=kube_admin
            ) as ctl:
                _hold_and_release(kube_admin, other, q, store, namespace, holds)
                running = _probation(kube_admin, other, q, store, namespace, holds, probation)
                _requeue_through_the_check(kube_admin, other, q, ctl, running)
            _denied(as_sa, kube_admin, other, namespace, check)
    finally:
        store.close()
        drop_release(chart, namespace, release)
        client.CoreV1Api(kube_admin).delete_namespace(other)


def _grants(sa: ServiceAccount, namespace: str, holds: str) -> None:
    k = "kueue.x-k8s.io"
    for verb in ("get", "list", "watch"):
        assert sa.sar(verb, k, "admissionchecks")
    assert sa.can("patch", "admissionchecks.kueue.x-k8s.io", "--subresource=status")
    assert sa.can("patch", "workloads.kueue.x-k8s.io", "--subresource=status", "-A")
    assert sa.can("delete", "workloads.kueue.x-k8s.io", "-A")
    for verb in ("get", "patch"):
        assert sa.can(verb, f"gateholds.gpu-auditor.io/{holds}", "-n", namespace), verb
    assert not sa.can("patch", "gateholds.gpu-auditor.io/other", "-n", namespace)
    assert not sa.can("create", "gateholds.gpu-auditor.io", "-n", namespace)
    assert not sa.can("patch", "configmaps", "-n", namespace)
    for verb in ("create", "update", "patch", "delete"):
        assert not sa.sar(verb, k, "admissionchecks"), verb
    assert sa.sar("get", k, "clusterqueues")  # status.pendingWorkloads, for the ladder's requeue through the check
    for verb in ("list", "watch", "update", "patch"):
        assert not sa.sar(verb, k, "clusterqueues"), verb
    assert not sa.can("patch", "clusterqueues.kueue.x-k8s.io", "--subresource=status")
    assert not sa.sar("create", k, "workloads") and not sa.sar("patch", k, "workloadpriorityclasses")


def _hold_and_release(api: Any, ns: str, q: Any, store: Any, release_ns: str, holds: str) -> None:
    until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the chart's AdmissionCheck Active", 60)
    key = LineageKey("default", ns, "train")
    record_runs(store, key, FLAGGED, _now())

    # a flagged lineage's Job: rejected by the check (quota released), the lineage listed as held
    first = workload_of(api, ns, gpu_job(api, ns, "train-b7d2k", lineage="train"))["metadata"]["name"]
    until(lambda: _wl(api, ns, first)["spec"].get("active") is False, "the first submission rejected")
    data = until(
        lambda: holds_of(api, release_ns, holds),
        "the lineage in the holds ConfigMap (written as the ServiceAccount)",
    )
    assert data[f"{ns}.train"].startswith("hold: hold until acknowledged")

    # the next submission is gated at creation by the chart's policy: no quota while held
    until(
        lambda: (
            GATED_BY in (gpu_job(api, ns, "probe", lineage="train", dry_run=True)["metadata"].get("annotations") or {})
        ),
        "the policy's parameter informer sees the entry",
    )
    second = gpu_job(api, ns, "train-x2kq9", lineage="train")
    ann = second["metadata"]["annotations"]
    assert ann[GATED_BY] == OUR_GATE and ann[HOLD_REASON] == data[f"{ns}.train"]
    gated = workload_of(api, ns, second)["metadata"]["name"]
    waiting = until(lambda: condition(_wl(api, ns, gated), "QuotaReserved"), "the gated Workload's QuotaReserved")
    assert (waiting["status"], waiting["reason"]) == ("False", "AdmissionGated"), waiting
    other = gpu_job(api, ns, "other-job")  # another lineage: not gated, takes the quota
    assert GATED_BY not in (other["metadata"].get("annotations") or {})
    clean = workload_of(api, ns, other)["metadata"]["name"]
    until(lambda: is_true(_wl(api, ns, clean), "Admitted"), "another lineage admitted meanwhile")
    assert condition(_wl(api, ns, gated), "QuotaReserved")["reason"] == "AdmissionGated"
    _delete_job(api, ns, "other-job")

    # acknowledged: the gate removed from the Job (through the fence), the rejected Workload recreated
    AckLog(store).acknowledge(key, "alice@example.com", None, "fixed the input pipeline", _now())
    ungated = until(
        lambda: GATED_BY not in job(api, ns, "train-x2kq9")["metadata"]["annotations"] and job(api, ns, "train-x2kq9"),
        "ungated",
    )
    assert json.loads(ungated["metadata"]["annotations"]["gpu-auditor.io/gate-released"])["lineage"] == f"{ns}/train"
    until(
        lambda: is_true(_wl(api, ns, gated), "Admitted") or not is_true(_wl(api, ns, gated), "QuotaReserved"),
        "the gate gone",
    )
    until(
        lambda: f"{ns}.train" not in (holds_of(api, release_ns, holds) or {}),
        "the lineage dropped from the holds ConfigMap",
    )

    # one GPU: the two released jobs run one after the other (in Kueue's order); each one's
    # Workload is looked up by its Job (Kueue may replace a Workload when its Job changes)
    def current(name: str) -> dict:
        uid = job(api, ns, name)["metadata"]["uid"]
        items = call_json(
            api, resource_path(KV, "workloads", ns), query=[("labelSelector", f"kueue.x-k8s.io/job-uid={uid}")]
        )["items"]
        return next((w for w in items if w["spec"].get("active", True)), {})

    def admitted(*jobs: str) -> list[tuple[str, dict]]:
        wls = [(j, current(j)) for j in jobs or ("train-x2kq9", "train-b7d2k")]
        return [(j, w) for j, w in wls if w and is_true(w, "Admitted")]

    ((runs_first, wl), *_) = until(admitted, "a released job admitted", 60)
    assert check_state(wl, q.check)["message"].startswith("gpu-auditor: admitted, acknowledged by alice")
    until(lambda: job(api, ns, runs_first)["spec"]["suspend"] is False, "the Job runs")
    _delete_job(api, ns, runs_first)
    then = "train-b7d2k" if runs_first == "train-x2kq9" else "train-x2kq9"
    until(lambda: admitted(then), "the other released job admitted", 60)
    until(lambda: job(api, ns, then)["spec"]["suspend"] is False, "the other Job runs")
    _delete_job(api, ns, then)


def _probation(api: Any, ns: str, q: Any, store: Any, release_ns: str, holds: str, probation: str) -> str:
    """The probation lineage's re-submission admitted after a competing job; its Workload (running)."""
    key = LineageKey("default", ns, "sweep")
    record_runs(store, key, ["idle"], _now())
    # its first submission after the wasteful run: admitted on probation, the lineage listed
    first = workload_of(api, ns, gpu_job(api, ns, "sweep-0", lineage="sweep"))["metadata"]["name"]
    wl = until(lambda: (w := _wl(api, ns, first)) and is_true(w, "Admitted") and w, "admitted on probation", 60)
    assert check_state(wl, q.check)["message"].startswith("gpu-auditor: admitted at probation priority")
    until(
        lambda: (holds_of(api, release_ns, holds) or {}).get(f"{ns}.sweep", "").startswith("probation"),
        "the lineage listed for probation",
    )
    _delete_job(api, ns, "sweep-0")
    until(
        lambda: (
            gpu_job(api, ns, "probe", lineage="sweep", dry_run=True)["metadata"]["labels"].get(
                "kueue.x-k8s.io/priority-class"
            )
            == probation
        ),
        "the policy's parameter informer sees the entry",
    )

    # quota contention: a blocker runs; the probation re-submission is older than a normal one
    blocker = workload_of(api, ns, gpu_job(api, ns, "blocker"))["metadata"]["name"]
    until(lambda: is_true(_wl(api, ns, blocker), "Admitted"), "the blocker admitted", 60)
    again = gpu_job(api, ns, "sweep-1", lineage="sweep")
    assert again["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == probation
    resubmitted = workload_of(api, ns, again)["metadata"]["name"]
    assert _wl(api, ns, resubmitted)["spec"]["priority"] == -100
    time.sleep(1.1)  # creation timestamps have one-second resolution
    normal = workload_of(api, ns, gpu_job(api, ns, "normal"))["metadata"]["name"]
    _delete_job(api, ns, "blocker")
    until(lambda: is_true(_wl(api, ns, normal), "Admitted"), "the newer normal job admitted first", 60)
    assert not is_true(_wl(api, ns, resubmitted), "QuotaReserved")
    _delete_job(api, ns, "normal")
    until(lambda: is_true(_wl(api, ns, resubmitted), "Admitted"), "the probation job admitted when nobody waits", 60)
    return resubmitted


def _requeue_through_the_check(api: Any, ns: str, q: Any, ctl: Any, running: str) -> None:
    """The policy ladder's requeue through the check, as the ServiceAccount: it reads the
    ClusterQueue's pending count and writes both Retry states through the fence; the job that
    waited is admitted on the freed quota."""
    from auditor import compose

    waiting = workload_of(api, ns, gpu_job(api, ns, "queued"))["metadata"]["name"]
    until(lambda: ctl.kube.pending_workloads(q.cluster_queue) == 1, "the ClusterQueue counts it pending (as the SA)")
    port = compose.check_requeue(SimpleNamespace(controller=ctl))
    done = port.requeue(
        {"namespace": ns, "name": running},
        "gpu-auditor: requeued by policy p",
        backoff_s=2,
        lower_priority_by=0,
        now=_now(),
    )
    assert done["used"] and done["pending_workloads"] == 1 and done["checks"] == [q.check], done
    until(lambda: is_true(_wl(api, ns, waiting), "Admitted"), "the waiting job admitted on the freed quota", 60)
    evictions = _wl(api, ns, running)["status"]["schedulingStats"]["evictions"]
    assert [(e["reason"], e["count"]) for e in evictions] == [("AdmissionCheck", 1)], evictions


def _denied(as_sa: Any, api: Any, ns: str, release_ns: str, check: str) -> None:
    """What the gate's grants do not let it do, even where RBAC would (the write fence)."""
    from kubernetes.client.exceptions import ApiException

    job_obj = gpu_job(api, ns, f"fence-{uuid.uuid4().hex[:4]}")
    name = job_obj["metadata"]["name"]
    wl = workload_of(api, ns, job_obj)["metadata"]["name"]
    merge = "application/merge-patch+json"

    def refused(path: str, body: dict) -> str:
        with pytest.raises(ApiException) as exc:
            call_json(as_sa, path, method="PATCH", body=body, content_type=merge)
        assert exc.value.status in (403, 422), exc.value
        return str(exc.value.body)

    wl_path = resource_path(KV, "workloads", ns, wl)
    body = refused(
        wl_path + "/status",
        {
            "status": {
                "conditions": [
                    {
                        "type": "Forged",
                        "status": "True",
                        "reason": "X",
                        "message": "x",
                        "lastTransitionTime": "2026-12-01T00:00:00Z",
                    }
                ]
            }
        },
    )
    assert "write-fence" in body, body
    body = refused(wl_path + "/status", {"status": {"requeueState": {"count": 7}}})
    assert "write-fence" in body, body
    job_path = resource_path("batch/v1", "jobs", ns, name)
    body = refused(job_path, {"metadata": {"annotations": {GATED_BY: "x.io/other"}}})
    assert "write-fence" in body or "admission gate" in body, body
    body = refused(job_path, {"metadata": {"annotations": {"other.io/x": "y"}}})
    assert "write-fence" in body, body
    body = refused(resource_path(KV, "admissionchecks", None, check), {"spec": {"controllerName": "x.io/y"}})
    assert "forbidden" in body.lower(), body
    body = refused(resource_path("v1", "configmaps", release_ns, "kube-root-ca.crt"), {"data": {"a": "b"}})
    assert "forbidden" in body.lower(), body


def test_the_fence_keeps_every_workload_status_field_but_the_checks(chart: Chart, kube_admin):
    """The write fence's list of Workload status fields the gate must leave alone is the apiserver's
    schema (kueue.x-k8s.io/v1beta2) less status.admissionChecks, so a new Kueue field cannot slip by."""
    import re

    crd = call_json(kube_admin, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/workloads.kueue.x-k8s.io")
    (v1beta2,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    schema = set(v1beta2["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"])
    (policy,) = find(chart.render(sets=["gate.enabled=true"]), "ValidatingAdmissionPolicy")
    text = json.dumps(policy["spec"]["validations"])
    kept = set(re.findall(r"object\.status\.\?(\w+) == oldObject\.status\.\?\1", text))
    assert kept == schema - {"admissionChecks"}, kept ^ (schema - {"admissionChecks"})
