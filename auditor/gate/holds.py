"""The gate's holds: the lineages whose next submissions the MutatingAdmissionPolicy changes.

Kueue's ``kueue.x-k8s.io/admission-gated-by`` can only be set when a Job is created, so the
decision must be known before the Job exists: the operator lists, per ``<namespace>.<lineage>``,
``hold: <reason>`` (the policy adds the gate: no quota is taken until it is removed) or
``probation: <reason>`` (the policy sets the probation WorkloadPriorityClass), in the ``spec.holds``
of one ``GateHolds`` object (gpu-auditor.io/v1alpha1, the chart's CRD), the policy's parameter. Not
a ConfigMap: on Kubernetes 1.36 a policy with a built-in parameter kind loses its parameters for
good after its binding goes away for a moment (kubernetes/kubernetes#130887). Outside a cluster the
operator creates the object when missing (the CRD must be installed).
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
    """The holds key of a lineage (namespace and lineage are label values: no '/')."""
    return f"{key.namespace}.{key.lineage}"


GV = "gpu-auditor.io/v1alpha1"


class HoldList:
    """Read and change the ``GateHolds`` object ``namespace/name``."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    def _path(self) -> str:
        return resource_path(GV, "gateholds", self.namespace, self.name)

    def read(self) -> dict[str, str]:
        try:
            return dict((call_json(self.api, self._path()).get("spec") or {}).get("holds") or {})
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise _fail(exc, f"read the gate's holds {self.namespace}/{self.name}") from None

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
                body={"spec": {"holds": data}},
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise _fail(exc, f"update the gate's holds {self.namespace}/{self.name}") from None
            body = {
                "apiVersion": GV,
                "kind": "GateHolds",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holds": {k: v for k, v in data.items() if v is not None}},
            }
            try:
                call_json(self.api, resource_path(GV, "gateholds", self.namespace), method="POST", body=body)
            except ApiException as exc2:
                raise _fail(exc2, f"create the gate's holds {self.namespace}/{self.name}") from None
