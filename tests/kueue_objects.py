"""Kueue objects for tests: the Workload of a queued job, quota, priority classes.

With the real Kueue controller in the test bed (the default), a Job labelled
``kueue.x-k8s.io/queue-name`` is suspended by Kueue's webhook and Kueue creates its Workload
(``job-<name>-<hash>``, labelled ``kueue.x-k8s.io/job-uid``, owned by the Job): tests wait for that
one instead of making their own, which Kueue would fight. With the bed's Kueue switched off
(``GPU_AUDITOR_TESTBED_KUEUE=0``: CRDs only) the same helper writes the Workload Kueue would have
made, so tests read the same either way.
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Iterator, Sequence

from kubeobjects import create_pod, iso

from auditor.kube.client import call_json, resource_path
from auditor.testbed import config

KV = "kueue.x-k8s.io/v1beta2"
JOB_UID = "kueue.x-k8s.io/job-uid"


def kueue_running() -> bool:
    """Whether the bed this session attached to runs the Kueue controller (the same switch decides)."""
    return config.kueue_enabled()


def job_workload(api: Any, namespace: str, job: dict, *, timeout: float = 30.0) -> dict:
    """The Kueue Workload of ``job`` (a created Job, as returned by the API).

    Waits for Kueue's own Workload when Kueue runs; otherwise creates, once, the one Kueue would
    have created from the Job's pod template, queue and priority-class labels.
    """
    uid = job["metadata"]["uid"]
    path = resource_path(KV, "workloads", namespace)
    deadline = time.monotonic() + timeout
    while True:
        items = call_json(api, path, query=[("labelSelector", f"{JOB_UID}={uid}")]).get("items") or []
        if items:
            return items[0]
        if not kueue_running():
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"Kueue made no Workload for Job {namespace}/{job['metadata']['name']} in {timeout:.0f} s"
            )
        time.sleep(0.2)
    meta = job["metadata"]
    tpl = job["spec"]["template"]
    labels = meta.get("labels") or {}
    priority: dict[str, Any] = {}
    if "kueue.x-k8s.io/priority-class" in labels:
        wpc = call_json(
            api, resource_path(KV, "workloadpriorityclasses", None, labels["kueue.x-k8s.io/priority-class"])
        )
        priority = {
            "priority": wpc["value"],
            "priorityClassRef": {
                "group": "kueue.x-k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": wpc["metadata"]["name"],
            },
        }
    return call_json(
        api,
        path,
        method="POST",
        body={
            "apiVersion": KV,
            "kind": "Workload",
            "metadata": {
                "name": f"job-{meta['name']}-{uuid.uuid4().hex[:5]}",
                "labels": {JOB_UID: uid},
                "ownerReferences": [
                    {
                        "apiVersion": job.get("apiVersion", "batch/v1"),
                        "kind": job.get("kind", "Job"),
                        "name": meta["name"],
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "queueName": labels.get("kueue.x-k8s.io/queue-name", ""),
                "active": True,
                **priority,
                "podSets": [
                    {
                        "name": "main",
                        "count": int(job["spec"].get("parallelism") or 1),
                        "template": {"spec": tpl["spec"]},
                    }
                ],
            },
        },
    )


def _create(api: Any, kind: str, name: str, namespace: str | None = None, **fields: Any) -> dict:
    """One Kueue object (``kind`` ResourceFlavor → plural ``resourceflavors``) with ``fields``."""
    return call_json(
        api,
        resource_path(KV, kind.lower() + ("es" if kind.endswith("s") else "s"), namespace),
        method="POST",
        body={"apiVersion": KV, "kind": kind, "metadata": {"name": name}, **fields},
    )


def workload_priority_class(api: Any, name: str, value: int) -> dict:
    """A cluster-scoped WorkloadPriorityClass (Kueue's own priority mechanism for jobs)."""
    return _create(api, "WorkloadPriorityClass", name, value=value, description="gpu-auditor test")


def delete_cluster_object(api: Any, plural: str, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        call_json(api, resource_path(KV, plural, None, name), method="DELETE")
    except ApiException as exc:
        if exc.status != 404:
            raise


def has_condition(obj: dict, kind: str, status: str = "True") -> bool:
    return any(
        c.get("type") == kind and c.get("status") == status for c in (obj.get("status") or {}).get("conditions") or []
    )


@contextmanager
def kueue_queue(
    api: Any,
    namespace: str,
    name: str,
    flavors: Sequence[tuple[str, str, int]],
    *,
    check: str | None = None,
    make_check: bool = False,
    check_on: Sequence[str] | None = None,
) -> Iterator[str]:
    """Real quota: a ResourceFlavor and a resource group per ``(flavor, resource, quota)``, the
    ClusterQueue ``name`` over them (all namespaces) and LocalQueue ``lq`` in ``namespace``. With
    ``check`` the ClusterQueue runs that AdmissionCheck (on the ``check_on`` flavors, else on all:
    Kueue then adds it to each Workload at creation); ``make_check`` creates it, for the gate's
    controller (``gpu-auditor.io/efficiency-gate``). Yields ``name``; removes what it made after."""
    from auditor.gate.kueue import CONTROLLER_NAME

    for rf, _, _ in flavors:
        _create(api, "ResourceFlavor", rf)
    if check and make_check:
        _create(api, "AdmissionCheck", check, spec={"controllerName": CONTROLLER_NAME})
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": [resource],
                "flavors": [{"name": rf, "resources": [{"name": resource, "nominalQuota": str(quota)}]}],
            }
            for rf, resource, quota in flavors
        ],
    }
    if check:
        entry: dict[str, Any] = {"name": check, **({"onFlavors": list(check_on)} if check_on is not None else {})}
        spec["admissionChecksStrategy"] = {"admissionChecks": [entry]}
    _create(api, "ClusterQueue", name, spec=spec)
    _create(api, "LocalQueue", "lq", namespace, spec={"clusterQueue": name})
    try:
        yield name
    finally:
        call_json(api, resource_path(KV, "localqueues", namespace, "lq"), method="DELETE")
        delete_cluster_object(api, "clusterqueues", name)
        if check and make_check:
            delete_cluster_object(api, "admissionchecks", check)
        for rf, _, _ in flavors:
            delete_cluster_object(api, "resourceflavors", rf)


@contextmanager
def gpu_quota(api: Any, namespace: str, *, gpus: int = 1) -> Iterator[str]:
    """Real quota: ResourceFlavor → ClusterQueue (all namespaces, ``gpus`` nvidia.com/gpu) →
    LocalQueue ``lq`` in ``namespace``; yields the ClusterQueue's name once Kueue has it Active."""
    case = uuid.uuid4().hex[:8]
    with kueue_queue(api, namespace, f"cq-{case}", [(f"rf-{case}", "nvidia.com/gpu", gpus)]) as cq:
        deadline = time.monotonic() + 30
        while not has_condition(call_json(api, resource_path(KV, "clusterqueues", None, cq)), "Active"):
            assert time.monotonic() < deadline, "ClusterQueue never became Active"
            time.sleep(0.2)
        yield cq


def gpu_job(
    api: Any,
    ns: str,
    name: str,
    priority_class: str | None = None,
    *,
    lineage: str | None = None,
    cpu: bool = False,
    dry_run: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict:
    """A one-GPU (or, ``cpu``, one-CPU) batch Job queued to LocalQueue ``lq`` (Kueue suspends it
    and makes its Workload); ``lineage`` its ``gpu-auditor.io/lineage`` label; ``dry_run``: what
    the admission chain would make of it, nothing created."""
    req = {"cpu": "1"} if cpu else {"nvidia.com/gpu": "1"}
    labels = {"kueue.x-k8s.io/queue-name": "lq"}
    if lineage:
        labels["gpu-auditor.io/lineage"] = lineage
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class
    return call_json(
        api,
        resource_path("batch/v1", "jobs", ns),
        method="POST",
        query=[("dryRun", "All")] if dry_run else None,
        body={
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": labels, **({"annotations": annotations} if annotations else {})},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "example.invalid/train:1",
                                "resources": {"requests": req, "limits": req},
                            }
                        ],
                    }
                }
            },
        },
    )


def job_controller_starts(api: Any, ns: str, job: dict, pod: str, started: datetime) -> None:
    """What the Job controller does for an unsuspended Job: one running pod, ``status.active: 1``."""
    create_pod(api, ns, pod, gpus=1, owner=job, node="gpu-node-1", started=started)
    call_json(
        api,
        resource_path("batch/v1", "jobs", ns, job["metadata"]["name"]) + "/status",
        method="PATCH",
        body={"status": {"active": 1, "startTime": iso(started)}},
        content_type="application/merge-patch+json",
    )


def job_controller_stops(api: Any, ns: str, name: str, pod: str) -> None:
    """What the Job controller does for a suspended Job: its pods deleted, ``status.active: 0``."""
    call_json(api, resource_path("v1", "pods", ns, pod), method="DELETE", query=[("gracePeriodSeconds", "0")])
    call_json(
        api,
        resource_path("batch/v1", "jobs", ns, name) + "/status",
        method="PATCH",
        body={"status": {"active": 0}},
        content_type="application/merge-patch+json",
    )
