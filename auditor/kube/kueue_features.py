"""Whether the cluster's Kueue acts on the ``kueue.x-k8s.io/priority-boost`` annotation.

Our requeue lowers a job's priority by writing that annotation on its Workload; Kueue v0.17.0
reads it only with its alpha ``PriorityBoost`` feature gate on (off by default:
``pkg/features/kube_features.go``; ``pkg/util/priority``: without the gate the boost is 0). The
gate is set in Kueue's manager configuration or flags, which the operator may not read; its
effect can be seen instead: with the gate on, Kueue's Workload validating webhook rejects a
boost that is not a signed integer (``pkg/webhooks/workload_webhook.go``: "must be a valid signed
integer"), without it the value is accepted. :func:`probe_priority_boost` sends such a patch as a
server-side dry run (``dryRun=All``: admission runs, nothing is stored) to one existing Workload:
the RBAC it needs is the requeue's (patch on workloads), and a cluster without Workloads cannot
say.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.kube.client import call_json, preferred_version, resource_path

KUEUE_GROUP = "kueue.x-k8s.io"
PRIORITY_BOOST = "kueue.x-k8s.io/priority-boost"
#: a value Kueue's webhook refuses while the gate is on (it is not a signed integer)
_PROBE_VALUE = "gpu-auditor-probe"
ON, OFF, UNKNOWN = "on", "off", "unknown"


@dataclass(frozen=True, slots=True)
class GateProbe:
    """What the probe found: ``state`` (on, off, unknown) and how it knows, in one line."""

    state: str
    detail: str


def probe_priority_boost(api: client.ApiClient) -> GateProbe:
    """Whether Kueue's ``PriorityBoost`` gate is on, by a dry-run patch to one Workload."""
    try:
        gv = preferred_version(api, KUEUE_GROUP)
    except ApiException as exc:
        return GateProbe(UNKNOWN, f"cannot discover the {KUEUE_GROUP} API ({exc.status} {exc.reason})")
    if gv is None:
        return GateProbe(UNKNOWN, "Kueue is not installed (no kueue.x-k8s.io API)")
    try:
        items = call_json(api, resource_path(gv, "workloads"), query=[("limit", "1")]).get("items") or []
    except ApiException as exc:
        return GateProbe(UNKNOWN, f"cannot list Workloads ({exc.status} {exc.reason})")
    if not items:
        return GateProbe(UNKNOWN, "no Workload in the cluster to probe Kueue's webhook with")
    meta = items[0].get("metadata") or {}
    where = f"Workload {meta.get('namespace')}/{meta.get('name')}"
    try:
        call_json(
            api,
            resource_path(gv, "workloads", meta.get("namespace"), meta.get("name")),
            method="PATCH",
            query=[("dryRun", "All")],
            body={"metadata": {"annotations": {PRIORITY_BOOST: _PROBE_VALUE}}},
            content_type="application/merge-patch+json",
        )
    except ApiException as exc:
        body = str(exc.body or "")
        if "denied the request" in body and PRIORITY_BOOST in body:
            return GateProbe(ON, f"Kueue's webhook refused a non-integer {PRIORITY_BOOST} on {where} (dry run)")
        return GateProbe(UNKNOWN, f"dry-run patch of {where} failed ({exc.status} {exc.reason}); requeue RBAC needed")
    return GateProbe(OFF, f"Kueue's webhook accepted a non-integer {PRIORITY_BOOST} on {where} (dry run)")
