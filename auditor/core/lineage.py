"""Lineage: which jobs are "the same job again", so the gate can judge a re-submission by its past.

A user who re-submits ``train`` as ``train-7f9c2`` (``generateName``), or whose CronJob creates
``train-29012345`` every hour, runs one piece of work many times; the efficiency gate decides on
the history of that work, not of one Kubernetes object. The lineage is the label
``gpu-auditor.io/lineage`` when the user sets one (the only way to join jobs whose names differ),
else the top owner's name without the suffix Kubernetes (or a controller) generated. It is scoped
to ``(cluster, namespace)``: two teams' ``train`` are different work.

Pure: callers pass names, labels and owner references; nothing here talks to the cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from auditor.errors import BadInput

LINEAGE_LABEL = "gpu-auditor.io/lineage"

#: Kubernetes' random-suffix alphabet (``k8s.io/apimachinery/pkg/util/rand``: no vowels, no 0/1/3,
#: so a suffix never spells a word): ``generateName`` adds 5 of them; a ReplicaSet's
#: pod-template-hash is 6 to 10 of them.
_SAFE = "bcdfghjklmnpqrstvwxz2456789"
_RANDOM_5 = re.compile(rf"^[{_SAFE}]{{5}}$")
_HASH = re.compile(rf"^(?=.*[0-9])[{_SAFE}]{{6,10}}$")
#: a CronJob names its Jobs ``<name>-<scheduled time in minutes since the epoch>`` (8 digits
#: today); date stamps (``20261201``) and epoch seconds are generated the same way
_NUMBER = re.compile(r"^[0-9]{6,}$")
#: a label value (Kubernetes: at most 63, alphanumeric at both ends, '-', '_', '.' inside)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
#: how many generated segments may be stripped (a Deployment pod: ``<rs hash>-<random>``)
_MAX_STRIPPED = 2


@dataclass(frozen=True, slots=True, order=True)
class LineageKey:
    """One lineage: the unit the gate's history, acknowledgements and snoozes are kept by."""

    cluster: str
    namespace: str
    lineage: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.lineage}"

    @classmethod
    def parse(cls, text: str, *, cluster: str = "default", what: str = "lineage") -> "LineageKey":
        """``NAMESPACE/LINEAGE`` (as ``gpu-auditor ack`` takes it); BadInput naming ``what``."""
        namespace, sep, lineage = text.strip().partition("/")
        if not sep or not namespace or not lineage or "/" in lineage:
            raise BadInput(f"{what}: {text!r} is not NAMESPACE/LINEAGE (e.g. ml-team/train)")
        return cls(cluster, namespace, lineage)


def strip_generated(name: str) -> str:
    """``name`` without the suffixes Kubernetes or a controller generated (at most two).

    ``train-7f9c2`` → ``train``, ``train-29012345`` → ``train``, ``serve-7d9f8c6b5-x2kq9`` →
    ``serve``; names a person chose keep their numbers (``resnet-50``, ``train-v2``, ``llama-70b``).
    A name that is nothing but a generated segment stays as it is.
    """
    out = name
    for _ in range(_MAX_STRIPPED):
        head, sep, tail = out.rpartition("-")
        if not sep or not head or not _generated(tail):
            break
        out = head
    return out


def _generated(segment: str) -> bool:
    return bool(_NUMBER.match(segment) or _RANDOM_5.match(segment) or _HASH.match(segment))


def lineage_of(
    namespace: str,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    cluster: str = "default",
    generate_name: str | None = None,
) -> LineageKey:
    """The lineage of a job whose top owner is called ``name`` (with that owner's ``labels``).

    The label ``gpu-auditor.io/lineage`` wins when it is a valid label value; else the owner's
    ``generateName`` (when known, the exact prefix Kubernetes added the suffix to) without its
    trailing '-'; else ``name`` with its generated suffixes stripped (:func:`strip_generated`).
    """
    label = (labels or {}).get(LINEAGE_LABEL, "").strip()
    if label and _LABEL_VALUE.match(label):
        return LineageKey(cluster, namespace, label)
    if generate_name and generate_name.rstrip("-"):
        return LineageKey(cluster, namespace, generate_name.rstrip("-"))
    return LineageKey(cluster, namespace, strip_generated(name))


def lineage_of_object(obj: Mapping[str, Any], *, cluster: str = "default") -> LineageKey:
    """The lineage of a Kubernetes object as the admission path sees it (a Job being admitted).

    Its own label wins; else, when a controller owns it (a CronJob's Job, a JobSet's Job), the
    owner's name: the admission path sees one level of ownership and does not read further
    (the audit side names lineages by the top owner, which is the same for the common chains);
    else its ``generateName``; else its name without generated suffixes.
    """
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    refs = meta.get("ownerReferences") or []
    owner = next((r for r in refs if r.get("controller")), None)
    if owner is not None and owner.get("name") and LINEAGE_LABEL not in labels:
        return lineage_of(namespace, str(owner["name"]), cluster=cluster)
    return lineage_of(
        namespace,
        str(meta.get("name") or ""),
        labels=labels,
        cluster=cluster,
        generate_name=meta.get("generateName"),
    )


def lineage_of_summary(summary: Mapping[str, Any]) -> LineageKey:
    """The lineage of a job's audit-JSON summary: the user's label, which the operator's cycle puts
    in ``kube.lineage`` (the top owner's or a pod's), else derived from ``job`` (``Kind/name``)."""
    label = (summary.get("kube") or {}).get("lineage")
    _, _, name = str(summary.get("job") or "").partition("/")
    return lineage_of(
        str(summary.get("namespace") or ""),
        name,
        labels={LINEAGE_LABEL: label} if isinstance(label, str) else None,
        cluster=str(summary.get("cluster") or "default"),
    )
