"""What the resolver knows of pods and jobs, and the pure attribution of pods to jobs.

No I/O here: :func:`attribute` groups GPU pods by the top of their owner chain (walked through
a lookup function the resolver backs with its owner cache), matches each job to its Kueue
Workload and queues, and picks its team; :func:`pod_info`, :func:`workload_doc` and friends are
the informers' transforms of API objects. Owner chains follow ``ownerReferences`` (the controller
reference, else the first) of the kinds in :data:`auditor.core.kinds.BY_GROUP_KIND`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterable, Sequence

from auditor.core.kinds import KUEUE_JOB_UID_LABEL, KUEUE_QUEUE_LABEL
from auditor.core.lineage import LINEAGE_LABEL
from auditor.core.model import JobRef
from auditor.kube import gpus as gpumod
from auditor.kube.kueue_facts import workload_facts

MAX_DEPTH = 10
#: Kueue's WorkloadPriorityClass of a job (a label on the job object)
KUEUE_PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""


@dataclass(slots=True)
class PodInfo:
    """What the resolver keeps of a GPU pod."""

    namespace: str
    name: str
    uid: str
    labels: dict[str, str]
    owner: OwnerRef | None
    gpus: float
    phase: str
    node: str
    created: datetime | None
    started: datetime | None
    finished: datetime | None
    deleted: datetime | None = None
    #: ``spec.priorityClassName`` (a workload class may be selected by it: auditor/core/mfu.py)
    priority_class: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def done(self) -> bool:
        return self.deleted is not None or self.phase in gpumod.TERMINAL_PHASES

    @property
    def end(self) -> datetime | None:
        if self.finished is not None:
            return self.finished
        return self.deleted

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "uid": self.uid,
            "gpus": round(self.gpus, 4),
            "phase": "Deleted" if self.deleted is not None and self.phase not in gpumod.TERMINAL_PHASES else self.phase,
            "node": self.node or None,
            "started": _iso(self.started),
            "finished": _iso(self.end if self.done else None),
        }


@dataclass(slots=True)
class OwnerMeta:
    """An owner object's metadata (what the chain needs of it), cached by uid by the resolver."""

    api_version: str
    kind: str
    name: str
    uid: str
    labels: dict[str, str]
    owner: OwnerRef | None
    fetched: float
    missing: bool = False


#: An owner's metadata by namespace and reference, None when it cannot be had (the chain ends).
OwnerLookup = Callable[[str, OwnerRef], "OwnerMeta | None"]


@dataclass
class JobInfo:
    """One top-level job with its GPU pods, as the cluster shows it now."""

    ref: JobRef
    api_version: str
    labels: dict[str, str]
    pods: list[PodInfo]
    uids: list[str] = field(default_factory=list)  # the owner chain, top first
    workload: str | None = None
    local_queue: str | None = None
    cluster_queue: str | None = None

    @property
    def key(self) -> str:
        return self.ref.key

    @property
    def gpus(self) -> float:
        """GPU equivalents requested by the job's pods that are not finished."""
        live = [p for p in self.pods if not p.done]
        return sum(p.gpus for p in (live or self.pods))

    @property
    def start(self) -> datetime | None:
        """When the first pod started running (None while none has)."""
        return min((p.started for p in self.pods if p.started), default=None)

    @property
    def ended(self) -> datetime | None:
        """When the job ended: all its pods finished or deleted (None while any still runs)."""
        if not self.pods or not all(p.done for p in self.pods):
            return None
        return max((p.end for p in self.pods if p.end), default=None)

    def as_json(self) -> dict:
        return {
            "kind": self.ref.kind,
            "api_version": self.api_version,
            "workload": self.workload,
            "local_queue": self.local_queue,
            "cluster_queue": self.cluster_queue,
            "gpus_requested": round(self.gpus, 4),
            "state": "ended" if self.ended else "running",
            "ended": _iso(self.ended),
            "pods": [p.as_json() for p in sorted(self.pods, key=lambda p: p.name)],
            "lineage": self.lineage_label,
        }

    @property
    def lineage_label(self) -> str | None:
        """The user's ``gpu-auditor.io/lineage`` label: on the top owner, else on one of its pods
        (a CronJob's label is often only in its pod template); the store derives the lineage
        from the job's name when there is none (auditor.core.lineage)."""
        return self.labels.get(LINEAGE_LABEL) or next(
            (p.labels[LINEAGE_LABEL] for p in self.pods if p.labels.get(LINEAGE_LABEL)), None
        )


def _iso(t: datetime | None) -> str | None:
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if t else None


def controller_of(meta: dict) -> OwnerRef | None:
    refs = meta.get("ownerReferences") or []
    chosen = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if not chosen:
        return None
    return OwnerRef(chosen.get("apiVersion", ""), chosen.get("kind", ""), chosen.get("name", ""), chosen.get("uid", ""))


def pod_info(obj: dict) -> PodInfo | None:
    """The informer's transform: a GPU pod's essentials, None for a CPU-only pod."""
    g = gpumod.pod_gpus(obj.get("spec"))
    if g <= 0:
        return None
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return PodInfo(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        labels=dict(meta.get("labels") or {}),
        owner=controller_of(meta),
        gpus=g,
        phase=status.get("phase") or "Pending",
        node=(obj.get("spec") or {}).get("nodeName") or "",
        created=gpumod.parse_time(meta.get("creationTimestamp")),
        started=gpumod.pod_started(obj),
        finished=gpumod.pod_finished(obj),
        priority_class=(obj.get("spec") or {}).get("priorityClassName") or None,
    )


def labels_only(obj: dict) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def workload_doc(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "queue": spec.get("queueName"),
        "cluster_queue": (status.get("admission") or {}).get("clusterQueue"),
        "admission": workload_facts(obj),  # Kueue's admission facts (auditor.kube.kueue_facts)
        "uids": [u for u in [(meta.get("labels") or {}).get(KUEUE_JOB_UID_LABEL)] if u]
        + [r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("uid")],
    }


def local_queue_doc(obj: dict) -> str | None:
    return (obj.get("spec") or {}).get("clusterQueue") or ""


def workload_index(workloads: Iterable[dict]) -> dict[str, dict]:
    """Workloads (as :func:`workload_doc` keeps them) by every uid they name: the job's, its owners'."""
    index: dict[str, dict] = {}
    for wl in workloads:
        for uid in wl["uids"]:
            index.setdefault(uid, wl)
    return index


def team_of(
    sources: Sequence[str],
    namespace: str,
    pods: list[PodInfo],
    job_labels: dict[str, str],
    local_queue: str | None,
    cluster_queue: str | None,
    ns_labels: dict[str, dict[str, str]],
) -> str:
    """The job's team: the first of ``sources`` (settings ``team_sources``) that has a value."""
    for src in sources:
        kind, _, key = src.partition(":")
        value: str | None = None
        if kind == "podLabel":
            value = next((p.labels[key] for p in pods if p.labels.get(key)), None)
        elif kind == "jobLabel":
            value = job_labels.get(key)
        elif kind == "namespaceLabel":
            value = (ns_labels.get(namespace) or {}).get(key)
        elif kind == "kueueQueue":
            value = cluster_queue or local_queue
        elif kind == "kueueClusterQueue":
            value = cluster_queue
        elif kind == "kueueLocalQueue":
            value = local_queue
        elif kind == "namespace":
            value = namespace
        if value:
            return value
    return namespace


def job_labels(owner_labels: dict[str, str], pods: Sequence[PodInfo]) -> tuple[tuple[str, str], ...]:
    """The job's labels, sorted: its pods' (the first pod that has a key, by name), under the top
    owner's own. A workload class is selected by them (``gpu-auditor.io/workload-class``), and a
    label set in a pod template only (a CronJob's, a Deployment's) is a label of the job too."""
    merged: dict[str, str] = {}
    for p in sorted(pods, key=lambda p: p.name):
        for k, v in p.labels.items():
            merged.setdefault(k, v)
    merged.update(owner_labels)
    return tuple(sorted(merged.items()))


def priority_class_of(owner_labels: dict[str, str], pods: Sequence[PodInfo]) -> str | None:
    """The job's PriorityClass: its pods' ``priorityClassName`` (the first pod that names one),
    else Kueue's WorkloadPriorityClass label on the top owner."""
    named = next((p.priority_class for p in sorted(pods, key=lambda p: p.name) if p.priority_class), None)
    return named or owner_labels.get(KUEUE_PRIORITY_CLASS_LABEL) or None


def owner_chain(pod: PodInfo, lookup: OwnerLookup) -> tuple[OwnerRef, dict[str, str], list[str]]:
    """The top of the pod's owner chain, its labels and the chain's uids (top first).

    ``lookup`` gives an owner's metadata (None: the chain ends there, and that owner is the job)."""
    here = OwnerRef("v1", "Pod", pod.name, pod.uid)
    labels = pod.labels
    chain: list[str] = []
    cur = pod.owner
    seen = {pod.uid}
    for _ in range(MAX_DEPTH):
        if cur is None or cur.uid in seen:
            break
        seen.add(cur.uid)
        chain.append(cur.uid)
        here, labels = cur, {}
        obj = lookup(pod.namespace, cur)
        if obj is None:
            break
        labels = obj.labels
        cur = obj.owner
    chain.reverse()
    return here, labels, chain


def attribute(
    pods: Iterable[PodInfo],
    lookup: OwnerLookup,
    *,
    cluster: str,
    team_sources: Sequence[str],
    ns_labels: dict[str, dict[str, str]],
    wl_index: dict[str, dict],
    lqs: dict[str, str | None],
) -> dict[str, JobInfo]:
    """Group GPU pods by the top of their owner chain into jobs, by job key, each with its
    Workload (matched by any uid of the chain or of its pods), queues and team.

    Pure given ``lookup`` (the owner metadata; the resolver's is a cache over the API):
    ``ns_labels`` are namespace labels by name, ``wl_index`` Workloads by uid
    (:func:`workload_index`), ``lqs`` LocalQueue ``namespace/name`` → ClusterQueue.
    """
    groups: dict[tuple, dict] = {}
    for p in sorted(pods, key=lambda p: (p.namespace, p.name)):
        top, labels, chain = owner_chain(p, lookup)
        key = (p.namespace, top.kind, top.name)
        g = groups.setdefault(key, {"top": top, "labels": labels, "chain": chain, "pods": []})
        g["pods"].append(p)
    out: dict[str, JobInfo] = {}
    for (ns, kind, name), g in groups.items():
        top = g["top"]
        job_pods: list[PodInfo] = g["pods"]
        wl = None
        for uid in g["chain"] + [p.uid for p in job_pods]:
            wl = wl_index.get(uid)
            if wl:
                break
        local_queue = (
            (wl or {}).get("queue")
            or g["labels"].get(KUEUE_QUEUE_LABEL)
            or next((p.labels[KUEUE_QUEUE_LABEL] for p in job_pods if p.labels.get(KUEUE_QUEUE_LABEL)), None)
        )
        cluster_queue = (
            (wl or {}).get("cluster_queue") or (lqs.get(f"{ns}/{local_queue}") if local_queue else None) or None
        )
        team = team_of(team_sources, ns, job_pods, g["labels"], local_queue, cluster_queue, ns_labels)
        ref = JobRef(
            cluster=cluster,
            namespace=ns,
            kind=kind,
            name=name,
            uid=top.uid or None,
            team=team,
            queue=local_queue,
            labels=job_labels(g["labels"], job_pods),
            priority_class=priority_class_of(g["labels"], job_pods),
        )
        info = JobInfo(
            ref=ref,
            api_version=top.api_version,
            labels=g["labels"],
            pods=job_pods,
            uids=g["chain"],
            workload=(wl or {}).get("name"),
            local_queue=local_queue,
            cluster_queue=cluster_queue,
        )
        out[ref.key] = info
    return out
