"""An operator shard's view of the cluster: only its namespaces' jobs, only their series.

:class:`ShardResolver` passes on the jobs of the namespaces the shard owns
(:mod:`auditor.core.shards`) and remembers those namespaces; :class:`ShardSource` has the
Prometheus source select exactly those namespaces in every query (a regex matcher on the pod
namespace label), so a shard's Prometheus work and its own are both its share. Everything else
is the wrapped object's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from auditor.core.model import Window
from auditor.core.shards import Shard

#: a namespace name Kubernetes never allows (a DNS label starts with a letter or digit): what a
#: shard with no namespaces selects, so its queries match nothing instead of everything
NO_NAMESPACE = "-"


def _alternation(values: list[str]) -> str:
    """``a|b|c``: namespace names are DNS labels (``[a-z0-9-]``), nothing in them needs escaping."""
    return "|".join(values)


class ShardResolver:
    """A job resolver that sees only the jobs of ``shard``'s namespaces."""

    def __init__(self, resolver: Any, shard: Shard) -> None:
        self._resolver = resolver
        self.shard = shard
        #: the shard's namespaces with GPU jobs in the latest view
        self.namespaces: set[str] = set()

    def jobs(self, now: datetime | None = None) -> dict[str, Any]:
        view = self._resolver.jobs(now)
        mine = {key: job for key, job in view.items() if self.shard.owns(job.ref.namespace)}
        self.namespaces = {job.ref.namespace for job in mine.values()}
        return mine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resolver, name)


class ShardSource:
    """A metric source whose every query selects only the shard's namespaces."""

    def __init__(self, source: Any, resolver: ShardResolver, label: str = "namespace") -> None:
        self._source = source
        self._resolver = resolver
        self.label = label

    def _select(self) -> None:
        names = sorted(self._resolver.namespaces) or [NO_NAMESPACE]
        self._source.regex_matchers = {self.label: _alternation(names)}

    def read(self, window: Window, width: timedelta) -> Any:
        self._select()
        return self._source.read(window, width)

    def read_lazy(self, window: Window, width: timedelta) -> Any:
        self._select()
        return self._source.read_lazy(window, width)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)
