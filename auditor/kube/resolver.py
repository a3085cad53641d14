"""GPU pods → their top-level job, its Kueue Workload and queues, and its team.

:class:`KubeResolver` implements the engine's ``JobResolver`` from informer caches (pods,
namespaces, Kueue Workloads and LocalQueues: listed once, then watched) plus a cache of owner
objects fetched by uid on first sight (metadata only). In steady state a cycle makes no API
request at all; new jobs cost a paged metadata list per owner kind where there are many of
one kind (a first sighting), else one GET per level of the owner chain (auditor/kube/owners.py).

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
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from kubernetes import client
from kubernetes.client.rest import ApiException

from auditor.clock import SYSTEM_CLOCK
from auditor.core.identity import InvalidIdentity, Quarantine, check_job
from auditor.core.kinds import BY_GROUP_KIND, KUEUE_GROUP, KUEUE_JOB_UID_LABEL
from auditor.core.kinds import KUEUE_QUEUE_LABEL as KUEUE_QUEUE_LABEL  # re-exported
from auditor.core.model import JobRef, PodRef
from auditor.kube.client import preferred_version
from auditor.kube.informer import Informer
from auditor.kube.jobview import (
    MAX_DEPTH,
    PodInfo,
    attribute,
    labels_only,
    local_queue_doc,
    pod_info,
    team_of,
    workload_doc,
    workload_index,
)
from auditor.kube.jobview import JobInfo as JobInfo  # re-exported
from auditor.kube.jobview import OwnerRef as OwnerRef  # re-exported
from auditor.kube.owners import OwnerCache

if TYPE_CHECKING:
    from auditor.ports import Clock

log = logging.getLogger(__name__)

#: (API group, kind) → resource (plural) of the owner kinds the resolver may GET: a view of the one
#: table, :data:`auditor.core.kinds.BY_GROUP_KIND`. Must match the ``discovery`` feature of
#: auditor/permissions.yaml (a test checks it).
KINDS: Mapping[tuple[str, str], str] = MappingProxyType({gk: k.plural for gk, k in BY_GROUP_KIND.items()})
KUEUE_JOB_UID = KUEUE_JOB_UID_LABEL
#: seconds a view from :meth:`KubeResolver.jobs` may serve :meth:`KubeResolver.resolve` unchanged
VIEW_REUSE_S = 60.0


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
        clock: "Clock" = SYSTEM_CLOCK,
    ) -> None:
        self.api = api
        #: "now" of a view asked for without one, a deleted pod's end, and the view's age
        self.clock = clock
        self.cluster = cluster
        self.team_sources = list(team_sources)
        self.kueue = kueue
        self.unresolved_pods = unresolved_pods
        self.deleted_pod_memory = deleted_pod_memory
        self._lock = threading.Lock()
        self._tombstones: dict[str, PodInfo] = {}
        #: the last view (:meth:`jobs`): when it was made (monotonic), the pod informer's version, the view
        self._view: tuple[float, int, dict[str, JobInfo]] | None = None
        #: the last :meth:`resolve`'s pods whose job was refused for its identity, per reason
        self.rejected = Quarantine()
        #: the last view's pods (namespace, name) whose job no job key can hold, and why
        self.refused_pods: dict[tuple[str, str], InvalidIdentity] = {}
        self.pods = Informer(api, "v1", "pods", pod_info, on_delete=self._pod_deleted, name="pods")
        self._owners = OwnerCache(api, self.pods.get, clock)
        self.namespaces = Informer(api, "v1", "namespaces", labels_only, name="namespaces")
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
                self.workloads = Informer(self.api, gv, "workloads", workload_doc, name="kueue-workloads").start()
                self.local_queues = Informer(
                    self.api, gv, "localqueues", local_queue_doc, name="kueue-localqueues"
                ).start()
            else:
                log.info("Kueue is not installed (no %s API); Workloads and queues are not recorded", KUEUE_GROUP)
        return self

    def informers(self) -> list[Informer]:
        return [i for i in (self.pods, self.namespaces, self.workloads, self.local_queues) if i is not None]

    def wait_synced(self, timeout: float = 60.0) -> bool:
        deadline = self.clock.monotonic() + timeout
        return all(i.wait_synced(max(0.0, deadline - self.clock.monotonic())) for i in self.informers())

    @property
    def synced(self) -> bool:
        return all(i.synced for i in self.informers())

    def stop(self) -> None:
        for i in self.informers():
            i.stop()

    @property
    def owner_requests(self) -> int:
        """Owner GETs made (for /metrics and the benchmark)."""
        return self._owners.requests

    @property
    def api_requests(self) -> int:
        return self.owner_requests + sum(i.requests for i in self.informers())

    # ------------------------------------------------------------------ JobResolver

    def resolve(self, pods: Iterable[PodRef]) -> dict[PodRef, JobRef]:
        """The job of each metric pod; unknown pods become ``Pod/<name>`` (or are left out).

        A cycle asks for :meth:`jobs` and then resolves its pods: a view made less than
        :data:`VIEW_REUSE_S` ago is reused instead of walking every pod's owner chain again, as
        long as it holds every pod asked for or the pod informer saw no change since (a pod the
        view lacks may be new: then a fresh view)."""
        pods = list(pods)
        view = self._view
        by_pod = None
        if view is not None and self.clock.monotonic() - view[0] < VIEW_REUSE_S:
            by_pod = self._by_pod(view[2])
            if view[1] != self.pods.version and any((pr.namespace, pr.pod) not in by_pod for pr in pods):
                by_pod = None
        if by_pod is None:
            by_pod = self._by_pod(self.jobs())
        out: dict[PodRef, JobRef] = {}
        ns_labels = self.namespaces.items()
        self.rejected = Quarantine()
        for pr in pods:
            ref = by_pod.get((pr.namespace, pr.pod))
            refused = self.refused_pods.get((pr.namespace, pr.pod)) if ref is None else None
            if refused is not None:  # its owner's name cannot be a job's: not audited as a bare pod either
                self.rejected.add(refused)
                continue
            if ref is None and self.unresolved_pods == "pod":
                ref = JobRef(
                    cluster=self.cluster,
                    namespace=pr.namespace,
                    kind="Pod",
                    name=pr.pod,
                    team=team_of(self.team_sources, pr.namespace, [], {}, None, None, ns_labels),
                )
            if ref is not None:
                out[pr] = ref
        return out

    # ------------------------------------------------------------------ the view

    @staticmethod
    def _by_pod(jobs: dict[str, JobInfo]) -> dict[tuple[str, str], JobRef]:
        return {(p.namespace, p.name): job.ref for job in jobs.values() for p in job.pods}

    def jobs(self, now: datetime | None = None) -> dict[str, JobInfo]:
        """Every job with GPU pods (live, or deleted within ``deleted_pod_memory``), by job key."""
        now = now or self.clock.now()
        with self._lock:
            cutoff = now - self.deleted_pod_memory
            expired = [k for k, p in self._tombstones.items() if (p.deleted or now) < cutoff]
            for k in expired:
                del self._tombstones[k]
        version, live = self.pods.snapshot()
        with self._lock:
            pods = dict(self._tombstones)
        pods.update(live)  # a live pod wins over the tombstone of its namesake
        ns_labels = self.namespaces.items()
        wl_index = self._workload_index()
        lqs = self.local_queues.items() if self.local_queues else {}
        self._prefetch_owners(pods.values())
        view = attribute(
            pods.values(),
            self._owners.lookup,
            cluster=self.cluster,
            team_sources=self.team_sources,
            ns_labels=ns_labels,
            wl_index=wl_index,
            lqs=lqs,
        )
        view = self._checked(view)
        self._view = (self.clock.monotonic(), version, view)
        return view

    def _checked(self, view: dict[str, JobInfo]) -> dict[str, JobInfo]:
        """The view without the jobs whose identity no job key can hold (an ownerReference's
        kind and name are only required to be non-empty by the apiserver): their pods are
        remembered in :attr:`refused_pods`, never resolved (:meth:`resolve` counts those it is
        asked for in :attr:`rejected`); the log names them when they change."""
        refused: dict[tuple[str, str], InvalidIdentity] = {}
        out: dict[str, JobInfo] = {}
        for key, job in view.items():
            ref = job.ref
            try:
                check_job(ref.namespace, ref.kind, ref.name)
            except InvalidIdentity as bad:
                refused.update(((p.namespace, p.name), bad) for p in job.pods)
            else:
                out[key] = job
        if refused.keys() != self.refused_pods.keys():
            said = Quarantine()
            for why in refused.values():
                said.add(why)
            for line in said.lines("pods in the cluster"):
                log.warning("owner chain: %s", line)
        self.refused_pods = refused
        return out

    def forget(self, job: JobInfo) -> None:
        """Drop the remembered deleted pods of a job whose final summary is written."""
        with self._lock:
            for p in job.pods:
                t = self._tombstones.get(p.key)
                if t is not None and t.uid == p.uid:
                    del self._tombstones[p.key]

    # ------------------------------------------------------------------ internals

    def _prefetch_owners(self, pods: Iterable[PodInfo]) -> None:
        """Owner metadata for every level of the pods' chains, a paged list per kind where many
        are new (:meth:`OwnerCache.prefetch`), before :func:`attribute` walks the chains."""
        level = [(p.namespace, p.owner) for p in pods if p.owner is not None]
        seen: set[str] = set()
        for _ in range(MAX_DEPTH):
            level = [(ns, ref) for ns, ref in level if ref.uid not in seen]
            if not level:
                return
            seen.update(ref.uid for _, ref in level)
            level = [(ns, meta.owner) for ns, meta in self._owners.prefetch(level) if meta.owner is not None]

    def _pod_deleted(self, key: str, info: PodInfo) -> None:
        info.deleted = info.finished or self.clock.now()
        with self._lock:
            self._tombstones[key] = info

    def _workload_index(self) -> dict[str, dict]:
        return {} if self.workloads is None else workload_index(self.workloads.items().values())
