"""The chart installed for real: its pods run on the bed's node (kubelet + containerd) from the
image built here (docs/install.md), as a user's first `helm install` would run them.

What the bed's plumbing adds to the pods (host network, the apiserver address, the ServiceAccount
token volume, the tests' scheduler) is in postrender.py; the chart itself is installed unchanged.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable, TypeVar

from kubernetes import client as k8s
from nodelib import postrender_args

from auditor.testbed import node, process

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-auditor"
T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 240) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def helm(testbed, *args: str) -> str:
    proc = subprocess.run(
        [testbed.helm, f"--kubeconfig={testbed.kubeconfig}", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def install(testbed, bed_node, namespace: str, release: str, database_url: str, core: k8s.CoreV1Api) -> None:
    core.create_namespaced_secret(
        namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="db"), string_data={"url": database_url})
    )
    sets = {
        "image.repository": bed_node.image_repository,
        "image.tag": bed_node.image_tag,
        "image.pullPolicy": "Never",
        "store.type": "postgresql",
        "store.postgresql.urlSecret.name": "db",
        "prometheus.url": testbed.prometheus_url,
        "clusterName": release,
    }
    args = [a for k, v in sets.items() for a in ("--set-string", f"{k}={v}")]
    # host network (postrender.py): a free port of the host, and one replica (two would want the
    # same port on the one node)
    args += ["--set", f"metrics.port={process.free_port()}", "--set", "replicas=1"]
    helm(testbed, "install", release, str(CHART), "-n", namespace, "--wait=false", *args, *postrender_args(testbed))


def ready_pod(core: k8s.CoreV1Api, namespace: str, component: str, exclude: str = "") -> k8s.V1Pod | None:
    for p in core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/component={component}").items:
        if p.metadata.name == exclude or p.metadata.deletion_timestamp:
            continue
        if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []):
            return p
    return None


def container_process(bed_node, pod: k8s.V1Pod) -> int:
    """The host pid of the pod's (first) container, from containerd."""
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    listed = subprocess.run(
        ["ctr", "--address", str(node.containerd_socket(bed_node.state)), "-n", "k8s.io", "tasks", "ls"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in listed.splitlines():
        fields = line.split()
        if fields and fields[0] == cid:
            return int(fields[1])
    raise AssertionError(f"container {cid} not among containerd's tasks:\n{listed}")


def cluster_view(testbed, namespace: str) -> str:
    """What a person would look at when a pod does not come up: objects and events."""
    kubectl = [testbed.kubectl, f"--kubeconfig={testbed.kubeconfig}", "-n", namespace]
    out = []
    for what in (["get", "deploy,rs,ds,pods", "-o", "wide"], ["get", "events", "--sort-by=.lastTimestamp"]):
        proc = subprocess.run(kubectl + what, capture_output=True, text=True, timeout=60)
        out.append(proc.stdout + proc.stderr)
    return "\n".join(out)


def lease_holder(coord: k8s.CoordinationV1Api, namespace: str) -> str | None:
    leases = coord.list_namespaced_lease(namespace).items
    return leases[0].spec.holder_identity if leases else None


def test_operator_runs_from_helm_install_and_survives_its_pod(
    testbed, bed_node, workload_controllers, kube_admin, namespace, release, postgres_url
):
    core, coord = k8s.CoreV1Api(kube_admin), k8s.CoordinationV1Api(kube_admin)
    install(testbed, bed_node, namespace, release, postgres_url, core)

    try:
        pod = wait_for("the operator pod Running and Ready", lambda: ready_pod(core, namespace, "operator"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster_view(testbed, namespace)}") from None
    assert pod.spec.node_name == bed_node.name
    status = pod.status.container_statuses[0]
    assert status.image.endswith(f"{bed_node.image_repository}:{bed_node.image_tag}"), status.image

    # non-root on a read-only root filesystem, seen from the host: the container's real process
    pid = container_process(bed_node, pod)
    uids = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    assert uids.split()[1:] == ["10001"] * 4, uids
    root_mount = next(
        line for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines() if line.split()[4] == "/"
    )
    assert "ro" in root_mount.split()[5].split(","), root_mount

    # the Lease, taken through the pod's own ServiceAccount token (holder = the pod's name)
    wait_for("the pod to hold the Lease", lambda: lease_holder(coord, namespace) == pod.metadata.name, timeout=120)

    # the pod deleted: its replacement (from the ReplicaSet) takes the Lease over
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=5)
    successor = wait_for(
        "a replacement operator pod Ready", lambda: ready_pod(core, namespace, "operator", exclude=pod.metadata.name)
    )
    wait_for(
        "the replacement to take the Lease",
        lambda: lease_holder(coord, namespace) == successor.metadata.name,
        timeout=120,
    )

    helm(testbed, "uninstall", release, "-n", namespace, "--wait", "--timeout=120s")
    wait_for("the release's pods gone", lambda: not core.list_namespaced_pod(namespace).items or None, timeout=120)
    left = helm(testbed, "list", "-n", namespace, "-q")
    assert left.strip() == ""
    apps = k8s.AppsV1Api(kube_admin)
    assert not apps.list_namespaced_deployment(namespace).items
    assert not apps.list_namespaced_replica_set(namespace).items
