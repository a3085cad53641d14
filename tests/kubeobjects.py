"""Helpers for the operator tests: create workloads the way their controllers would.

The test bed has no kubelet and no Job/ReplicaSet/... controllers (docs/testbed.md): the tests
create the owner objects and their pods (with ownerReferences) themselves and patch pod status.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from auditor.kube.client import call_json, resource_path


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def create(api: Any, api_version: str, plural: str, namespace: str | None, body: dict) -> dict:
    return call_json(api, resource_path(api_version, plural, namespace), method="POST", body=body)


def owner_ref(obj: dict) -> dict:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_template(gpus: float = 0, *, mig: str | None = None, labels: dict | None = None) -> dict:
    res: dict = {}
    if gpus:
        res = {"limits": {"nvidia.com/gpu": str(int(gpus))}}
    if mig:
        res = {"limits": {f"nvidia.com/mig-{mig}": "1"}}
    return {
        "metadata": {"labels": dict(labels or {})},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "example.invalid/train:1", "resources": res}],
        },
    }


def create_pod(
    api: Any,
    namespace: str,
    name: str,
    *,
    gpus: float = 0,
    owner: dict | None = None,
    labels: dict | None = None,
    node: str = "gpu-node-1",
    started: datetime | None = None,
    phase: str = "Running",
) -> dict:
    tpl = pod_template(gpus, labels=labels)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": tpl["metadata"]["labels"]},
        "spec": {**tpl["spec"], "nodeName": node},
    }
    if owner is not None:
        body["metadata"]["ownerReferences"] = [owner_ref(owner)]
    pod = create(api, "v1", "pods", namespace, body)
    if started is not None:
        set_pod_status(api, namespace, name, phase=phase, started=started)
    return pod


def set_pod_status(
    api: Any, namespace: str, name: str, *, phase: str, started: datetime, finished: datetime | None = None
) -> None:
    state: dict = {"running": {"startedAt": iso(started)}}
    if finished is not None:
        state = {
            "terminated": {
                "exitCode": 0 if phase == "Succeeded" else 1,
                "reason": "Completed",
                "startedAt": iso(started),
                "finishedAt": iso(finished),
            }
        }
    status = {
        "phase": phase,
        "startTime": iso(started),
        "containerStatuses": [
            {
                "name": "main",
                "image": "example.invalid/train:1",
                "imageID": "",
                "ready": phase == "Running",
                "restartCount": 0,
                "state": state,
            }
        ],
    }
    call_json(
        api,
        resource_path("v1", "pods", namespace, name) + "/status",
        method="PATCH",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


def batch_job(api: Any, namespace: str, name: str, *, labels: dict | None = None, suspend: bool = False) -> dict:
    tpl = pod_template(0)
    return create(
        api,
        "batch/v1",
        "jobs",
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"suspend": suspend, "template": tpl},
        },
    )


def replayed_job_pods(
    api: Any,
    prometheus: Any,
    namespace: str,
    job: dict,
    *,
    case: str,
    phase: str,
    end: datetime,
    duration: timedelta,
    interval: timedelta,
    pods: int = 2,
    gpus: int = 4,
    labels: dict | None = None,
    first_node: int = 0,
) -> None:
    """``pods`` pods of ``job`` (``<job>-<k>-abcde``, each on its own node ``<case>-node<n>``,
    ``n = first_node + k``, ``gpus`` GPUs each: the same node's GPUs in two jobs are shared)
    whose DCGM history is the demo trace's ``phase`` over ``[end - duration, end)``, backfilled
    into Prometheus under the label ``case`` (tests share one TSDB)."""
    import re

    from auditor import traces
    from auditor.core.model import PodRef

    trace = traces.load_trace("h200-demo-cluster")
    tjs = []
    for k in range(pods):
        pod = f"{job['metadata']['name']}-{k}-abcde"
        node = f"{case}-node{first_node + k}"
        create_pod(api, namespace, pod, gpus=gpus, owner=job, labels=labels, node=node, started=end - duration)
        tjs.append(
            traces.TraceJob(PodRef(namespace, pod, "main"), traces.make_gpus(gpus, node), phase, duration=duration)
        )
    text = traces.trace_to_openmetrics(trace, tjs, end=end, duration=duration, interval=interval)
    prometheus.backfill(re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M))
