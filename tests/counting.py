"""A store wrapper for tests that must show what a cycle does *not* read."""

from __future__ import annotations

from typing import Any


class CountingStore:
    """The store, counting the buckets read back through :meth:`buckets` and the aggregates
    read through :meth:`aggregate`."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.read = 0
        self.aggregate_reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def buckets(self, job_id: int, window: Any = None) -> list:
        out = self._store.buckets(job_id, window)
        self.read += len(out)
        return out

    def aggregate(self, job_id: int) -> Any:
        self.aggregate_reads += 1
        return self._store.aggregate(job_id)
