"""The interface every metric source implements (Prometheus, trace replay, ...).

A source answers one question: for a window, the rollup buckets of every (pod, GPU, metric)
it has. The number of calls a source makes must not grow with the number of jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from auditor.core.metrics import Metric
from auditor.core.model import Bucket, Window


@dataclass(slots=True)
class SourceReport:
    """What a source saw while reading, for ``doctor``, ``explain`` and the audit-run record."""

    queries: int = 0
    #: metrics that had at least one series in the window
    present: set[Metric] = field(default_factory=set)
    #: garbage samples dropped, per metric
    dropped: dict[Metric, int] = field(default_factory=dict)
    #: the label convention detected, e.g. {"pod": "exported_pod", "hostname": "Hostname"}
    labels: dict[str, str] = field(default_factory=dict)
    #: the sample interval the source observed or was told (seconds)
    scrape_interval: float | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SourceResult:
    buckets: list[Bucket]
    report: SourceReport


class MetricSource(Protocol):
    """Reads rollup buckets for all pods and GPUs of a window."""

    def read(self, window: Window, width: timedelta) -> SourceResult:
        """Return the ``width``-aligned buckets that overlap ``window`` (half-open)."""
        ...
