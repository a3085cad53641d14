"""Kubernetes writes for policy actions, through the official ``kubernetes`` client.

Objects are addressed generically (group/version/plural) so that every job kind the resolver
knows (batch Job, JobSet, Kubeflow jobs, RayJob, ...) can be annotated; only suspendable kinds
can be requeued (see :meth:`KubeActions.deactivate`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any, Mapping

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.core.action_target import ActionTarget
from auditor.core.kinds import JOB_KINDS, KUEUE_GROUP, KUEUE_JOB_UID_LABEL, KUEUE_QUEUE_LABEL
from auditor.errors import PermanentError, RetryableError
from auditor.errors import RequeueRefused as RequeueRefused  # re-exported
from auditor.policy.evaluate import JobFacts

log = logging.getLogger(__name__)

#: kind → (group, version, plural) of the job kinds we may write to (the one table is
#: :data:`auditor.core.kinds.JOB_KINDS`)
KINDS: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {k: (v.group, v.version, v.plural) for k, v in JOB_KINDS.items()}
)
#: Kueue's annotation for external controllers to shift a Workload's effective priority (signed
#: integer added to spec.priority; read only with Kueue's PriorityBoost feature gate on)
KUEUE_PRIORITY_BOOST = "kueue.x-k8s.io/priority-boost"
REPORTING_CONTROLLER = "gpu-auditor.io/operator"
_ANNOTATION_VALUE_MAX = 1024


def _fail(exc: ApiException, what: str) -> Exception:
    msg = f"{what}: HTTP {exc.status} {exc.reason}"
    if exc.status in (429, 500, 502, 503, 504) or exc.status is None:
        return RetryableError(msg)
    return PermanentError(msg)


def _job(target: ActionTarget) -> tuple[str, str, str]:
    """(kind, namespace, name) of the target's job."""
    return target.key.kind, target.key.namespace, target.key.name


def _api_path(kind: str, namespace: str, name: str | None = None) -> str:
    return JOB_KINDS[kind].path(namespace, name)


def _holds_quota(wl: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "QuotaReserved" and c.get("status") == "True"
        for c in (wl.get("status") or {}).get("conditions") or []
    )


def _priority_boost(wl: Mapping[str, Any]) -> int:
    """The Workload's current ``kueue.x-k8s.io/priority-boost`` (0 when absent; Kueue's webhook
    refuses a value that is not a signed integer, so a bad one is read as 0 as Kueue does)."""
    raw = ((wl.get("metadata") or {}).get("annotations") or {}).get(KUEUE_PRIORITY_BOOST)
    try:
        return int(raw) if raw else 0
    except ValueError:
        return 0


def _lowered(target: Mapping[str, Any], by: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metadata patch lowering a Workload's priority boost by ``by``, and what to record."""
    boost = int(target.get("priority_boost") or 0) - by
    extra: dict[str, Any] = {"new_priority_boost": boost}
    if isinstance(target.get("priority"), int):
        extra["effective_priority"] = target["priority"] + boost
    return {"annotations": {KUEUE_PRIORITY_BOOST: str(boost)}}, extra


def _clean_value(v: Any) -> str:
    s = "" if v is None else str(v)
    s = re.sub(r"[\x00-\x1f\x7f]", " ", s)
    return s[:_ANNOTATION_VALUE_MAX]


@dataclass
class KubeActions:
    """The policy side effects on one cluster, through one ``ApiClient``.

    ``instance`` is this replica's identity (the Event's reportingInstance).
    """

    api: client.ApiClient
    instance: str = "gpu-auditor"
    _workload_gv: str | None = field(default=None, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------ raw calls

    def _call(
        self, method: str, path: str, body: Any = None, *, patch: str = "merge", query: list | None = None
    ) -> Any:
        headers = {"Accept": "application/json"}
        if method == "PATCH":
            headers["Content-Type"] = {"merge": "application/merge-patch+json", "json": "application/json-patch+json"}[
                patch
            ]
        elif body is not None:
            headers["Content-Type"] = "application/json"
        params = self.api.param_serialize(
            method, path, query_params=query or [], header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        resp = self.api.call_api(*params, _request_timeout=30)
        raw = resp.read()
        if not 200 <= resp.status < 300:
            exc = ApiException(status=resp.status, reason=resp.reason)
            exc.body = raw
            raise exc
        return json.loads(raw) if raw else {}

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        if kind not in KINDS:
            return None
        try:
            return self._call("GET", _api_path(kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _fail(exc, f"read {kind} {namespace}/{name}") from None

    # ------------------------------------------------------------------ facts

    def facts(self, target: ActionTarget) -> JobFacts:
        """The job's and its namespace's labels and annotations (empty when the job is gone)."""
        kind, ns, name = _job(target)
        obj = self.get(kind, ns, name) if kind in KINDS else None
        ns_ann: dict[str, str] = {}
        try:
            ns_obj = self._call("GET", f"/api/v1/namespaces/{ns}")
            ns_ann = dict((ns_obj.get("metadata") or {}).get("annotations") or {})
        except ApiException as exc:
            if exc.status != 404:
                raise _fail(exc, f"read namespace {ns}") from None
        if obj is None:
            return JobFacts(namespace_annotations=ns_ann, known=False)
        md = obj.get("metadata") or {}
        return JobFacts(dict(md.get("annotations") or {}), dict(md.get("labels") or {}), ns_ann, True)

    # ------------------------------------------------------------------ annotate

    def annotate(self, target: ActionTarget, annotations: Mapping[str, Any]) -> dict:
        """Merge-patch ``annotations`` (all under gpu-auditor.io/) onto the job and its pods."""
        for k in annotations:
            if not k.startswith("gpu-auditor.io/"):
                raise ValueError(f"refusing to write annotation {k!r} outside gpu-auditor.io/")
        body = {"metadata": {"annotations": {k: _clean_value(v) for k, v in annotations.items()}}}
        kind, ns, name = _job(target)
        done: list[str] = []
        missing: list[str] = []
        targets = [(kind, name)] + [("Pod", p) for p in target.pods if not (kind == "Pod" and p == name)]
        for k, n in targets:
            if k not in KINDS:
                missing.append(f"{k}/{n} (unknown kind)")
                continue
            try:
                self._call("PATCH", _api_path(k, ns, n), body)
                done.append(f"{k}/{n}")
            except ApiException as exc:
                if exc.status == 404:
                    missing.append(f"{k}/{n}")
                    continue
                raise _fail(exc, f"annotate {k} {ns}/{n}") from None
        return {"annotated": done, "missing": missing}

    # ------------------------------------------------------------------ events

    def event(
        self,
        target: ActionTarget,
        *,
        key: str,
        reason: str,
        note: str,
        action: str,
        now: datetime,
        type_: str = "Warning",
        uid: str | None = None,
    ) -> dict:
        """Create one events.k8s.io/v1 Event on the job, named after ``key`` (dedup: 409 = done).
        ``uid``: the job's, known to the caller (the gate has it from the Workload's owner); else
        the job is read for it."""
        kind, ns, name = _job(target)
        group, version, _ = KINDS.get(kind, ("", "v1", ""))
        if uid is None:
            obj = self.get(kind, ns, name) if kind in KINDS else None
            uid = ((obj or {}).get("metadata") or {}).get("uid") or target.uid
        ev_name = f"{name[:200]}.gpa-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": ev_name, "namespace": ns, "labels": {"app.kubernetes.io/managed-by": "gpu-auditor"}},
            "eventTime": now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.instance[:128],
            "action": action[:128],
            "reason": reason[:128],
            "note": note[:1024],
            "type": type_,
            "regarding": {
                "apiVersion": f"{group}/{version}" if group else version,
                "kind": kind,
                "name": name,
                "namespace": ns,
                **({"uid": uid} if uid else {}),
            },
        }
        try:
            self._call("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", body)
            return {"event": ev_name, "created": True}
        except ApiException as exc:
            if exc.status == 409:
                return {"event": ev_name, "created": False, "already": True}
            raise _fail(exc, f"create Event on {kind} {ns}/{name}") from None

    # ------------------------------------------------------------------ requeue

    def _workloads(self, namespace: str, name: str = "") -> str | None:
        """Path of Workloads at the version the apiserver prefers (discovered once: Kueue serves
        v1beta1 and v1beta2 side by side, and a later release may drop one); None without Kueue."""
        if self._workload_gv is None:
            try:
                doc = self._call("GET", f"/apis/{KUEUE_GROUP}")
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise _fail(exc, f"discover the {KUEUE_GROUP} API") from None
            self._workload_gv = (doc.get("preferredVersion") or {}).get("groupVersion") or f"{KUEUE_GROUP}/v1beta2"
        return f"/apis/{self._workload_gv}/namespaces/{namespace}/workloads" + (f"/{name}" if name else "")

    def find_workload(self, namespace: str, job_uid: str | None, job_name: str) -> dict | None:
        """The Kueue Workload of a job: by the ``kueue.x-k8s.io/job-uid`` label, else by owner."""
        path = self._workloads(namespace)
        if path is None:
            return None  # Kueue not installed
        try:
            if job_uid:
                items = (
                    self._call("GET", path, query=[("labelSelector", f"{KUEUE_JOB_UID_LABEL}={job_uid}")]).get("items")
                    or []
                )
                if items:
                    return items[0]
            for wl in self._call("GET", path).get("items") or []:
                for ref in (wl.get("metadata") or {}).get("ownerReferences") or []:
                    if ref.get("name") == job_name and (not job_uid or ref.get("uid") == job_uid):
                        return wl
        except ApiException as exc:
            if exc.status == 404:
                return None  # Kueue not installed
            raise _fail(exc, f"list Workloads in {namespace}") from None
        return None

    def _workload_path(self, namespace: str, name: str) -> str:
        path = self._workloads(namespace, name)
        if path is None:
            raise RequeueRefused(f"Workload {namespace}/{name}: the {KUEUE_GROUP} API is no longer served")
        return path

    def requeue_target(self, target: ActionTarget) -> dict:
        """What a requeue of this job would patch: ``{"type": "workload"|"job", ...}``.

        Refuses kinds that cannot be suspended (a bare Pod would be killed for good) and Workloads
        that have finished."""
        kind, ns, name = _job(target)
        if kind == "Pod" or kind not in KINDS:
            raise RequeueRefused(f"{kind}/{name}: a {kind or 'job'} cannot be requeued (not suspendable)")
        obj = self.get(kind, ns, name)
        if obj is None:
            raise RequeueRefused(f"{kind} {ns}/{name} no longer exists")
        uid = (obj.get("metadata") or {}).get("uid")
        wl = self.find_workload(ns, uid, name)
        if wl is not None:
            for c in (wl.get("status") or {}).get("conditions") or []:
                if c.get("type") == "Finished" and c.get("status") == "True":
                    raise RequeueRefused(f"Workload {ns}/{wl['metadata']['name']} has finished")
            return {
                "type": "workload",
                "namespace": ns,
                "name": wl["metadata"]["name"],
                "priority": (wl.get("spec") or {}).get("priority"),
                "priority_boost": _priority_boost(wl),
                "reserved": _holds_quota(wl),
            }
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if kind == "Job" and KUEUE_QUEUE_LABEL not in labels:
            return {"type": "job", "namespace": ns, "name": name}
        raise RequeueRefused(f"{kind} {ns}/{name}: no Kueue Workload found and not a plain batch Job")

    def deactivate(self, target: dict, *, lower_priority_by: int = 0) -> dict:
        """Step 1 of a requeue: Workload ``spec.active=false`` (Kueue evicts and suspends the job),
        or a plain Job's ``spec.suspend=true``.

        ``lower_priority_by`` lowers the Workload's effective priority through Kueue's own
        ``kueue.x-k8s.io/priority-boost`` annotation (its current value minus the amount), in the
        same patch. Kueue owns ``spec.priority`` (it re-derives it from the job's priority class when
        that changes), so a hand-edited one may not last; the boost is Kueue's interface
        for external controllers and is kept across re-admission."""
        ns, name = target["namespace"], target["name"]
        try:
            if target["type"] == "workload":
                body: dict[str, Any] = {"spec": {"active": False}}
                extra: dict[str, Any] = {}
                if lower_priority_by:
                    body["metadata"], extra = _lowered(target, lower_priority_by)
                self._call("PATCH", self._workload_path(ns, name), body)
                return {**target, "active": False, **extra}
            self._call("PATCH", _api_path("Job", ns, name), {"spec": {"suspend": True}})
            return {**target, "suspend": True}
        except ApiException as exc:
            if exc.status == 404:
                raise RequeueRefused(f"{target['type']} {ns}/{name} is gone") from None
            raise _fail(exc, f"deactivate {target['type']} {ns}/{name}") from None

    def lower_priority(self, target: Mapping[str, Any], by: int) -> dict:
        """Lower a Workload's effective priority by ``by`` through ``kueue.x-k8s.io/priority-boost``
        alone (the requeue through the gate's check, which leaves ``spec.active`` as it is); what
        :meth:`deactivate` adds to its result for the same (``new_priority_boost``, ...)."""
        ns, name = str(target["namespace"]), str(target["name"])
        meta, extra = _lowered(target, by)
        try:
            self._call("PATCH", self._workload_path(ns, name), {"metadata": meta})
        except ApiException as exc:
            if exc.status == 404:
                raise RequeueRefused(f"workload {ns}/{name} is gone") from None
            raise _fail(exc, f"lower the priority of Workload {ns}/{name}") from None
        return extra

    def holds_quota(self, target: Mapping[str, Any]) -> bool | None:
        """Whether a requeued Workload still has quota reserved (``QuotaReserved=True``): Kueue
        keeps it until the evicted job has no active pods. None when the Workload is gone."""
        ns, name = str(target["namespace"]), str(target["name"])
        try:
            wl = self._call("GET", self._workload_path(ns, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _fail(exc, f"read Workload {ns}/{name}") from None
        return _holds_quota(wl)

    def reactivate(self, target: dict) -> dict:
        """Step 2, after our backoff: ``spec.active=true`` (Kueue requeues it) or ``suspend=false``."""
        ns, name = target["namespace"], target["name"]
        try:
            if target["type"] == "workload":
                self._call("PATCH", self._workload_path(ns, name), {"spec": {"active": True}})
                return {**target, "active": True}
            self._call("PATCH", _api_path("Job", ns, name), {"spec": {"suspend": False}})
            return {**target, "suspend": False}
        except ApiException as exc:
            if exc.status == 404:
                return {**target, "gone": True}
            raise _fail(exc, f"reactivate {target['type']} {ns}/{name}") from None
