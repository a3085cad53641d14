"""A metric source that replays recorded traces as jobs: ``demo``, tests and benchmarks.

It stands where Prometheus stands in the data flow and goes through the same bucketing as a
Prometheus raw-sample fetch (:func:`auditor.core.rollup.aggregate`): the traces become raw
samples in the exporter's units (:func:`auditor.traces.trace_samples`), garbage is dropped and
counted by :func:`auditor.core.metrics.normalize`, and buckets come out ``width``-aligned. So a
verdict seen in ``demo`` is the verdict the same series would get from a real cluster.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Sequence

from auditor.core.metrics import Metric
from auditor.core.model import Window
from auditor.core.readings import SourceReport, SourceResult
from auditor.core.rollup import aggregate
from auditor.traces import Trace, TraceJob, trace_samples


class ReplaySource:
    """Replays ``(trace, jobs)`` feeds placed to end at ``end`` (see :class:`TraceJob`)."""

    def __init__(
        self,
        feeds: Sequence[tuple[Trace, Sequence[TraceJob]]],
        *,
        end: datetime,
        duration: timedelta,
        interval: timedelta = timedelta(seconds=15),
        include: set[Metric] | None = None,
    ) -> None:
        self.feeds = list(feeds)
        self.end = end
        self.duration = duration
        self.interval = interval
        self.include = include

    def read(self, window: Window, width: timedelta) -> SourceResult:
        """All replayed samples inside ``window``, rolled up into ``width``-aligned buckets."""

        def samples():
            for trace, jobs in self.feeds:
                yield from trace_samples(
                    trace, jobs, end=self.end, duration=self.duration, interval=self.interval, include=self.include
                )

        buckets = aggregate(samples(), width, window)
        report = SourceReport(
            queries=0,
            present={b.metric for b in buckets if b.count},
            labels={"pod": "pod", "namespace": "namespace", "hostname": "Hostname", "source": "replay"},
            scrape_interval=self.interval.total_seconds(),
        )
        for b in buckets:
            if b.dropped:
                report.dropped[b.metric] = report.dropped.get(b.metric, 0) + b.dropped
        return SourceResult(buckets=buckets, report=report)

    def read_lazy(self, window: Window, width: timedelta) -> SourceResult:
        """:meth:`read`: a replay's buckets are objects from the start (:class:`~auditor.ports.MetricSource`)."""
        return self.read(window, width)
