"""Kubernetes I/O of the efficiency gate: AdmissionChecks, Workload check states, the Job.

Check states are written with server-side apply on the Workload's status subresource under our
own field manager (``gpu-auditor.io/efficiency-gate``), every field explicit: Kueue re-applies all
check entries with ForceOwnership, so a field we leave out stays as it was (a merge patch would
replace the whole list, other controllers' checks included). ``status_write="patch"`` writes by
JSON patch instead, touching only our entry's fields after a test of its name at the index the
Workload showed (an apply when the list moved): measured against the apply in the same runs
(bench/gate_latency.py ``--status-write both``) it was no faster on a Workload (the API server's
time goes to the CRD's schema, CEL rules, Kueue's webhook and etcd either way), so the apply stays
the default and the patch is kept for that comparison.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.actions.kube import KINDS, KubeActions
from auditor.actions.kube import _fail as _fail
from auditor.core.action_target import ActionTarget
from auditor.kube.client import call_json, resource_path

log = logging.getLogger(__name__)

CONTROLLER_NAME = "gpu-auditor.io/efficiency-gate"
FIELD_MANAGER = CONTROLLER_NAME
KV = "kueue.x-k8s.io/v1beta2"
APPLY = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"
#: how check states are written: ``apply`` (server-side apply, the default) or ``patch`` (JSON patch)
STATUS_WRITES = ("patch", "apply")
#: Kueue's annotation that holds a Job before quota (set only at creation, only removable later)
GATED_BY = "kueue.x-k8s.io/admission-gated-by"
#: our gate name inside that annotation (the MutatingAdmissionPolicy adds it)
OUR_GATE = "gpu-auditor.io/efficiency-ack"
#: why the MutatingAdmissionPolicy gated the Job (it copies the holds entry)
HOLD_REASON = "gpu-auditor.io/hold-reason"
#: set by the check path when it rejected the Job's Workload (JSON: lineage, reason, how to ack)
GATE_REJECTED = "gpu-auditor.io/gate-rejected"
#: the check's last decision on the Job (JSON: state, would, reason, seconds, decided_at)
GATE_DECISION = "gpu-auditor.io/gate-decision"
#: set when gpu-auditor itself released a held Job (so a missing gate is not read as the owner's ack)
GATE_RELEASED = "gpu-auditor.io/gate-released"


def gate_client(api: client.ApiClient, connections: int) -> client.ApiClient:
    """An ApiClient of the gate's own, same server and identity as ``api``, with room for
    ``connections`` kept-alive connections. The operator's shared client keeps 10 (the Python
    client's default on 2 CPUs: 5 per CPU), and its informers' watches each hold one for good;
    past that, every request opens a new TLS connection and drops it after (urllib3 discards
    what does not fit its pool), which on the test bed adds ~35 ms to a check's answer."""
    conf = copy.deepcopy(api.configuration)
    conf.connection_pool_maxsize = connections
    own = client.ApiClient(conf)
    own.default_headers.update(api.default_headers)  # impersonation, user agent
    return own


def rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_ops(wl: "WorkloadView", states: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """JSON patch operations setting our entries' fields where ``wl`` has them, each guarded by
    a test of the entry's name at that index (a list that moved fails the patch as a whole)."""
    ops: list[dict[str, Any]] = []
    for name, s in sorted(states.items()):
        at = f"/status/admissionChecks/{wl.check_order.index(name)}"
        ops.append({"op": "test", "path": f"{at}/name", "value": name})
        ops += [
            {"op": "add", "path": f"{at}/state", "value": s["state"]},
            {"op": "add", "path": f"{at}/message", "value": s["message"]},
            {"op": "add", "path": f"{at}/lastTransitionTime", "value": s["lastTransitionTime"]},
            {"op": "add", "path": f"{at}/requeueAfterSeconds", "value": int(s.get("requeueAfterSeconds") or 0)},
        ]
    return ops


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def _true(obj: Mapping[str, Any], kind: str) -> bool:
    return _condition(obj, kind).get("status") == "True"


@dataclass(frozen=True)
class WorkloadView:
    """What the gate reads from a Workload."""

    namespace: str
    name: str
    uid: str
    owner_kind: str
    owner_name: str
    owner_uid: str
    cluster_queue: str
    quota_reserved: bool
    #: ``Evicted=True``: Kueue is taking the quota back (our check reset to Pending on the way)
    evicted: bool
    admitted: bool
    finished: bool
    active: bool
    quota_reserved_at: str
    priority_class: str
    #: check name → its current state entry
    checks: dict[str, dict] = field(default_factory=dict)
    #: the check names in ``status.admissionChecks`` order (where a JSON patch finds each)
    check_order: tuple[str, ...] = ()

    @classmethod
    def parse(cls, wl: Mapping[str, Any]) -> "WorkloadView":
        meta = wl.get("metadata") or {}
        spec = wl.get("spec") or {}
        status = wl.get("status") or {}
        owner: dict[str, Any] = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), {})
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            owner_kind=str(owner.get("kind") or ""),
            owner_name=str(owner.get("name") or ""),
            owner_uid=str(owner.get("uid") or ""),
            cluster_queue=str((status.get("admission") or {}).get("clusterQueue") or ""),
            quota_reserved=_true(wl, "QuotaReserved"),
            evicted=_true(wl, "Evicted"),
            admitted=_true(wl, "Admitted"),
            finished=_true(wl, "Finished"),
            active=spec.get("active", True) is not False,
            quota_reserved_at=str(_condition(wl, "QuotaReserved").get("lastTransitionTime") or ""),
            priority_class=str((spec.get("priorityClassRef") or {}).get("name") or ""),
            checks={str(c.get("name")): dict(c) for c in status.get("admissionChecks") or []},
            check_order=tuple(str(c.get("name")) for c in status.get("admissionChecks") or []),
        )

    @property
    def awaits_checks(self) -> bool:
        """Holds quota for its checks: not finished, not being evicted (answering a check that
        Kueue reset to Pending during an eviction would undo the eviction)."""
        return self.quota_reserved and not self.evicted and not self.finished

    @property
    def answerable(self) -> bool:
        """Its checks may be answered: holding quota for them (:attr:`awaits_checks`), or still
        queued, before quota. Kueue puts a check on a queued Workload when the check runs for
        every flavor of its ClusterQueue (it can match ``onFlavors`` only once a flavor is
        assigned), keeps an answer given then, and admits at the reservation itself."""
        return self.awaits_checks or (
            not self.quota_reserved and self.active and not self.evicted and not self.finished
        )

    @property
    def job(self) -> dict[str, str]:
        """The owner as the policy actions address a job (``{"namespace", "job": "Kind/name"}``)."""
        return {"namespace": self.namespace, "job": f"{self.owner_kind}/{self.owner_name}", "uid": self.owner_uid}


class KueueGateApi:
    """The gate's calls to the API server, through one ``ApiClient``."""

    def __init__(
        self,
        api: client.ApiClient,
        instance: str = "gpu-auditor",
        *,
        controller: str = CONTROLLER_NAME,
        status_write: str = "apply",
    ):
        self.api = api
        self.controller = controller
        self.actions = KubeActions(api, instance)
        self.status_write = status_write

    # ------------------------------------------------------------------ AdmissionChecks

    def our_checks(self, checks: list[dict] | None = None) -> dict[str, dict]:
        """Our AdmissionChecks (name → object): those whose ``spec.controllerName`` is ours."""
        if checks is None:
            try:
                checks = call_json(self.api, resource_path(KV, "admissionchecks")).get("items") or []
            except ApiException as exc:
                raise _fail(exc, "list AdmissionChecks") from None
        return {
            c["metadata"]["name"]: c for c in checks if (c.get("spec") or {}).get("controllerName") == self.controller
        }

    def ensure_active(self, check: Mapping[str, Any], now: datetime) -> bool:
        """Set ``Active=True`` on one of our AdmissionChecks (until then its ClusterQueues admit
        nothing); True when it wrote (False: it already was)."""
        meta = check.get("metadata") or {}
        cond = _condition(check, "Active")
        gen = meta.get("generation")
        if cond.get("status") == "True" and cond.get("observedGeneration") == gen:
            return False
        body = {
            "apiVersion": KV,
            "kind": "AdmissionCheck",
            "metadata": {"name": meta["name"]},
            "status": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Active",
                        "message": "gpu-auditor's efficiency gate is running",
                        "lastTransitionTime": rfc3339(now),
                        **({"observedGeneration": gen} if gen is not None else {}),
                    }
                ]
            },
        }
        self._apply_status(
            resource_path(KV, "admissionchecks", None, meta["name"]), body, f"set AdmissionCheck {meta['name']} Active"
        )
        return True

    def _apply_status(self, path: str, body: dict, what: str) -> dict:
        """Server-side apply ``body`` on the status subresource at ``path``, as our field manager."""
        try:
            return call_json(
                self.api,
                path + "/status",
                method="PATCH",
                body=body,
                content_type=APPLY,
                query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            )
        except ApiException as exc:
            raise _fail(exc, what) from None

    # ------------------------------------------------------------------ Workloads

    def write_checks(
        self, wl: WorkloadView, states: Mapping[str, Mapping[str, Any]], *, how: str | None = None
    ) -> dict:
        """Write our check entries (name → {state, message, lastTransitionTime,
        requeueAfterSeconds}) on the Workload's status: by JSON patch at the places ``wl`` shows
        them, else (``how`` ``apply``, an entry ``wl`` lacks, or the list moved since) by
        server-side apply. Returns the Workload as written."""
        if (how or self.status_write) == "patch" and all(n in wl.check_order for n in states):
            try:
                return call_json(
                    self.api,
                    resource_path(KV, "workloads", wl.namespace, wl.name) + "/status",
                    method="PATCH",
                    body=_check_ops(wl, states),
                    content_type=JSON_PATCH,
                    query=[("fieldManager", FIELD_MANAGER)],
                )
            except ApiException as exc:
                if exc.status != 422:  # 422: a test failed (the list moved since ``wl``): apply instead
                    raise _fail(exc, f"write the check state of Workload {wl.namespace}/{wl.name}") from None
                log.debug("gate: Workload %s/%s: checks moved, applying instead (%s)", wl.namespace, wl.name, exc)
        return self._apply_checks(wl, states)

    def _apply_checks(self, wl: WorkloadView, states: Mapping[str, Mapping[str, Any]]) -> dict:
        entries = [
            {
                "name": name,
                "state": s["state"],
                "message": s["message"],
                "lastTransitionTime": s["lastTransitionTime"],
                "requeueAfterSeconds": int(s.get("requeueAfterSeconds") or 0),
            }
            for name, s in sorted(states.items())
        ]
        body = {
            "apiVersion": KV,
            "kind": "Workload",
            "metadata": {"name": wl.name, "namespace": wl.namespace},
            "status": {"admissionChecks": entries},
        }
        return self._apply_status(
            resource_path(KV, "workloads", wl.namespace, wl.name),
            body,
            f"write the check state of Workload {wl.namespace}/{wl.name}",
        )

    def workload(self, namespace: str, name: str) -> dict | None:
        try:
            return call_json(self.api, resource_path(KV, "workloads", namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _fail(exc, f"read Workload {namespace}/{name}") from None

    def workloads_of(self, namespace: str, owner_uid: str) -> list[dict]:
        try:
            doc = call_json(
                self.api,
                resource_path(KV, "workloads", namespace),
                query=[("labelSelector", f"kueue.x-k8s.io/job-uid={owner_uid}")],
            )
        except ApiException as exc:
            raise _fail(exc, f"list the Workloads of job {owner_uid} in {namespace}") from None
        return list(doc.get("items") or [])

    def delete_workload(self, namespace: str, name: str) -> bool:
        """Delete a rejected Workload so that Kueue recreates it from the suspended Job: re-activating
        a Workload deactivated by an AdmissionCheck sticks on Kueue v0.17 (kubernetes-sigs/kueue#14870)."""
        try:
            call_json(self.api, resource_path(KV, "workloads", namespace, name), method="DELETE")
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _fail(exc, f"delete Workload {namespace}/{name}") from None

    def pending_workloads(self, cluster_queue: str) -> int | None:
        """``status.pendingWorkloads`` of a ClusterQueue (None when it cannot be read)."""
        try:
            cq = call_json(self.api, resource_path(KV, "clusterqueues", None, cluster_queue))
        except ApiException as exc:
            log.warning("cannot read ClusterQueue %s: HTTP %s %s", cluster_queue, exc.status, exc.reason)
            return None
        return int((cq.get("status") or {}).get("pendingWorkloads") or 0)

    # ------------------------------------------------------------------ the job

    def owner(self, wl: WorkloadView) -> dict | None:
        return self.actions.get(wl.owner_kind, wl.namespace, wl.owner_name) if wl.owner_kind in KINDS else None

    def jobs(self, namespace: str) -> list[dict]:
        """The namespace's batch Jobs (the gated path holds batch Jobs)."""
        try:
            return list(call_json(self.api, resource_path("batch/v1", "jobs", namespace)).get("items") or [])
        except ApiException as exc:
            raise _fail(exc, f"list Jobs in {namespace}") from None

    def ungate(self, job: Mapping[str, Any], *, released: str) -> bool:
        """Remove our gate from the Job's ``kueue.x-k8s.io/admission-gated-by`` (other gates stay),
        marking it released by us. A JSON patch with a test: a concurrent change fails it (409/422)
        instead of being overwritten. False when our gate was not there."""
        meta = job.get("metadata") or {}
        ann = meta.get("annotations") or {}
        gates = [g.strip() for g in str(ann.get(GATED_BY) or "").split(",") if g.strip()]
        if OUR_GATE not in gates:
            return False
        rest = [g for g in gates if g != OUR_GATE]
        key = "/metadata/annotations/" + GATED_BY.replace("~", "~0").replace("/", "~1")
        ops: list[dict[str, Any]] = [{"op": "test", "path": key, "value": ann[GATED_BY]}]
        ops.append({"op": "replace", "path": key, "value": ",".join(rest)} if rest else {"op": "remove", "path": key})
        ops.append(
            {"op": "add", "path": "/metadata/annotations/" + GATE_RELEASED.replace("/", "~1"), "value": released}
        )
        kind = str(job.get("kind") or "Job")
        path = resource_path("batch/v1", "jobs", meta["namespace"], meta["name"])
        try:
            call_json(self.api, path, method="PATCH", body=ops, content_type="application/json-patch+json")
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _fail(exc, f"remove the admission gate of {kind} {meta['namespace']}/{meta['name']}") from None
        return True

    def annotate(self, wl: WorkloadView, annotations: Mapping[str, Any]) -> None:
        self.actions.annotate(
            ActionTarget.of_ref(wl.job),
            {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in annotations.items()},
        )

    def event(self, wl: WorkloadView, *, key: str, reason: str, note: str, now: datetime, warning: bool) -> None:
        self.actions.event(
            ActionTarget.of_ref(wl.job),
            key=key,
            reason=reason,
            note=note,
            action="AdmissionCheck",
            now=now,
            type_="Warning" if warning else "Normal",
            uid=wl.owner_uid or None,  # no read of the Job for it: one request less per answer
        )
