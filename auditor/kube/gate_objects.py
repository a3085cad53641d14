"""The Kueue objects ``doctor`` looks at for the efficiency gate, read once through the API.

Doctor (a use-case, no Kubernetes imports) judges plain JSON: the gate's AdmissionChecks (those
whose ``spec.controllerName`` is the gate's, as the controller itself finds them) and every
ClusterQueue (which list them, on which flavors, which have GPU quota). Reading needs list on
``admissionchecks`` and ``clusterqueues`` (an admin's kubeconfig has it); a refusal is said, not
raised, so the rest of the checklist still prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.kube.client import call_json, preferred_version, resource_path
from auditor.kube.kueue_features import KUEUE_GROUP


@dataclass(frozen=True)
class GateObjects:
    """What was read: a list is None when it could not be read, and ``error`` says why (the
    operator's own ServiceAccount may list AdmissionChecks but only get ClusterQueues)."""

    checks: list[dict] | None = None
    queues: list[dict] | None = None
    error: str = ""


def read_gate_objects(api: client.ApiClient, controller: str) -> GateObjects:
    """The AdmissionChecks of ``controller`` (the gate's, auditor/gate/kueue.py) and all
    ClusterQueues, at the server's preferred Kueue version."""
    try:
        gv = preferred_version(api, KUEUE_GROUP)
    except ApiException as exc:
        return GateObjects(error=f"cannot discover the {KUEUE_GROUP} API ({exc.status} {exc.reason})")
    if gv is None:
        return GateObjects(error="Kueue is not installed (no kueue.x-k8s.io API)")
    try:
        items = call_json(api, resource_path(gv, "admissionchecks")).get("items") or []
    except ApiException as exc:
        return GateObjects(error=f"cannot list admissionchecks ({exc.status} {exc.reason})")
    mine = [c for c in items if (c.get("spec") or {}).get("controllerName") == controller]
    try:
        queues = call_json(api, resource_path(gv, "clusterqueues")).get("items") or []
    except ApiException as exc:
        return GateObjects(mine, None, f"cannot list clusterqueues ({exc.status} {exc.reason})")
    return GateObjects(mine, queues)
