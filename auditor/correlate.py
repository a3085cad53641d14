"""Pods → jobs. The engine asks a :class:`JobResolver` which job each pod belongs to.

Discovery through the Kubernetes API (owner chains, Kueue Workloads, team labels) plugs in here
through the same protocol; this module holds the resolvers that need no cluster.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol

from auditor.core.identity import Quarantine
from auditor.core.model import JobRef, PodRef


class JobResolver(Protocol):
    @property
    def rejected(self) -> Quarantine:
        """The last :meth:`resolve`'s pods or jobs refused for an identity no object could have."""
        ...

    @property
    def cluster(self) -> str:
        """The cluster its jobs belong to, "" where it has none of its own (the run's record
        carries it: retention prunes runs by cluster)."""
        ...

    def resolve(self, pods: Iterable[PodRef]) -> dict[PodRef, JobRef]:
        """The job of each pod it can attribute; pods left out are reported as unattributed."""
        ...


class NoKubeResolver:
    """``--no-kube``: each pod is its own job ``Pod/<name>`` and its team is its namespace.

    Containers of one pod are one job (the container label is ignored for identity).
    """

    def __init__(self, cluster: str = "default") -> None:
        self.cluster = cluster
        #: pods of the last :meth:`resolve` whose name no job key can hold (left out: unattributed)
        self.rejected = Quarantine()

    def resolve(self, pods: Iterable[PodRef]) -> dict[PodRef, JobRef]:
        # a pod from the Prometheus source was checked where its labels were read; one from
        # another source (a trace, a table) is checked here, so no name reaches a job key unchecked
        self.rejected = Quarantine()
        return {
            p: JobRef(cluster=self.cluster, namespace=p.namespace, kind="Pod", name=p.pod, team=p.namespace)
            for p in pods
            if not self.rejected.refuses_job(p.namespace, "Pod", p.pod)
        }


class StaticResolver:
    """A fixed (namespace, pod) → job table, e.g. for ``demo``; unknown pods fall back to
    ``fallback`` (a :class:`NoKubeResolver` by default) or are left out when it is None."""

    def __init__(
        self,
        table: Mapping[tuple[str, str], JobRef],
        fallback: JobResolver | None = None,
    ) -> None:
        self.table = dict(table)
        self.fallback = fallback
        #: the table's jobs carry their own cluster; the run's record names the fallback's, if any
        self.cluster = fallback.cluster if fallback is not None else ""
        #: the last :meth:`resolve`'s jobs whose identity no job key can hold (left out)
        self.rejected = Quarantine()

    def resolve(self, pods: Iterable[PodRef]) -> dict[PodRef, JobRef]:
        out: dict[PodRef, JobRef] = {}
        rest: list[PodRef] = []
        self.rejected = Quarantine()
        for p in pods:
            job = self.table.get((p.namespace, p.pod))
            if job is not None:
                if not self.rejected.refuses_job(job.namespace, job.kind, job.name):
                    out[p] = job
            else:
                rest.append(p)
        if rest and self.fallback is not None:
            out.update(self.fallback.resolve(rest))
            self.rejected.update(self.fallback.rejected)
        return out
