"""An operator shard's view of the cluster: only its namespaces' jobs, only their series.

:class:`ShardResolver` passes on the jobs of the namespaces the shard owns
(:mod:`auditor.core.shards`) and remembers those namespaces; :class:`ShardSource` has the
Prometheus source select exactly those namespaces in every query (a regex matcher on the pod
namespace label), so a shard's Prometheus work and its own are both its share. Everything else
is the wrapped object's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from auditor.core.identity import Quarantine
from auditor.core.model import JobRef, PodRef, Window
from auditor.core.readings import SourceResult
from auditor.core.shards import Shard

if TYPE_CHECKING:
    from auditor.operator_loop.cycle import ClusterJobs

#: a namespace name Kubernetes never allows (a DNS label starts with a letter or digit): what a
#: shard with no namespaces selects, so its queries match nothing instead of everything
NO_NAMESPACE = "-"


def _alternation(values: list[str]) -> str:
    """``a|b|c``: namespace names are DNS labels (``[a-z0-9-]``), nothing in them needs escaping."""
    return "|".join(values)


class ShardResolver:
    """A job view (:class:`~auditor.operator_loop.cycle.ClusterJobs`) that sees only the jobs of
    ``shard``'s namespaces; every other call is the wrapped view's."""

    def __init__(self, resolver: "ClusterJobs", shard: Shard) -> None:
        self._resolver = resolver
        self.shard = shard
        #: the shard's namespaces with GPU jobs in the latest view
        self.namespaces: set[str] = set()

    @property
    def cluster(self) -> str:
        return self._resolver.cluster

    @property
    def rejected(self) -> Quarantine:
        return self._resolver.rejected

    @property
    def workloads(self) -> Any:
        return self._resolver.workloads

    def jobs(self, now: datetime | None = None) -> dict[str, Any]:
        view = self._resolver.jobs(now)
        mine = {key: job for key, job in view.items() if self.shard.owns(job.ref.namespace)}
        self.namespaces = {job.ref.namespace for job in mine.values()}
        return mine

    def resolve(self, pods: Iterable[PodRef]) -> dict[PodRef, JobRef]:
        return self._resolver.resolve(pods)

    def forget(self, job: Any) -> None:
        self._resolver.forget(job)


class SelectableSource(Protocol):
    """A metric source whose queries can be narrowed by label regexes (the Prometheus source)."""

    regex_matchers: dict[str, str]

    def read(self, window: Window, width: timedelta) -> SourceResult: ...

    def read_lazy(self, window: Window, width: timedelta) -> SourceResult: ...

    def close(self) -> None: ...


class ShardSource:
    """A metric source whose every query selects only the shard's namespaces."""

    def __init__(self, source: SelectableSource, resolver: ShardResolver, label: str = "namespace") -> None:
        self._source = source
        self._resolver = resolver
        self.label = label

    def _select(self) -> None:
        names = sorted(self._resolver.namespaces) or [NO_NAMESPACE]
        self._source.regex_matchers = {self.label: _alternation(names)}

    def read(self, window: Window, width: timedelta) -> SourceResult:
        self._select()
        return self._source.read(window, width)

    def read_lazy(self, window: Window, width: timedelta) -> SourceResult:
        self._select()
        return self._source.read_lazy(window, width)

    def close(self) -> None:
        self._source.close()
