"""Which share of a cluster one operator shard audits: whole namespaces, by hash.

In kube-state-metrics' pattern (``--shard`` / ``--total-shards``: an object belongs to shard
``md5 % total``; a StatefulSet's ordinal names the shard), but the unit is the **namespace**, not
each object: every pod of a job, its owner chain, its Kueue Workload and its team live in one
namespace, so a job is never split between shards (a node hash would split a multi-node
training job, and two shards would each audit part of its GPUs). The namespace *name* is hashed,
not its UID, because the DCGM series in Prometheus carry the name: each shard's queries select
only its namespaces' series.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``total`` (0-based); ``Shard(0, 1)`` is the whole cluster."""

    index: int = 0
    total: int = 1

    def __post_init__(self) -> None:
        if self.total < 1 or not 0 <= self.index < self.total:
            raise ValueError(f"shard {self.index} of {self.total}: need 0 <= shard < total_shards")

    @property
    def sharded(self) -> bool:
        return self.total > 1

    @property
    def primary(self) -> bool:
        """The shard that also runs what is done once per cluster (reports, retention, the gate)."""
        return self.index == 0

    @property
    def label(self) -> str:
        """``2/4``: recorded with each audit run, so each shard continues from its own runs."""
        return f"{self.index}/{self.total}"

    def owns(self, namespace: str) -> bool:
        return namespace_shard(namespace, self.total) == self.index


#: the whole cluster, one shard
WHOLE = Shard()


def namespace_shard(namespace: str, total: int) -> int:
    """The shard a namespace belongs to: the first 8 bytes of the name's MD5, modulo ``total``."""
    digest = hashlib.md5(namespace.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big") % total


_ORDINAL = re.compile(r"-(\d+)$")


def ordinal_of(pod_name: str) -> int | None:
    """A StatefulSet pod's ordinal (``gpu-auditor-3`` → 3), or None for another name."""
    m = _ORDINAL.search(pod_name)
    return int(m.group(1)) if m else None
