"""The chart against the test bed's real kube-apiserver (RBAC on, no kubelet: never `--wait`).

- every rendered object is accepted by the apiserver (server-side dry run), defaults and full;
- `helm install` creates everything, `helm uninstall` removes it (the SQLite PVC is kept on purpose);
- RBAC is proven by acting as the chart's ServiceAccount (kubectl impersonation, with the groups a
  real ServiceAccount token carries): discovery, annotate, Event, Lease and (requeue on) Workload
  patch succeed; Secrets cluster-wide, pod deletion and (requeue off) Workload patches are denied.
"""

from __future__ import annotations

import json

import pytest
import yaml
from chartlib import CHART, FULL_VALUES, Chart, ServiceAccount, drop_release

pytestmark = pytest.mark.testbed

FULL_SECRETS = {
    "gpu-auditor-db": {"url": "postgresql://auditor:pw@db.example:5432/auditor"},
    "gpu-auditor-prometheus": {"token": "t0ken"},
    "gpu-auditor-alerts": {
        "slack-url": "https://hooks.slack.example/x",
        "webhook-url": "https://hook.example/",
        "webhook-hmac": "k",
        "ml-infra-slack-url": "https://hooks.slack.example/y",
    },
}


def create_secrets(chart: Chart, namespace: str, secrets: dict[str, dict[str, str]]) -> None:
    for name, data in secrets.items():
        args = [f"--from-literal={k}={v}" for k, v in data.items()]
        chart.kubectl("create", "secret", "generic", name, "-n", namespace, *args)


def release_objects(chart: Chart, namespace: str, release: str) -> dict[str, list[str]]:
    """Names of the objects carrying the release's instance label, by kind."""
    sel = f"app.kubernetes.io/instance={release}"
    kinds = {
        "ns": "deployments,daemonsets,services,serviceaccounts,configmaps,persistentvolumeclaims,roles,rolebindings,"
        "networkpolicies,poddisruptionbudgets,servicemonitors.monitoring.coreos.com,prometheusrules.monitoring.coreos.com",
        "cluster": "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings",
    }
    found: dict[str, list[str]] = {}
    for scope, k in kinds.items():
        args = ["get", k, "-l", sel, "-o", "json"] + (["-n", namespace] if scope == "ns" else [])
        for item in json.loads(chart.kubectl(*args).out)["items"]:
            found.setdefault(item["kind"], []).append(item["metadata"]["name"])
    return found


@pytest.mark.parametrize("values", [[], [FULL_VALUES]], ids=["defaults", "full"])
def test_server_side_dry_run_accepts_every_object(chart: Chart, namespace: str, values):
    text = chart.template_text(namespace=namespace, release=namespace, values=values).out
    objs = [d for d in yaml.safe_load_all(text) if d]
    res = chart.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=text)
    accepted = [line for line in res.out.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(objs), res.out + res.err


def test_install_creates_everything_and_uninstall_removes_it(chart: Chart, namespace: str):
    release = namespace
    create_secrets(chart, namespace, FULL_SECRETS)
    try:
        _install_and_uninstall(chart, namespace, release)
    finally:
        drop_release(chart, namespace, release)


def _install_and_uninstall(chart: Chart, namespace: str, release: str) -> None:
    chart.helm("install", release, str(CHART), "-n", namespace, "-f", str(FULL_VALUES), timeout=180)
    rendered = [
        d
        for d in yaml.safe_load_all(chart.template_text(namespace=namespace, release=release, values=[FULL_VALUES]).out)
        if d
    ]
    want: dict[str, list[str]] = {}
    for o in rendered:
        want.setdefault(o["kind"], []).append(o["metadata"]["name"])
    got = release_objects(chart, namespace, release)
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}
    status = chart.helm("status", release, "-n", namespace, "-o", "json")
    assert json.loads(status.out)["info"]["status"] == "deployed"

    chart.helm("uninstall", release, "-n", namespace, timeout=180)
    assert release_objects(chart, namespace, release) == {}


def test_sqlite_pvc_outlives_uninstall(chart: Chart, namespace: str):
    release = namespace
    try:
        notes = chart.helm("install", release, str(CHART), "-n", namespace).out
        assert "SQLite on PVC" in notes and "dcgmCounters.enabled=true" in notes
        chart.helm("uninstall", release, "-n", namespace)
        left = release_objects(chart, namespace, release)
        assert left == {"PersistentVolumeClaim": [f"{release}-gpu-auditor-data"]}, left
    finally:
        drop_release(chart, namespace, release)


WORKLOAD = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata: {{name: train-1, namespace: {ns}}}
spec:
  active: true
  queueName: team-a
  podSets:
    - name: main
      count: 1
      template:
        spec:
          restartPolicy: Never
          containers: [{{name: c, image: busybox}}]
"""


def test_rbac_as_the_service_account(chart: Chart, namespace: str, kube_admin):
    from kubernetes import client

    release = namespace
    other = f"{namespace}-w"  # a workload namespace
    client.CoreV1Api(kube_admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        chart.helm(
            "install", release, str(CHART), "-n", namespace, "--set", "notifications.slack.webhookUrlSecret.name=slack"
        )
        sa = ServiceAccount(chart, namespace, f"{release}-gpu-auditor", kube_admin)
        lease = f"{release}-gpu-auditor"
        chart.kubectl("create", "secret", "generic", "slack", "-n", namespace, "--from-literal=url=https://x")
        chart.kubectl("create", "secret", "generic", "unrelated", "-n", namespace, "--from-literal=a=b")
        chart.kubectl("create", "secret", "generic", "elsewhere", "-n", other, "--from-literal=a=b")
        chart.kubectl("run", "gpu-pod", "-n", other, "--image=busybox", "--restart=Never")
        chart.kubectl("create", "job", "train", "-n", other, "--image=busybox")
        chart.kubectl("apply", "-f", "-", input=WORKLOAD.format(ns=other))

        # Discovery, cluster-wide.
        for verb, res in [
            ("list", "pods"),
            ("watch", "pods"),
            ("list", "nodes"),
            ("list", "namespaces"),
            ("list", "jobs.batch"),
            ("list", "cronjobs.batch"),
            ("list", "replicasets.apps"),
            ("list", "deployments.apps"),
            ("list", "statefulsets.apps"),
            ("list", "pytorchjobs.kubeflow.org"),
            ("list", "trainjobs.trainer.kubeflow.org"),
            ("watch", "workloads.kueue.x-k8s.io"),
            ("list", "localqueues.kueue.x-k8s.io"),
        ]:
            assert sa.can(verb, res, "-A"), (verb, res)
        for group, res in [
            ("ray.io", "rayjobs"),
            ("ray.io", "rayclusters"),
            ("jobset.x-k8s.io", "jobsets"),
            ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        ]:
            assert sa.sar("watch", group, res) and sa.sar("patch", group, res), (group, res)
            assert not sa.sar("delete", group, res), (group, res)
        # Real calls through RBAC: discover, annotate, record an Event, hold the Lease.
        sa.run("get", "pods", "-A")
        sa.run("get", "workloads.kueue.x-k8s.io", "-A")
        sa.run("annotate", "pod", "gpu-pod", "-n", other, "gpu-auditor.io/verdict=low_sm_efficiency")
        sa.run("annotate", "job", "train", "-n", other, "gpu-auditor.io/verdict=low_sm_efficiency")
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "train.gpu-auditor", "namespace": other},
            "eventTime": "2026-11-30T09:00:00.000000Z",
            "reportingController": "gpu-auditor.io/operator",
            "reportingInstance": "gpu-auditor-0",
            "action": "Audit",
            "reason": "LowSmEfficiency",
            "type": "Warning",
            "note": "GPU busy, SMs idle",
            "regarding": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "namespace": other},
        }
        sa.run("create", "-f", "-", input=json.dumps(event))
        core_event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "train.core", "namespace": other},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "namespace": other},
            "reason": "LowSmEfficiency",
            "message": "m",
            "type": "Warning",
            "source": {"component": "gpu-auditor"},
        }
        sa.run("create", "-f", "-", input=json.dumps(core_event), ok=False)  # the operator writes events.k8s.io only
        lease_obj = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": lease, "namespace": namespace},
            "spec": {"holderIdentity": "pod-a", "leaseDurationSeconds": 15},
        }
        sa.run("create", "-f", "-", input=json.dumps(lease_obj))
        got = json.loads(sa.run("get", "lease", lease, "-n", namespace, "-o", "json"))
        got["spec"]["holderIdentity"] = "pod-b"
        sa.run("replace", "-f", "-", input=json.dumps(got))
        sa.run("get", "configmap", f"{release}-gpu-auditor-settings", "-n", namespace)
        sa.run("get", "secret", "slack", "-n", namespace)  # referenced in the values

        # Denied.
        assert not sa.can("get", "secrets", "-A") and not sa.can("list", "secrets", "-n", namespace)
        sa.run("get", "secrets", "-A", ok=False)
        sa.run("get", "secret", "elsewhere", "-n", other, ok=False)
        sa.run("get", "secret", "unrelated", "-n", namespace, ok=False)
        assert not sa.can("delete", "pods", "-A") and not sa.can("delete", "pods", "-n", namespace)
        sa.run("delete", "pod", "gpu-pod", "-n", other, "--wait=false", ok=False)
        assert not sa.can("patch", "workloads.kueue.x-k8s.io", "-A")
        assert not sa.can("update", "workloads.kueue.x-k8s.io", "-A")
        assert not sa.can("list", "clusterqueues.kueue.x-k8s.io")  # no code reads one
        sa.run(
            "patch",
            "workloads.kueue.x-k8s.io",
            "train-1",
            "-n",
            other,
            "--type=merge",
            "-p",
            '{"spec":{"active":false}}',
            ok=False,
        )
        assert not sa.can("update", "jobs.batch", "-A")
        assert not sa.can("create", "leases", "-n", other)
        assert not sa.can("update", "leases/someone-else", "-n", namespace)
        for verb, res in [
            ("create", "clusterrolebindings"),
            ("escalate", "clusterroles"),
            ("impersonate", "users"),
            ("create", "pods"),
            ("update", "nodes"),
            ("delete", "jobs.batch"),
        ]:
            assert not sa.can(verb, res, "-A"), (verb, res)

        # Requeue enabled: the Workload patch (deactivate, then reactivate) and Job suspend now pass.
        chart.helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set", "requeue.enabled=true")
        assert sa.can_within(True, "patch", "workloads.kueue.x-k8s.io", "-A") and sa.can("patch", "jobs.batch", "-A")
        assert not sa.can("update", "jobs.batch", "-A") and not sa.can("update", "workloads.kueue.x-k8s.io", "-A")
        assert not sa.can("list", "workloadpriorityclasses.kueue.x-k8s.io")
        sa.run_once_admitted(
            "patch",
            "workloads.kueue.x-k8s.io",
            "train-1",
            "-n",
            other,
            "--type=merge",
            "-p",
            '{"spec":{"active":false}}',
        )
        sa.run(
            "patch",
            "workloads.kueue.x-k8s.io",
            "train-1",
            "-n",
            other,
            "--type=merge",
            "-p",
            '{"spec":{"active":true}}',
        )
        # The fence's requeue-on rules can lag the upgrade by a moment (seen once: "requeue is off").
        sa.run_once_admitted("patch", "job", "train", "-n", other, "--type=merge", "-p", '{"spec":{"suspend":true}}')
        # Still denied with requeue on.
        assert not sa.can("get", "secrets", "-A") and not sa.can("delete", "pods", "-A")

        # And back off: the grant goes away with the value.
        chart.helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set", "requeue.enabled=false")
        assert not sa.can_within(False, "patch", "workloads.kueue.x-k8s.io", "-A")
        chart.helm("uninstall", release, "-n", namespace)
    finally:
        drop_release(chart, namespace, release)
        client.CoreV1Api(kube_admin).delete_namespace(other)
