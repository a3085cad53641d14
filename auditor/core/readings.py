"""What a metric source hands back: a window's rollup buckets and what it saw while reading.

The values every source (Prometheus, trace replay, ...) returns through the
:class:`~auditor.ports.MetricSource` port; pure data, so the use-cases and the core read them
without knowing which source made them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from auditor.core.identity import Quarantine
from auditor.core.metrics import Metric
from auditor.core.model import Bucket


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
    #: series refused for an identity no Kubernetes object could have, per reason (never jobs)
    rejected: Quarantine = field(default_factory=Quarantine)


@dataclass(slots=True)
class SourceResult:
    buckets: list[Bucket]
    report: SourceReport
