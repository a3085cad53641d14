"""The Prometheus source: rollup buckets for every pod and GPU of a window, in a fixed number of queries.

How it reads (see :mod:`auditor.sources.promql` for the query shapes and boundary semantics):

1. one ``/api/v1/label/__name__/values`` call finds which DCGM exporter names (classic, DCGM
   4.6 and dcgm-exporter 4.9 names, :data:`auditor.core.metrics.EXPORTED`) have series in the
   window, and so the naming generation, which fixes each name's unit;
2. per present name, four ``query_range`` calls at ``step = width`` (sum, count, min and max
   ``_over_time``) return those aggregates of every series per aligned bucket ``[start, end)``,
   split by time only where the 11,000-points-per-series limit (or Prometheus's sample limit)
   demands it. A short window (an operator cycle's one or two buckets, :meth:`PrometheusSource.reads_raw`)
   is read instead as one raw-sample query per name, and the same four statistics are computed
   here exactly as Prometheus computes them (:mod:`auditor.sources.samples`);
3. buckets whose min/max/sum betray garbage (NaN, negative, GPU_UTIL 4294967295, a small
   overshoot that must be clamped) are re-read as raw samples — only those series, only the span
   of those buckets — and aggregated here, dropping and counting the garbage.

So the number of queries depends on the metric names and the window length, never on the number
of pods or jobs. Label conventions (``pod`` vs ``exported_pod``, ``Hostname`` vs ``hostname``,
``UUID`` vs ``uuid``, MIG ``GPU_I_ID``) are detected from the series themselves.

This module orchestrates the queries; the HTTP client is :mod:`auditor.sources.prometheus_client`
and the pure maths on the answers :mod:`auditor.sources.series`.
"""

from __future__ import annotations

import logging
import re
from array import array
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

from auditor.core.metrics import BY_NAME, SPECS, UTIL_RATIO, Metric, Naming, detect_naming, scale_of
from auditor.core.model import Bucket, GpuId, PodRef, Window
from auditor.core.readings import SourceReport, SourceResult
from auditor.core.rollup import BucketRun, LazyBuckets
from auditor.core.source_preference import SOURCE_LABEL, prefer_one_source
from auditor.errors import BadInput, QueryTooLarge
from auditor.sources import promql
from auditor.sources.prometheus_client import PrometheusClient
from auditor.sources.samples import STATS, bucket_stats
from auditor.sources.series import (
    EMPTY_ROW,
    Series,
    aggregate_raw,
    bucket_index,
    classify,
    classify_block,
    device_labels,
    from_ms,
    interval_estimate,
    merge_duplicates,
    nans,
    own_labels,
    raw_spans,
    short_labels,
    to_ms,
)

__all__ = ["PrometheusClient", "PrometheusSource", "ReadStats"]

log = logging.getLogger(__name__)

#: at most this many buckets of raw samples per garbage re-read query
RAW_SPAN_BUCKETS = 288

#: A read whose series hold at most ``RAW_READ_SAMPLES + RAW_READ_PER_BUCKET * buckets``
#: samples each (by the last measured scrape interval, else :data:`GUESSED_INTERVAL_S`) asks one
#: raw-sample query per exporter name instead of four aggregates: each series' labels are then
#: decoded once instead of four times, and Prometheus selects the samples once instead of
#: evaluating four functions. Past that bound the samples outweigh the labels saved
#: (bench/README.md, "Issue 18", the read: measured on a 5-minute cycle at 15 s and 30 s).
RAW_READ_SAMPLES = 24
RAW_READ_PER_BUCKET = 4
#: the scrape interval assumed before a read has measured one
GUESSED_INTERVAL_S = 15.0


@dataclass
class ReadStats:
    """Details of the last read beyond :class:`SourceReport`, for ``doctor``."""

    version: str = ""
    names: list[str] = field(default_factory=list)
    #: device keys (UUID or UUID/GPU_I_ID) seen, and those with a workload pod
    gpus: set[str] = field(default_factory=set)
    attributed: set[str] = field(default_factory=set)
    #: hostname → metrics seen there (for per-node presence checks)
    hosts: dict[str, set[Metric]] = field(default_factory=dict)
    mig: bool = False
    exporter_pods: set[str] = field(default_factory=set)
    #: the exporter naming generation detected (auditor.core.metrics.Naming), and why
    naming: Naming = Naming.CLASSIC
    naming_why: str = ""


class PrometheusSource:
    """:class:`~auditor.ports.MetricSource` over a Prometheus-compatible query API.

    ``matchers`` are extra label equalities added to every selector (e.g. ``{"cluster": "prod"}``
    where several clusters share one Prometheus/Thanos). ``pod_labels`` forces a convention
    (``"pod"``, ``"exported_pod"`` or ``"pod_name"``) instead of detecting it.
    ``max_points`` is the points-per-series limit to split under (11,000 in Prometheus).
    """

    def __init__(
        self,
        url: str,
        *,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        ca_file: str | None = None,
        insecure: bool = False,
        timeout: float = 60.0,
        retries: int = 2,
        tenant: str | None = None,
        matchers: Mapping[str, str] | None = None,
        pod_labels: str | None = None,
        metrics: Iterable[Metric] | None = None,
        max_points: int = promql.MAX_POINTS_PER_SERIES,
        concurrency: int = 4,
        raw_read_samples: int = RAW_READ_SAMPLES,
    ) -> None:
        self.client = PrometheusClient(
            url,
            bearer_token=bearer_token,
            basic_auth=basic_auth,
            ca_file=ca_file,
            insecure=insecure,
            timeout=timeout,
            retries=retries,
            tenant=tenant,
        )
        self.url = self.client.url
        self.matchers = dict(matchers or {})
        #: label regex matchers on every selector too, e.g. an operator shard's namespaces
        #: (auditor.operator_loop.shards sets them before each read)
        self.regex_matchers: dict[str, str] = {}
        self.forced: promql.LabelConvention | None = None
        if pod_labels:
            conv = [c for c in promql.POD_CONVENTIONS if c[0] == pod_labels]
            if not conv:
                raise BadInput(f"pod label convention {pod_labels!r}: use pod, exported_pod or pod_name")
            self.forced = promql.LabelConvention(*conv[0])
        self.metrics = tuple(metrics) if metrics is not None else tuple(SPECS)
        self.max_points = max(2, int(max_points))
        self.concurrency = max(1, int(concurrency))
        #: the raw-sample read's bound (:data:`RAW_READ_SAMPLES`); negative: always aggregates
        self.raw_read_samples = int(raw_read_samples)
        self._major: int | None = None
        #: the interval the last read with a full bucket measured (a short window may have none)
        self._interval: float | None = None
        self.stats = ReadStats()

    def close(self) -> None:
        self.client.close()

    # -- the MetricSource protocol ---------------------------------------------------------------
    def read(self, window: Window, width: timedelta) -> SourceResult:
        result = self.read_lazy(window, width)
        result.buckets = list(result.buckets)
        return result

    def read_lazy(self, window: Window, width: timedelta) -> SourceResult:
        """:meth:`read`, with ``buckets`` a :class:`~auditor.core.rollup.LazyBuckets`: the same
        buckets in the same order, made into objects only when iterated or per pod (the engine
        keeps one job's buckets as objects at a time)."""
        width_ms = int(width / timedelta(milliseconds=1))
        if width_ms < 1000:
            raise BadInput(f"bucket width {width} is below one second")
        aligned = window.aligned(width)
        start_ms, end_ms = to_ms(aligned.start), to_ms(aligned.end)
        client = self.client
        q0, w0 = client.queries, len(client.warnings)
        report = SourceReport()
        stats = ReadStats()
        major = self._server_major(stats)
        rng = promql.range_ms(width_ms, major)

        names = self._present_names(start_ms, end_ms)
        stats.names = names
        first_end = start_ms + width_ms
        if self.reads_raw(end_ms - start_ms, width_ms):
            blocks = self._read_raw(names, first_end, end_ms, width_ms, major)
            if not any(lab.get(SOURCE_LABEL) for _, own, _ in blocks for lab in _distinct(own)):
                # no series names a source, so none shadows another: the blocks go straight on
                parts = self._raw_groups(blocks, names, window, width_ms, major, report, stats)
                return self._finish(*parts, width_ms, q0, w0, report, stats)
            series = [s for name, own, block in blocks for s in _series_of(name, own, block)]
            del blocks
        else:
            series = self._read_aggregates(names, first_end, end_ms, width_ms, rng)
        # the naming decides the unit of DCGM_FI_DEV_GPU_UTIL_RATIO (percent in DCGM 4.6, a
        # ratio in dcgm-exporter 4.9): told by the names, else by that name's values
        util = [v for s in series if s.name == UTIL_RATIO for a in ("min", "max") for v in s.aggs.get(a, ())]
        naming, stats.naming_why, unknown = detect_naming(names, util)
        stats.naming = naming
        if unknown:  # neither unit can be ruled out: reading it either way could invert a verdict
            series = [s for s in series if s.name != UTIL_RATIO]
            report.warnings.append(stats.naming_why)
        # the label dicts are shared by the series of one device: each distinct one looked at once
        distinct = list({id(s.labels): s.labels for s in series}.values())
        # A GPU exported by both the node agent and dcgm-exporter is counted once: the agent's
        # series win per (device, metric) (auditor/core/source_preference.py says why). Where no
        # series names a source, all are dcgm-exporter's and none can shadow another.
        if any(d.get(SOURCE_LABEL) for d in distinct):
            series, shadowed = prefer_one_source(series, labels=lambda s: s.labels, metric=lambda s: s.metric)
            if shadowed:
                report.warnings.append(
                    f"{len(shadowed)} dcgm-exporter series left out: the gpu-auditor node agent serves the same GPU "
                    "and metric"
                )
                distinct = list({id(s.labels): s.labels for s in series}.values())
        conv = self.forced or promql.detect_convention(distinct)
        report.labels = conv.describe()
        report.labels.update(device_labels(distinct))
        del distinct
        report.labels["naming"] = naming.value

        #: (pod, GPU key, metric) → one list of time-ordered buckets per series (or re-read part)
        #: keyed by the pod object's identity (one object per pod): its dataclass hash is Python code
        groups: dict[tuple[int, str, str], tuple[PodRef, str, Metric, list[BucketRun | list[Bucket]]]] = {}
        n_ends = (end_ms - first_end) // width_ms + 1
        #: (start, end) of each bucket of the read, shared by all its buckets
        spans = [
            (from_ms(first_end + i * width_ms - width_ms), from_ms(first_end + i * width_ms)) for i in range(n_ends)
        ]
        # One PodRef / GpuId object per pod / device (not per series): the summary and the
        # engine group buckets by these, and identical objects compare and hash by identity.
        pod_objs: dict[PodRef, PodRef] = {}
        gpu_objs: dict[GpuId, GpuId] = {}

        dirty: dict[str, list[tuple[Series, PodRef, GpuId, list[int]]]] = {}
        #: samples per clean full bucket → how many buckets had that many (the interval estimate)
        counts: dict[int, int] = {}
        # 1. which pod and GPU each series describes (series order, for the warnings)
        attributed: list[tuple[Series, PodRef, GpuId]] = []
        # one list, emptied as it goes: each series is dropped once handled, unless a re-read needs it
        pending = cast("list[Series | None]", series)
        del series
        #: id of a (shared) label dict → (the dict, its GPU, its workload pod): worked out once per device
        identity: dict[int, tuple[dict[str, str], GpuId | None, PodRef | None]] = {}
        host_names: set[tuple[str, str]] = set()
        present_names: set[str] = set()
        for k in range(len(pending)):
            s, pending[k] = pending[k], None
            assert s is not None  # each slot is taken once
            known = identity.get(id(s.labels))
            if known is None:
                known = identity[id(s.labels)] = (s.labels, *self._identity(s.labels, conv, stats, gpu_objs, pod_objs))
            _, gpu, pod = known
            if gpu is None:
                report.warnings.append(f"{s.name} series without a GPU identity skipped: {short_labels(s.labels)}")
                continue
            # by name (a str hashes in C; a Metric member's hash is Python code), made metrics below
            if gpu.hostname:
                host_names.add((gpu.hostname, s.name))
            if s.aggs:
                present_names.add(s.name)
            if pod is None:
                continue
            attributed.append((s, pod, gpu))
        del pending, identity
        for host, name in host_names:
            stats.hosts[host].add(BY_NAME[name])
        report.present.update(BY_NAME[name] for name in present_names)
        # 2. clean and dirty buckets of every series, a whole exporter name at a time
        decided = classify(
            [s for s, _, _ in attributed if "count" in s.aggs],
            n_ends,
            first_end,
            width_ms,
            counts,
            naming,
            last_open=aligned.end > window.end,
        )
        # 3. runs of clean buckets and the dirty buckets to re-read, in series order
        scales = {name: scale_of(name, naming) for name in names}
        metric_keys = {name: BY_NAME[name].value for name in names}
        for s, pod, gpu in attributed:
            cnts = s.aggs.get("count")
            if cnts is None:  # an incomplete answer: no counts, so re-read whatever it has raw
                seen = {i for a in s.aggs.values() for i, v in enumerate(a) if v == v}
                dirty.setdefault(s.name, []).append((s, pod, gpu, [first_end + i * width_ms for i in sorted(seen)]))
                continue
            idx, bad = decided[id(s)]
            if idx:
                # the buckets stay as the series' arrays until a caller needs them as objects
                aggs = s.aggs
                sums, mins, maxs = aggs.get("sum"), aggs.get("min"), aggs.get("max")
                if sums is None or mins is None or maxs is None:
                    sums, mins, maxs = (aggs.get(a) or nans(len(cnts)) for a in ("sum", "min", "max"))
                run = BucketRun(pod, gpu, s.metric, scales[s.name], spans, sums, cnts, mins, maxs, idx)
                _add_part(groups, pod, gpu.key, s.metric, metric_keys[s.name], run)
            if bad:
                dirty.setdefault(s.name, []).append((s, pod, gpu, bad))
        del attributed, decided

        self._reread_dirty(dirty, groups, width_ms, major, naming, report)

        return self._finish(groups, conv, counts, width_ms, q0, w0, report, stats)

    def _reread_dirty(
        self,
        dirty: dict[str, list[tuple[Series, PodRef, GpuId, list[int]]]],
        groups: dict[tuple[int, str, str], tuple[PodRef, str, Metric, list[BucketRun | list[Bucket]]]],
        width_ms: int,
        major: int,
        naming: Naming,
        report: SourceReport,
    ) -> None:
        """The dirty buckets re-read raw (garbage dropped and counted), added to ``groups``."""
        for name, items in sorted(dirty.items()):
            for b in self._reread_garbage(name, items, width_ms, major, naming):
                if b.dropped:
                    report.dropped[b.metric] = report.dropped.get(b.metric, 0) + b.dropped
                _add_part(groups, b.pod, b.gpu.key, b.metric, b.metric.value, [b])

    def _finish(
        self,
        groups: dict[tuple[int, str, str], tuple[PodRef, str, Metric, list[BucketRun | list[Bucket]]]],
        conv: promql.LabelConvention,
        counts: dict[int, int],
        width_ms: int,
        q0: int,
        w0: int,
        report: SourceReport,
        stats: ReadStats,
    ) -> SourceResult:
        """The read's warnings, scrape interval and query count, and its buckets in order."""
        client = self.client
        unattributed = stats.gpus - stats.attributed
        if unattributed:
            report.warnings.append(
                f"{len(unattributed)} of {len(stats.gpus)} GPUs had no workload pod label in the window "
                "(not in use, or not attributed): not audited as jobs"
            )
        if stats.exporter_pods:
            report.warnings.append(
                "series whose pod label names dcgm-exporter itself were not treated as jobs "
                f"({', '.join(sorted(stats.exporter_pods))}); if workloads run there, scrape with honorLabels: true"
            )
        if conv.pod == "exported_pod" and not self.forced:
            report.warnings.append(
                "dcgm-exporter is scraped with honorLabels: false (workload pods are in exported_pod); read them from there"
            )
        # an operator cycle's window is often one or two buckets, none of them full: it reports
        # what the last window with full buckets measured, never an estimate from partial ones
        measured = interval_estimate(counts, width_ms)
        if measured is not None:
            self._interval = measured
        report.scrape_interval = measured or self._interval
        report.queries = client.queries - q0
        report.warnings.extend(client.warnings[w0:])
        self.stats = stats
        return SourceResult(buckets=LazyBuckets(merge_duplicates(groups.values(), report)), report=report)  # type: ignore[arg-type]

    def _raw_groups(
        self,
        blocks: list[tuple[str, list[dict[str, str]], Any]],
        names: list[str],
        window: Window,
        width_ms: int,
        major: int,
        report: SourceReport,
        stats: ReadStats,
    ) -> tuple[
        dict[tuple[int, str, str], tuple[PodRef, str, Metric, list[BucketRun | list[Bucket]]]],
        promql.LabelConvention,
        dict[int, int],
    ]:
        """The raw read's blocks as bucket runs, as :meth:`read_lazy` makes them of series, but
        a name at a time: the block's rows are classified as they are (no per-series objects),
        and only the series with a dirty bucket become :class:`Series` for the re-read."""
        import numpy as np

        aligned = window.aligned(timedelta(milliseconds=width_ms))
        start_ms, end_ms = to_ms(aligned.start), to_ms(aligned.end)
        first_end = start_ms + width_ms
        n_ends = (end_ms - first_end) // width_ms + 1
        # the naming decides the unit of DCGM_FI_DEV_GPU_UTIL_RATIO (as read_lazy does)
        util = [v for name, _, block in blocks if name == UTIL_RATIO for v in block[2:4].ravel().tolist()]
        naming, stats.naming_why, unknown = detect_naming(names, util)
        stats.naming = naming
        if unknown:
            blocks = [b for b in blocks if b[0] != UTIL_RATIO]
            report.warnings.append(stats.naming_why)
        distinct = _distinct([lab for _, own, _ in blocks for lab in own])
        conv = self.forced or promql.detect_convention(distinct)
        report.labels = conv.describe()
        report.labels.update(device_labels(distinct))
        report.labels["naming"] = naming.value
        pod_objs: dict[PodRef, PodRef] = {}
        gpu_objs: dict[GpuId, GpuId] = {}
        identity = {id(lab): self._identity(lab, conv, stats, gpu_objs, pod_objs) for lab in distinct}
        del distinct
        spans = [
            (from_ms(first_end + i * width_ms - width_ms), from_ms(first_end + i * width_ms)) for i in range(n_ends)
        ]
        groups: dict[tuple[int, str, str], tuple[PodRef, str, Metric, list[BucketRun | list[Bucket]]]] = {}
        dirty: dict[str, list[tuple[Series, PodRef, GpuId, list[int]]]] = {}
        counts: dict[int, int] = {}
        histogram: dict[int, int] = {}
        last_open = aligned.end > window.end
        for name, own, block in blocks:
            metric, scale, mkey = BY_NAME[name], scale_of(name, naming), BY_NAME[name].value
            rows: list[int] = []
            hosts: set[str] = set()
            any_gpu = False
            for j, lab in enumerate(own):
                gpu, pod = identity[id(lab)]
                if gpu is None:
                    report.warnings.append(f"{name} series without a GPU identity skipped: {short_labels(lab)}")
                    continue
                any_gpu = True
                if gpu.hostname:
                    hosts.add(gpu.hostname)
                if pod is not None:
                    rows.append(j)
            for host in hosts:
                stats.hosts[host].add(metric)
            if any_gpu:
                report.present.add(metric)
            if not rows:
                continue
            part = block[:, np.asarray(rows, dtype=np.int64), :] if len(rows) < len(own) else block
            decided = classify_block(
                part[0], part[1], part[2], part[3], name, naming, first_end, width_ms, histogram, last_open=last_open
            )
            cnts, sums, mins, maxs = part.tolist()
            for k, j in enumerate(rows):
                gpu, pod = identity[id(own[j])]
                assert gpu is not None and pod is not None
                idx, bad = decided[k]
                if idx:
                    run = BucketRun(pod, gpu, metric, scale, spans, sums[k], cnts[k], mins[k], maxs[k], idx)
                    _add_part(groups, pod, gpu.key, metric, mkey, run)
                if bad:
                    row = Series(
                        name, metric, own[j], {"count": cnts[k], "sum": sums[k], "min": mins[k], "max": maxs[k]}
                    )
                    dirty.setdefault(name, []).append((row, pod, gpu, bad))
        for v, t in histogram.items():
            counts[v] = counts.get(v, 0) + t
        self._reread_dirty(dirty, groups, width_ms, major, naming, report)
        return groups, conv, counts

    def reads_raw(self, span_ms: int, width_ms: int) -> bool:
        """Whether a read of ``span_ms`` in buckets of ``width_ms`` asks raw samples (see
        :data:`RAW_READ_SAMPLES`) rather than four aggregates per exporter name."""
        if self.raw_read_samples < 0:
            return False
        interval_ms = 1000 * (self._interval or GUESSED_INTERVAL_S)
        buckets = -(-span_ms // width_ms)
        return span_ms / interval_ms <= self.raw_read_samples + RAW_READ_PER_BUCKET * buckets

    # -- steps -------------------------------------------------------------------------------------
    @staticmethod
    def _identity(
        labels: dict[str, str],
        conv: promql.LabelConvention,
        stats: ReadStats,
        gpu_objs: dict[GpuId, GpuId],
        pod_objs: dict[PodRef, PodRef],
    ) -> tuple[GpuId | None, PodRef | None]:
        """The GPU and workload pod of a label set (one :class:`GpuId`/:class:`PodRef` object per
        device/pod), recorded in ``stats``; the pod is None for a GPU no workload holds."""
        gpu = promql.gpu_of(labels)
        if gpu is None:
            return None, None
        gpu = gpu_objs.setdefault(gpu, gpu)
        stats.gpus.add(gpu.key)
        stats.mig = stats.mig or bool(gpu.instance)
        if gpu.hostname:
            stats.hosts.setdefault(gpu.hostname, set())
        pod = promql.pod_of(labels, conv)
        if pod is not None and promql.looks_like_exporter(labels, conv):
            stats.exporter_pods.add(f"{pod.namespace}/{pod.pod}")
            pod = None
        if pod is None:
            return gpu, None
        stats.attributed.add(gpu.key)
        return gpu, pod_objs.setdefault(pod, pod)

    def _server_major(self, stats: ReadStats) -> int:
        """Prometheus's major version (range-selector boundary semantics changed in 3.0)."""
        info = self.client.buildinfo() if self._major is None else {"version": self.stats.version}
        version = str(info.get("version", "") or "")
        stats.version = version
        if self._major is None:
            m = re.match(r"v?(\d+)\.", version)
            self._major = int(m.group(1)) if m else 2
            if not m:
                log.info("Prometheus at %s reports no version; assuming 2.x range-selector semantics", self.url)
        return self._major

    def _present_names(self, start_ms: int, end_ms: int) -> list[str]:
        return self.names_present([n for m in self.metrics for n in SPECS[m].names], start_ms, end_ms)

    def names_present(self, names: Sequence[str], start_ms: int, end_ms: int) -> list[str]:
        """Which of the metric ``names`` have series under this source's matchers in ``[start, end]``
        (one label-values call; ``doctor`` asks it of kube-state-metrics' series too)."""
        match = promql.selector(
            "", self.matchers, {**self.regex_matchers, "__name__": promql.regex_alternation(list(names))}
        )
        found = self.client.label_values("__name__", [match], start_ms, end_ms)
        return sorted(set(found) & set(names))

    def _read_aggregates(
        self, names: list[str], first_end: int, last_end: int, width_ms: int, rng: int
    ) -> list[Series]:
        """Run the bucket queries (concurrently) and fold each answer in as it arrives.

        At most ``concurrency`` queries are in flight, and each worker turns its decoded answer
        into flat arrays of values (NaN = no sample) before handing it over, so peak memory
        is a few answers plus the arrays, not every decoded answer at once.
        """
        jobs = [
            (name, agg, a, b)
            for name in names
            for agg in promql.AGGREGATES
            for a, b in promql.chunks(first_end, last_end, width_ms, self.max_points - 1)
        ]
        n = (last_end - first_end) // width_ms + 1
        #: (name, sorted label items) → series: a sorted tuple is half the size of a frozenset
        by_key: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
        index: dict[object, int] = {}
        #: (name, chunk) → the series of the first answer for it, in answer order. Prometheus
        #: answers every aggregate of one selector with the same series in the same order, so
        #: the other three answers find their series by position, checked by comparing the
        #: label dicts (cheap), and hash the label set only where that check fails.
        order: dict[tuple[str, int], list[Series]] = {}
        strings: dict[str, str] = {}
        #: sorted label items → the one label dict the series of that label set share
        shared: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}

        def compact(result: list[dict]) -> list[tuple[dict, int, Any]]:
            """An answer as (labels, first bucket index, values array) per series; the
            index is -1 (and the values (index, value) pairs) where the series has gaps."""
            out: list[tuple[dict, int, Any]] = []
            for item in result:
                labels = item.get("metric", {})
                labels.pop("__name__", None)
                points = item.get("values")
                if not points:
                    out.append((labels, 0, EMPTY_ROW))
                    continue
                first = bucket_index(index, points[0][0], first_end, width_ms)
                last = bucket_index(index, points[-1][0], first_end, width_ms)
                if last - first + 1 == len(points):  # no gaps: one slice assignment
                    out.append((labels, first, array("d", [float(v) for _, v in points])))
                else:
                    out.append(
                        (labels, -1, [(bucket_index(index, t, first_end, width_ms), float(v)) for t, v in points])
                    )
            return out

        def fetch(name: str, agg: str, a: int, b: int) -> list[tuple[dict, int, Any]]:
            return self._range_chunk(name, agg, a, b, width_ms, rng, compact)

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            queue = iter(jobs)
            inflight: dict[Future, tuple[str, str, int]] = {}

            def submit_next() -> None:
                job = next(queue, None)
                if job is not None:
                    inflight[pool.submit(fetch, *job)] = job[:3]

            for _ in range(self.concurrency):
                submit_next()
            while inflight:
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                for future in done:
                    name, agg, chunk = inflight.pop(future)
                    submit_next()
                    metric = BY_NAME[name]
                    result = future.result()
                    ref = order.get((name, chunk))
                    mine: list[Series] | None = None
                    if ref is None:
                        mine = order[(name, chunk)] = []
                        ref = []
                    n_ref = len(ref)
                    for j, (labels, first, got) in enumerate(result):
                        if j < n_ref and ref[j].labels == labels:
                            s = ref[j]
                        else:
                            items = tuple(sorted(labels.items()))
                            found = by_key.get((name, items))
                            if found is None:
                                own = shared.get(items)
                                if own is None:
                                    own = shared[items] = own_labels(labels, strings)
                                found = by_key[(name, items)] = Series(name, metric, own)
                            s = found
                        if mine is not None:
                            mine.append(s)
                        values = s.aggs.get(agg)
                        if values is None:
                            values = s.aggs[agg] = nans(n)
                        if first >= 0:
                            values[first : first + len(got)] = got
                        else:
                            for i, v in got:
                                values[i] = v
                    del result, future
        return list(by_key.values())

    def _read_raw(
        self, names: list[str], first_end: int, last_end: int, width_ms: int, major: int
    ) -> list[tuple[str, list[dict[str, str]], Any]]:
        """One raw-sample query per exporter name over the whole read, its statistics per bucket
        computed here exactly as the aggregate queries would answer them
        (:func:`auditor.sources.samples.bucket_stats`): per name, its series' label dicts and
        one ``(4, series, buckets)`` block.

        Label dicts are shared by the series of one device (the exporter names of a GPU carry
        the same labels), so the identity of a GPU and its pod is worked out once per device.
        """
        n = (last_end - first_end) // width_ms + 1
        first_start = first_end - width_ms

        def fetch(name: str) -> list[tuple[int, int, list[dict], Any]]:
            return self._raw_chunk(name, first_end, last_end, width_ms, major, first_start, n)

        if self.concurrency == 1:
            answers = [fetch(name) for name in names]
        else:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                answers = list(pool.map(fetch, names))
        owner = _SharedLabels()
        out: list[tuple[str, list[dict[str, str]], Any]] = []
        for name, parts in zip(names, answers):
            if len(parts) == 1:
                _, _, label_sets, block = parts[0]
            else:  # split by time: the same series in several answers, each for its buckets
                label_sets, block = _join_parts(parts, n, first_end, width_ms)
            out.append((name, owner.of(label_sets), block))
        return out

    def _raw_chunk(
        self, name: str, first_end: int, last_end: int, width_ms: int, major: int, first_start: int, n: int
    ) -> list[tuple[int, int, list[dict], Any]]:
        """The raw samples of bucket ends ``first_end..last_end`` as ``(first_end, last_end,
        labels, statistics)``; halves itself on the engines' size limits, as :meth:`_range_chunk`."""
        sel = promql.selector(name, self.matchers, self.regex_matchers)

        def query(a: int, b: int) -> list[tuple[int, int, list[dict], Any]]:
            rng = promql.range_ms(b - a + width_ms, major)
            labels, block = self.client.query(
                f"{sel}[{rng}ms]",
                at_ms=b - 1,
                convert=lambda data: bucket_stats((data or {}).get("result", []), first_start, width_ms, n),
            )
            return [(a, b, labels, block)]

        return _halving(query, first_end, last_end, width_ms, f"the raw read of {sel}")

    def _range_chunk(
        self,
        name: str,
        agg: str,
        first_end: int,
        last_end: int,
        width_ms: int,
        rng: int,
        convert: Callable[[list[dict]], list] = list,
    ) -> list:
        """One query_range over bucket ends ``first_end..last_end``; halves itself on sample limits.

        Returns ``convert`` of the answer's series (run under the client's decode lock).
        """
        expr = promql.bucket_query(promql.selector(name, self.matchers, self.regex_matchers), agg, rng)

        def query(a: int, b: int) -> list:
            return self.client.query_range(
                expr, a - 1, b - 1, width_ms, convert=lambda data: convert((data or {}).get("result", []))
            )

        return _halving(query, first_end, last_end, width_ms, expr)

    def _reread_garbage(
        self,
        name: str,
        items: list[tuple[Series, PodRef, GpuId, list[int]]],
        width_ms: int,
        major: int,
        naming: Naming = Naming.CLASSIC,
    ) -> list[Bucket]:
        """Raw samples of just the dirty series and buckets, aggregated here with garbage dropped."""
        metric = BY_NAME[name]
        scale = scale_of(name, naming)
        wanted: dict[frozenset, tuple[PodRef, GpuId, set[int]]] = {
            frozenset(s.labels.items()): (pod, gpu, set(ends)) for s, pod, gpu, ends in items
        }
        ends = sorted({e for _, _, _, es in items for e in es})
        # narrow the raw read to the dirty GPUs when they all name themselves the same way
        spellings = {"UUID" if s.labels.get("UUID") else "uuid" if s.labels.get("uuid") else "" for s, *_ in items}
        regex: dict[str, str] = {}
        if len(spellings) == 1 and "" not in spellings:
            label = spellings.pop()
            regex[label] = promql.regex_alternation(s.labels[label] for s, *_ in items)
        sel = promql.selector(name, self.matchers, {**self.regex_matchers, **regex})
        samples: dict[frozenset, list[tuple[int, float]]] = {}
        for first, last in raw_spans(ends, width_ms, RAW_SPAN_BUCKETS):
            span = last - first + width_ms
            rng = promql.range_ms(span, major)
            data = self.client.query(f"{sel}[{rng}ms]", at_ms=last - 1)
            for item in (data or {}).get("result", []):
                labels = dict(item.get("metric", {}))
                labels.pop("__name__", None)
                key = frozenset(labels.items())
                if key in wanted:
                    samples.setdefault(key, []).extend(
                        (promql.parse_ts_ms(t), float(v)) for t, v in item.get("values", [])
                    )
        out: list[Bucket] = []
        for key, (pod, gpu, bucket_ends) in wanted.items():
            per_bucket: dict[int, list[float]] = {e: [] for e in bucket_ends}
            for ts, v in samples.get(key, []):
                end = ts - ts % width_ms + width_ms
                if end in per_bucket:
                    per_bucket[end].append(v)
            for end, values in sorted(per_bucket.items()):
                out.append(aggregate_raw(pod, gpu, metric, from_ms(end - width_ms), from_ms(end), values, scale))
        return out


def _halving(query: Callable[[int, int], list], first_end: int, last_end: int, width_ms: int, what: str) -> list:
    """``query`` of bucket ends ``first_end..last_end``, or of its halves, each halved again in
    turn, while an engine refuses it as too large by time (Prometheus's and Thanos/Mimir/
    VictoriaMetrics' sample and range limits: :class:`~auditor.errors.QueryTooLarge`); the
    answers' parts in time order. One bucket that is still too large is the error."""
    try:
        return query(first_end, last_end)
    except QueryTooLarge as exc:
        if not exc.splits_by_time or first_end == last_end:
            raise
        halves = promql.halve(first_end, last_end, width_ms)
        log.info("splitting %s at %s: %s", what, halves[0][1], exc)
        return [part for a, b in halves for part in _halving(query, a, b, width_ms, what)]


def _add_part(
    groups: dict[tuple[int, str, str], tuple[PodRef, str, Metric, list[BucketRun | list[Bucket]]]],
    pod: PodRef,
    gpu_key: str,
    metric: Metric,
    metric_key: str,
    part: BucketRun | list[Bucket],
) -> None:
    """Add a run of clean buckets, or re-read ones, to its (pod, GPU, metric) group; keyed by
    the pod object's identity and the metric's value (``metric_key``, computed by the caller
    once per name: an Enum member's hash and value are Python code, called per series)."""
    key = (id(pod), gpu_key, metric_key)
    group = groups.get(key)
    if group is None:
        groups[key] = (pod, gpu_key, metric, [part])
    else:
        group[3].append(part)


def _join_parts(
    parts: list[tuple[int, int, list[dict], Any]], n: int, first_end: int, width_ms: int
) -> tuple[list[dict], Any]:
    """The answers of a time-split raw read as one: a row per distinct label set (in order of
    first appearance), each part's buckets copied from its own columns."""
    import numpy as np

    index: dict[tuple[tuple[str, str], ...], int] = {}
    label_sets: list[dict] = []
    rows: list[list[int]] = []
    for _, _, labels, _ in parts:
        mine = []
        for lab in labels:
            key = tuple(sorted(lab.items()))
            i = index.get(key)
            if i is None:
                i = index[key] = len(label_sets)
                label_sets.append(lab)
            mine.append(i)
        rows.append(mine)
    block = np.full((len(STATS), len(label_sets), n), np.nan)
    for (a, b, _, part), mine in zip(parts, rows):
        lo, hi = (a - first_end) // width_ms, (b - first_end) // width_ms + 1
        block[:, mine, lo:hi] = part[:, :, lo:hi]
    return label_sets, block


class _SharedLabels:
    """One label dict per label set across the answers of a read (a GPU's exporter names carry
    the same labels), each a copy (:func:`~auditor.sources.series.own_labels`) made once.

    Prometheus lists the series of every name in the same label order, so an answer's series are
    matched to the first answer's by position (a dict comparison: no hashing of fresh strings);
    only where that fails is the label set looked up by its items.
    """

    def __init__(self) -> None:
        self.strings: dict[str, str] = {}
        self.ref: list[dict[str, str]] = []
        self.ref_own: list[dict[str, str]] = []
        self.by_items: dict[tuple[tuple[str, str], ...], dict[str, str]] | None = None

    def of(self, label_sets: list[dict[str, str]]) -> list[dict[str, str]]:
        ref, ref_own, n_ref = self.ref, self.ref_own, len(self.ref)
        out: list[dict[str, str]] = []
        for j, labels in enumerate(label_sets):
            if j < n_ref and ref[j] == labels:
                out.append(ref_own[j])
                continue
            if self.by_items is None:
                self.by_items = {tuple(r.items()): o for r, o in zip(ref, ref_own)}
            key = tuple(labels.items())
            own = self.by_items.get(key)
            if own is None:
                own = self.by_items[key] = own_labels(labels, self.strings)
            out.append(own)
        if not n_ref:
            self.ref, self.ref_own = label_sets, list(out)
        return out


def _distinct(label_dicts: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """The distinct label dict objects, in order of first appearance (they are shared by a device's series)."""
    return list({id(lab): lab for lab in label_dicts}.values())


def _series_of(name: str, own: list[dict[str, str]], block: Any) -> list[Series]:
    """A raw read's block of one name as :class:`Series` (rows as lists of floats, made in C)."""
    metric = BY_NAME[name]
    cnts, sums, mins, maxs = block.tolist()
    return [
        Series(name, metric, lab, {"count": cnt, "sum": sm, "min": lo, "max": hi})
        for lab, cnt, sm, lo, hi in zip(own, cnts, sums, mins, maxs)
    ]
