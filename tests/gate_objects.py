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
from pathlib import Path
from typing import Any, Callable, Iterator

from kueue_objects import KV, kueue_queue
from kueue_objects import gpu_job as gpu_job  # the gate tests import it from here

from auditor.core.gate import GateAction, GateRule, LineageRun
from auditor.core.lineage import LineageKey
from auditor.gate.admission import AdmissionGate, GateSettings
from auditor.gate.controller import ControllerConfig, GateController
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
def gate_queue(
    api: Any, namespace: str, *, gpus: int = 1, check: str | None = None, on_flavors: bool = True
) -> Iterator[GateQueue]:
    """``check``: an AdmissionCheck that exists (the chart's), else one is made for the test.
    ``on_flavors`` False: the check runs for every flavor (Kueue adds it at the Workload's creation).
    The namespace's Jobs are deleted before the queue."""
    case = uuid.uuid4().hex[:8]
    gpu, cpu, ac = f"gpu-{case}", f"cpu-{case}", check or f"gpu-efficiency-{case}"
    flavors = [(gpu, "nvidia.com/gpu", gpus), (cpu, "cpu", 4)]
    with kueue_queue(
        api,
        namespace,
        f"cq-{case}",
        flavors,
        check=ac,
        make_check=check is None,
        check_on=[gpu] if on_flavors else None,
    ) as cq:
        try:
            yield GateQueue(cq, ac, gpu, cpu)
        finally:
            call_json(
                api,
                resource_path("batch/v1", "jobs", namespace),
                method="DELETE",
                query=[("propagationPolicy", "Background")],
            )


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
    holds_name: str = "gpu-auditor-holds",
    reader: Any = None,
    api_admin: Any = None,
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> Iterator[GateController]:
    from auditor.store.lineage import AckLog, LineageHistoryReader

    if holds_namespace:
        ensure_holds_crd(api_admin or api)
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
        ControllerConfig(holds_namespace=holds_namespace, holds_name=holds_name, sweep_interval=0.5),
        clock=clock,
        instance="test",
    ).start()
    try:
        assert ctl.wait_synced(30)
        yield ctl
    finally:
        ctl.stop()
        gate.close()


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


HOLDS_CRD = Path(__file__).resolve().parents[1] / "charts" / "gpu-auditor" / "crds" / "gateholds.gpu-auditor.io.yaml"


def ensure_holds_crd(api: Any) -> None:
    """The chart's GateHolds CRD (helm installs it once from crds/ and never removes it; so do we)."""
    import yaml
    from kubernetes.client.exceptions import ApiException

    path = resource_path("apiextensions.k8s.io/v1", "customresourcedefinitions")
    try:
        call_json(api, path, method="POST", body=yaml.safe_load(HOLDS_CRD.read_text()))
    except ApiException as exc:
        if exc.status != 409:
            raise
    until(
        lambda: is_true(call_json(api, f"{path}/gateholds.gpu-auditor.io"), "Established"),
        "the GateHolds CRD established",
    )
    until(lambda: _served(api), "gateholds served")


def _served(api: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        call_json(api, "/apis/gpu-auditor.io/v1alpha1/gateholds")
        return True
    except ApiException:
        return False


def holds_of(api: Any, namespace: str, name: str) -> dict[str, str]:
    """``spec.holds`` of a GateHolds object ({} when it does not exist)."""
    from kubernetes.client.exceptions import ApiException

    try:
        obj = call_json(api, resource_path("gpu-auditor.io/v1alpha1", "gateholds", namespace, name))
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return dict((obj.get("spec") or {}).get("holds") or {})
