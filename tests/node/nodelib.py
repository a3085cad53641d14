"""Helpers of the node tests (imported by name, like tests/chart/chartlib.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from kubernetes import client as k8s

from auditor.testbed import node

SCHEDULER = "gpu-auditor-testbed"
CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-auditor"
T = TypeVar("T")


def postrender_args(testbed, devices: Sequence[str], trace: str, phase: str) -> list[str]:
    port = int(testbed.apiserver_url.rsplit(":", 1)[1])
    script = Path(__file__).with_name("postrender.py")
    opts = {"apiserver_port": port, "scheduler": SCHEDULER, "devices": list(devices), "trace": trace, "phase": phase}
    return [
        "--post-renderer",
        sys.executable,
        "--post-renderer-args",
        str(script),
        "--post-renderer-args",
        json.dumps(opts),
    ]


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 180, explain: Callable[[], str] = str) -> T:
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            print(f"node tests: {what}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
            return got
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{explain()}")


def helm(testbed, *args: str) -> str:
    proc = subprocess.run(
        [testbed.helm, f"--kubeconfig={testbed.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HOME": "/tmp", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, f"helm {' '.join(args[:2])}: {proc.stderr}"
    return proc.stdout


def ready_pods(core: k8s.CoreV1Api, namespace: str, component: str) -> list[k8s.V1Pod]:
    return [
        p
        for p in core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/component={component}").items
        if not p.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]


def container_pid(state, pod: k8s.V1Pod, index: int = 0) -> int:
    """The host pid of one of the pod's containers, from the node's containerd."""
    cid = pod.status.container_statuses[index].container_id.split("://", 1)[1]
    listed = subprocess.run(
        ["ctr", "--address", str(node.containerd_socket(state)), "-n", "k8s.io", "tasks", "ls"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in listed.splitlines():
        fields = line.split()
        if fields and fields[0] == cid:
            return int(fields[1])
    raise AssertionError(f"container {cid} not among containerd's tasks:\n{listed}")


def process_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def cluster_view(testbed, namespace: str, pod_logs: Path) -> str:
    """What a person would look at when a pod does not come up: objects, events and the last
    lines of the namespace's container logs (read on the node: the kubelet listens on loopback,
    where the apiserver's ``kubectl logs`` cannot reach it)."""
    kubectl = [testbed.kubectl, f"--kubeconfig={testbed.kubeconfig}", "-n", namespace]
    out = []
    for what in (["get", "deploy,rs,ds,pods", "-o", "wide"], ["get", "events", "--sort-by=.lastTimestamp"]):
        proc = subprocess.run(kubectl + what, capture_output=True, text=True, timeout=60)
        out.append(proc.stdout + proc.stderr)
    for log in sorted(pod_logs.glob(f"{namespace}_*/*/*.log")):
        lines = log.read_text(errors="replace").splitlines()[-40:]
        out.append(f"--- {log.relative_to(pod_logs)}\n" + "\n".join(lines))
    return "\n".join(out)


def lease_holder(coord: k8s.CoordinationV1Api, namespace: str, name: str) -> str:
    try:
        return coord.read_namespaced_lease(name, namespace).spec.holder_identity or ""
    except k8s.ApiException as exc:
        if exc.status == 404:
            return ""
        raise
