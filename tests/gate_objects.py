"""Kueue objects and a running gate for the gate's tests on the test bed's real Kueue.

``gate_queue`` makes a GPU and a CPU ResourceFlavor, a ClusterQueue whose
``admissionChecksStrategy`` runs the gate's AdmissionCheck on the GPU flavor only, a LocalQueue
``lq`` and the AdmissionCheck itself (controllerName ``gpu-auditor.io/efficiency-gate``).
``running_gate`` starts the real controller against a real store.
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator

from kueue_objects import KV, delete_cluster_object

from auditor.core.gate import GateAction, GateRule, LineageRun
from auditor.core.lineage import LineageKey
from auditor.gate.admission import AdmissionGate, GateSettings
from auditor.gate.controller import ControllerConfig, GateController
from auditor.gate.kueue import CONTROLLER_NAME
from auditor.gate.stage import core_decide
from auditor.kube.client import call_json, resource_path

HOLD_RULE = GateRule("hold-low-sm", GateAction.HOLD, verdicts=frozenset({"low_sm_efficiency"}), at_least=3, of_last=5)
PROBATION_RULE = GateRule(
    "probation-after-idle", GateAction.DEPRIORITIZE, verdicts=frozenset({"idle"}), within=timedelta(days=7)
)
RULES = [HOLD_RULE, PROBATION_RULE]


@dataclass
class GateQueue:
    cluster_queue: str
    check: str
    gpu_flavor: str
    cpu_flavor: str


def until(probe: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(every)


def condition(obj: dict, kind: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def is_true(obj: dict, kind: str) -> bool:
    return condition(obj, kind).get("status") == "True"


@contextmanager
def gate_queue(api: Any, namespace: str, *, gpus: int = 1, strategy: str = "BestEffortFIFO") -> Iterator[GateQueue]:
    case = uuid.uuid4().hex[:8]
    gpu, cpu, cq, ac = f"gpu-{case}", f"cpu-{case}", f"cq-{case}", f"gpu-efficiency-{case}"
    for rf in (gpu, cpu):
        call_json(
            api,
            resource_path(KV, "resourceflavors"),
            method="POST",
            body={"apiVersion": KV, "kind": "ResourceFlavor", "metadata": {"name": rf}},
        )
    call_json(
        api,
        resource_path(KV, "admissionchecks"),
        method="POST",
        body={
            "apiVersion": KV,
            "kind": "AdmissionCheck",
            "metadata": {"name": ac},
            "spec": {"controllerName": CONTROLLER_NAME},
        },
    )
    call_json(
        api,
        resource_path(KV, "clusterqueues"),
        method="POST",
        body={
            "apiVersion": KV,
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {"name": gpu, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}
                        ],
                    },
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [{"name": cpu, "resources": [{"name": "cpu", "nominalQuota": "4"}]}],
                    },
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": ac, "onFlavors": [gpu]}]},
            },
        },
    )
    call_json(
        api,
        resource_path(KV, "localqueues", namespace),
        method="POST",
        body={"apiVersion": KV, "kind": "LocalQueue", "metadata": {"name": "lq"}, "spec": {"clusterQueue": cq}},
    )
    try:
        yield GateQueue(cq, ac, gpu, cpu)
    finally:
        call_json(
            api,
            resource_path("batch/v1", "jobs", namespace),
            method="DELETE",
            query=[("propagationPolicy", "Background")],
        )
        call_json(api, resource_path(KV, "localqueues", namespace, "lq"), method="DELETE")
        delete_cluster_object(api, "clusterqueues", cq)
        delete_cluster_object(api, "admissionchecks", ac)
        for rf in (gpu, cpu):
            delete_cluster_object(api, "resourceflavors", rf)


def cluster_queue(api: Any, name: str) -> dict:
    return call_json(api, resource_path(KV, "clusterqueues", None, name))


def record_runs(store: Any, key: LineageKey, verdicts: list[str], now: datetime) -> None:
    """Past runs of a lineage, one a day before ``now`` (what the audit cycles would have stored)."""
    from auditor.store.lineage import LineageRecorder

    rec = LineageRecorder(store)
    for i, v in enumerate(verdicts):
        start = now - timedelta(days=len(verdicts) - i)
        rec.record(key, LineageRun(job=f"Job/{key.lineage}-old{i}", verdict=v, start=start, end=start), now)


@contextmanager
def running_gate(
    api: Any,
    store: Any,
    *,
    mode: str = "observe",
    timeout: float = 2.0,
    fail_closed: bool = False,
    holds_namespace: str | None = None,
    reader: Any = None,
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> Iterator[GateController]:
    from auditor.store.lineage import AckLog, LineageHistoryReader

    gate = AdmissionGate(
        reader or LineageHistoryReader(store),
        core_decide,
        RULES,
        GateSettings(mode=mode, timeout=timeout, fail_closed=fail_closed),
        acks=AckLog(store),
    )
    ctl = GateController(
        api,
        gate,
        ControllerConfig(holds_namespace=holds_namespace, holds_name="gpu-auditor-holds", sweep_interval=0.5),
        clock=clock,
        instance="test",
    ).start()
    try:
        assert ctl.wait_synced(30)
        yield ctl
    finally:
        ctl.stop()
        gate.close()


def gpu_job(
    api: Any, ns: str, name: str, *, lineage: str | None = None, priority_class: str | None = None, cpu: bool = False
) -> dict:
    """A one-GPU (or, ``cpu``, one-CPU) batch Job queued to ``lq``."""
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
        body={
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": labels},
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


def job(api: Any, ns: str, name: str) -> dict:
    return call_json(api, resource_path("batch/v1", "jobs", ns, name))


def workload_of(api: Any, ns: str, job_obj: dict, timeout: float = 30.0) -> dict:
    uid = job_obj["metadata"]["uid"]
    return until(
        lambda: next(
            iter(
                call_json(
                    api, resource_path(KV, "workloads", ns), query=[("labelSelector", f"kueue.x-k8s.io/job-uid={uid}")]
                ).get("items")
                or []
            ),
            None,
        ),
        f"Kueue's Workload of {job_obj['metadata']['name']}",
        timeout,
    )


def check_state(wl: dict, check: str) -> dict:
    return next((c for c in (wl.get("status") or {}).get("admissionChecks") or [] if c["name"] == check), {})


def events(api: Any, ns: str, name: str) -> list[dict]:
    items = call_json(api, resource_path("events.k8s.io/v1", "events", ns)).get("items") or []
    return [e for e in items if (e.get("regarding") or {}).get("name") == name]
