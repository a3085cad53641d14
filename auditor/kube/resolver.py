"""GPU pods → their top-level job, its Kueue Workload and queues, and its team.

:class:`KubeResolver` implements the engine's ``JobResolver`` from informer caches (pods,
namespaces, Kueue Workloads and LocalQueues: listed once, then watched) plus a cache of owner
objects fetched by uid on first sight (metadata only). In steady state a cycle makes no API
request at all; a new job costs one GET per level of its owner chain.

Owner chains are followed through ``ownerReferences`` (the controller reference, else the first),
which covers every supported kind with one rule:

=====================  =================================================================
pods of                chain
=====================  =================================================================
batch Job              Pod → Job (→ CronJob) (→ JobSet (→ TrainJob)) (→ MPIJob launcher)
Deployment             Pod → ReplicaSet → Deployment
StatefulSet            Pod → StatefulSet (→ LeaderWorkerSet; worker sets via the leader Pod)
Kubeflow v1 jobs       Pod → PyTorchJob / MPIJob / TFJob / ...
Ray                    Pod → RayCluster (→ RayJob)
bare pod               Pod
=====================  =================================================================

Only the kinds in :data:`KINDS` are fetched (the operator's RBAC allows exactly those); an owner of
another kind, or one whose CRD is not installed (404), ends the chain quietly and is itself the
job. A Kueue Workload is found by its ``kueue.x-k8s.io/job-uid`` label or its owner reference,
matched against every uid of the chain.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable, Sequence

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.core.lineage import LINEAGE_LABEL
from auditor.core.model import JobRef, PodRef
from auditor.kube import gpus as gpumod
from auditor.kube.client import METADATA_ACCEPT, call_json, preferred_version, resource_path
from auditor.kube.informer import Informer
from auditor.kube.kueue_facts import workload_facts

log = logging.getLogger(__name__)

#: (API group, kind) → resource (plural) of the owner kinds the resolver may GET. Must match the
#: ``discovery`` feature of auditor/permissions.yaml (a test checks it).
KINDS: dict[tuple[str, str], str] = {
    ("", "Pod"): "pods",
    ("batch", "Job"): "jobs",
    ("batch", "CronJob"): "cronjobs",
    ("apps", "ReplicaSet"): "replicasets",
    ("apps", "Deployment"): "deployments",
    ("apps", "StatefulSet"): "statefulsets",
    ("jobset.x-k8s.io", "JobSet"): "jobsets",
    ("kubeflow.org", "PyTorchJob"): "pytorchjobs",
    ("kubeflow.org", "MPIJob"): "mpijobs",
    ("kubeflow.org", "TFJob"): "tfjobs",
    ("kubeflow.org", "XGBoostJob"): "xgboostjobs",
    ("kubeflow.org", "PaddleJob"): "paddlejobs",
    ("kubeflow.org", "JAXJob"): "jaxjobs",
    ("trainer.kubeflow.org", "TrainJob"): "trainjobs",
    ("ray.io", "RayJob"): "rayjobs",
    ("ray.io", "RayCluster"): "rayclusters",
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): "leaderworkersets",
}

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MAX_DEPTH = 10
OWNER_TTL = 600.0  # seconds an owner's labels are trusted before they are fetched again
MISSING_TTL = 60.0  # seconds a missing owner is remembered as missing


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
class _Obj:
    """An owner object's metadata, cached by uid."""

    api_version: str
    kind: str
    name: str
    uid: str
    labels: dict[str, str]
    owner: OwnerRef | None
    fetched: float
    missing: bool = False


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


def _controller(meta: dict) -> OwnerRef | None:
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
        owner=_controller(meta),
        gpus=g,
        phase=status.get("phase") or "Pending",
        node=(obj.get("spec") or {}).get("nodeName") or "",
        created=gpumod.parse_time(meta.get("creationTimestamp")),
        started=gpumod.pod_started(obj),
        finished=gpumod.pod_finished(obj),
    )


def _labels_only(obj: dict) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _workload(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "queue": spec.get("queueName"),
        "cluster_queue": (status.get("admission") or {}).get("clusterQueue"),
        "admission": workload_facts(obj),  # Kueue's admission facts (auditor.kube.kueue_facts)
        "uids": [u for u in [(meta.get("labels") or {}).get(KUEUE_JOB_UID)] if u]
        + [r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("uid")],
    }


def _local_queue(obj: dict) -> str | None:
    return (obj.get("spec") or {}).get("clusterQueue") or ""


class KubeResolver:
    """The operator's ``JobResolver``: informers + owner cache + Kueue + team attribution.

    ``start()`` begins watching; ``wait_synced()`` blocks until the first lists are in. Then
    :meth:`jobs` is the current view and :meth:`resolve` maps metric pods to jobs. Pods deleted
    from the API are remembered for ``deleted_pod_memory`` so their last samples still find
    their job (and the job's end is known).
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        cluster: str = "default",
        team_sources: Sequence[str] = (
            "podLabel:team",
            "jobLabel:team",
            "namespaceLabel:team",
            "kueueQueue",
            "namespace",
        ),
        kueue: bool = True,
        unresolved_pods: str = "pod",
        deleted_pod_memory: timedelta = timedelta(hours=1),
    ) -> None:
        self.api = api
        self.cluster = cluster
        self.team_sources = list(team_sources)
        self.kueue = kueue
        self.unresolved_pods = unresolved_pods
        self.deleted_pod_memory = deleted_pod_memory
        self._lock = threading.Lock()
        self._tombstones: dict[str, PodInfo] = {}
        self._objects: dict[str, _Obj] = {}
        self._warned: set[str] = set()
        #: owner GETs made (for /metrics and the benchmark)
        self.owner_requests = 0
        self.pods = Informer(api, "v1", "pods", pod_info, on_delete=self._pod_deleted, name="pods")
        self.namespaces = Informer(api, "v1", "namespaces", _labels_only, name="namespaces")
        self.workloads: Informer | None = None
        self.local_queues: Informer | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "KubeResolver":
        self.pods.start()
        self.namespaces.start()
        if self.kueue:
            try:
                gv = preferred_version(self.api, KUEUE_GROUP)
            except ApiException as exc:
                log.warning("cannot discover the Kueue API (%s %s); Kueue attribution is off", exc.status, exc.reason)
                gv = None
            if gv:
                self.workloads = Informer(self.api, gv, "workloads", _workload, name="kueue-workloads").start()
                self.local_queues = Informer(
                    self.api, gv, "localqueues", _local_queue, name="kueue-localqueues"
                ).start()
            else:
                log.info("Kueue is not installed (no %s API); Workloads and queues are not recorded", KUEUE_GROUP)
        return self

    def informers(self) -> list[Informer]:
        return [i for i in (self.pods, self.namespaces, self.workloads, self.local_queues) if i is not None]

    def wait_synced(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        return all(i.wait_synced(max(0.0, deadline - time.monotonic())) for i in self.informers())

    @property
    def synced(self) -> bool:
        return all(i.synced for i in self.informers())

    def stop(self) -> None:
        for i in self.informers():
            i.stop()

    @property
    def api_requests(self) -> int:
        return self.owner_requests + sum(i.requests for i in self.informers())

    # ------------------------------------------------------------------ JobResolver

    def resolve(self, pods: Iterable[PodRef]) -> dict[PodRef, JobRef]:
        """The job of each metric pod; unknown pods become ``Pod/<name>`` (or are left out)."""
        jobs = self.jobs()
        by_pod: dict[tuple[str, str], JobRef] = {}
        for job in jobs.values():
            for p in job.pods:
                by_pod[(p.namespace, p.name)] = job.ref
        out: dict[PodRef, JobRef] = {}
        ns_labels = self.namespaces.items()
        for pr in pods:
            ref = by_pod.get((pr.namespace, pr.pod))
            if ref is None and self.unresolved_pods == "pod":
                ref = JobRef(
                    cluster=self.cluster,
                    namespace=pr.namespace,
                    kind="Pod",
                    name=pr.pod,
                    team=self._team(pr.namespace, [], {}, None, None, ns_labels),
                )
            if ref is not None:
                out[pr] = ref
        return out

    # ------------------------------------------------------------------ the view

    def jobs(self, now: datetime | None = None) -> dict[str, JobInfo]:
        """Every job with GPU pods (live, or deleted within ``deleted_pod_memory``), by job key."""
        now = now or datetime.now(timezone.utc)
        live = self.pods.items()
        with self._lock:
            cutoff = now - self.deleted_pod_memory
            for k in [k for k, p in self._tombstones.items() if (p.deleted or now) < cutoff]:
                del self._tombstones[k]
            pods = dict(self._tombstones)
        pods.update(live)  # a live pod wins over the tombstone of its namesake
        ns_labels = self.namespaces.items()
        wl_index = self._workload_index()
        lqs = self.local_queues.items() if self.local_queues else {}
        groups: dict[tuple, dict] = {}
        for p in sorted(pods.values(), key=lambda p: (p.namespace, p.name)):
            top, labels, chain = self._top(p)
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
            team = self._team(ns, job_pods, g["labels"], local_queue, cluster_queue, ns_labels)
            ref = JobRef(
                cluster=self.cluster,
                namespace=ns,
                kind=kind,
                name=name,
                uid=top.uid or None,
                team=team,
                queue=local_queue,
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

    def forget(self, job: JobInfo) -> None:
        """Drop the remembered deleted pods of a job whose final summary is written."""
        with self._lock:
            for p in job.pods:
                t = self._tombstones.get(p.key)
                if t is not None and t.uid == p.uid:
                    del self._tombstones[p.key]

    # ------------------------------------------------------------------ internals

    def _pod_deleted(self, key: str, info: PodInfo) -> None:
        info.deleted = info.finished or datetime.now(timezone.utc)
        with self._lock:
            self._tombstones[key] = info

    def _workload_index(self) -> dict[str, dict]:
        if self.workloads is None:
            return {}
        index: dict[str, dict] = {}
        for wl in self.workloads.items().values():
            for uid in wl["uids"]:
                index.setdefault(uid, wl)
        return index

    def _team(
        self,
        namespace: str,
        pods: list[PodInfo],
        job_labels: dict[str, str],
        local_queue: str | None,
        cluster_queue: str | None,
        ns_labels: dict[str, dict[str, str]],
    ) -> str:
        for src in self.team_sources:
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

    def _top(self, pod: PodInfo) -> tuple[OwnerRef, dict[str, str], list[str]]:
        """The top of the pod's owner chain, its labels and the chain's uids (top first)."""
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
            obj = self._owner(pod.namespace, cur)
            if obj is None:
                break
            labels = obj.labels
            cur = obj.owner
        chain.reverse()
        return here, labels, chain

    def _owner(self, namespace: str, ref: OwnerRef) -> _Obj | None:
        """The owner's metadata (cached by uid), None when it cannot be had."""
        plural = KINDS.get((ref.group, ref.kind))
        if plural is None:
            return None  # a kind we do not follow (and may not read): it is the job
        now = time.monotonic()
        with self._lock:
            cached = self._objects.get(ref.uid)
        if cached is not None and now - cached.fetched < (MISSING_TTL if cached.missing else OWNER_TTL):
            return None if cached.missing else cached
        if ref.kind == "Pod":
            live = self.pods.get(f"{namespace}/{ref.name}")
            if live is not None and live.uid == ref.uid:
                return _Obj("v1", "Pod", live.name, live.uid, live.labels, live.owner, now)
        obj = self._fetch(namespace, ref, plural)
        with self._lock:
            if len(self._objects) > 50_000:
                self._objects.clear()
            self._objects[ref.uid] = obj or _Obj(
                ref.api_version, ref.kind, ref.name, ref.uid, {}, None, now, missing=True
            )
        return obj

    def _fetch(self, namespace: str, ref: OwnerRef, plural: str) -> _Obj | None:
        path = resource_path(ref.api_version, plural, namespace, ref.name)
        self.owner_requests += 1
        try:
            doc = call_json(self.api, path, accept=METADATA_ACCEPT)
        except ApiException as exc:
            if exc.status == 404:
                log.debug(
                    "owner %s %s/%s not found (deleted, or its CRD is not installed)", ref.kind, namespace, ref.name
                )
            elif exc.status == 403:
                if ref.kind not in self._warned:
                    self._warned.add(ref.kind)
                    log.warning(
                        "Forbidden to read %s objects: %s is taken as the job (check the RBAC)", ref.kind, ref.kind
                    )
            else:
                log.warning("cannot read owner %s %s/%s: %s %s", ref.kind, namespace, ref.name, exc.status, exc.reason)
            return None
        except Exception as exc:  # noqa: BLE001 - a broken connection: the ref is the job for now
            log.warning("cannot read owner %s %s/%s: %s", ref.kind, namespace, ref.name, exc)
            return None
        meta = doc.get("metadata") or {}
        if ref.uid and meta.get("uid") and meta["uid"] != ref.uid:
            return None  # a new object under the old name: not this pod's owner
        return _Obj(
            ref.api_version,
            ref.kind,
            ref.name,
            meta.get("uid", ref.uid),
            dict(meta.get("labels") or {}),
            _controller(meta),
            time.monotonic(),
        )
