"""The holds ConfigMap: the lineages whose next submissions the MutatingAdmissionPolicy changes.

Kueue's ``kueue.x-k8s.io/admission-gated-by`` can only be set when a Job is created, so the
decision must be known before the Job exists: the operator lists, per ``<namespace>.<lineage>``,
``hold: <reason>`` (the policy adds the gate: no quota is taken until it is removed) or
``probation: <reason>`` (the policy sets the probation WorkloadPriorityClass). The chart's policy
reads this ConfigMap as its parameter; outside a cluster the operator creates it when missing.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.gate.kueue import _fail
from auditor.gate.ports import Key
from auditor.kube.client import call_json, resource_path

HOLD, PROBATION = "hold", "probation"
_VALUE_MAX = 512


def entry_key(key: Key) -> str:
    """The ConfigMap data key of a lineage (namespace and lineage are label values: no '/')."""
    return f"{key.namespace}.{key.lineage}"


class HoldList:
    """Read and change the holds ConfigMap ``namespace/name``."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    def _path(self) -> str:
        return resource_path("v1", "configmaps", self.namespace, self.name)

    def read(self) -> dict[str, str]:
        try:
            return dict(call_json(self.api, self._path()).get("data") or {})
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise _fail(exc, f"read the holds ConfigMap {self.namespace}/{self.name}") from None

    def set(self, key: Key, kind: str | None, reason: str = "") -> None:
        """``kind`` hold|probation lists the lineage, None removes it."""
        value: Any = None if kind is None else f"{kind}: {reason}"[:_VALUE_MAX]
        self._patch({entry_key(key): value})

    def remove(self, entry: str) -> None:
        self._patch({entry: None})

    def _patch(self, data: dict[str, Any]) -> None:
        try:
            call_json(
                self.api,
                self._path(),
                method="PATCH",
                body={"data": data},
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise _fail(exc, f"update the holds ConfigMap {self.namespace}/{self.name}") from None
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "data": {k: v for k, v in data.items() if v is not None},
            }
            try:
                call_json(self.api, resource_path("v1", "configmaps", self.namespace), method="POST", body=body)
            except ApiException as exc2:
                raise _fail(exc2, f"create the holds ConfigMap {self.namespace}/{self.name}") from None
