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
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

from auditor.core.identity import InvalidIdentity, Quarantine
from auditor.core.metrics import BY_NAME, SPECS, UTIL_RATIO, Metric, Naming, detect_naming, scale_of
from auditor.core.model import Bucket, GpuId, PodRef, Window
from auditor.core.readings import SourceReport, SourceResult
from auditor.core.rollup import BucketRun, LazyBuckets, Piece, per_device
from auditor.core.source_preference import SOURCE_LABEL, prefer_one_source
from auditor.errors import BadInput, QueryTooLarge
from auditor.sources import promql
from auditor.sources.device_rows import DeviceRows, NameRows, ReadBlock, name_rows
from auditor.sources.prometheus_client import (
    MAX_READ_MEMORY_MB,
    MAX_SERIES_PER_ANSWER,
    MAX_SERIES_PER_CYCLE,
    PrometheusClient,
)
from auditor.sources.samples import (
    STATS,
    bucket_stats,
    label_key,
    labels_of,
    matrix_of,
    matrix_result,
    parse_matrix,
    stats_of,
)
from auditor.sources.series import (
    Series,
    aggregate_raw,
    classify,
    classify_masks,
    device_labels,
    from_ms,
    interval_estimate,
    merge_duplicates,
    nans,
    raw_spans,
    row_verdicts,
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
#: bytes a read holds per series and bucket of an exporter name: its four statistics as float64
#: (the ``(4, series, buckets)`` blocks), what ``prometheus.max_read_memory_mb`` bounds
BYTES_PER_CELL = 8 * len(STATS)
#: series left out of a read that are named one by one in its warnings (the rest are counted)
NAMED_REJECTS = 5


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
    #: label sets whose pod no Kubernetes object could have, per reason (auditor/core/identity.py)
    rejected: Quarantine = field(default_factory=Quarantine)
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
        answer_deadline: float | None = None,
        max_series_per_answer: int = MAX_SERIES_PER_ANSWER,
        max_series_per_cycle: int = MAX_SERIES_PER_CYCLE,
        max_read_memory_mb: int = MAX_READ_MEMORY_MB,
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
            answer_deadline=answer_deadline,
            max_series_per_answer=max_series_per_answer,
            max_series_per_cycle=max_series_per_cycle,
            max_read_memory_mb=max_read_memory_mb,
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
        #: the last raw read's label sets (JSON key → labels) and their identities under
        #: ``_known_conv``: a cycle's next read decodes and identifies only the new ones
        self._labels: dict[bytes, dict[str, str]] = {}
        self._known: dict[bytes, tuple[GpuId | None, str, PodRef | None, str | InvalidIdentity]] = {}
        self._known_conv: promql.LabelConvention | None = None
        #: the series the current read left out for a sample that is not a number, and why
        self._rejected: list[tuple[str, dict, str]] = []
        #: selector → label sets an answer of the current read carried twice (an HA pair without
        #: deduplication): merged per bucket (the fuller kept), and said once per selector
        self._doubled: dict[str, int] = {}
        self._rejected_lock = threading.Lock()

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
        client.begin_read()
        self._rejected, self._doubled = [], {}
        report = SourceReport()
        stats = ReadStats()
        major = self._server_major(stats)
        rng = promql.range_ms(width_ms, major)

        names = self._present_names(start_ms, end_ms)
        stats.names = names
        first_end = start_ms + width_ms
        partial: dict[str, Any] = {}
        if self.reads_raw(end_ms - start_ms, width_ms):
            keys, labels, blocks = self._read_raw(names, first_end, end_ms, width_ms, major)
        else:
            keys, labels, blocks, partial = self._read_aggregates(names, first_end, end_ms, width_ms, rng)
        if not partial and not any(lab.get(SOURCE_LABEL) for lab in labels):
            # no series names a source, so none shadows another, and each series has its four
            # statistics: the blocks go straight on
            parts = self._raw_groups(blocks, keys, labels, names, window, width_ms, major, report, stats)
            return self._finish(*parts[:3], width_ms, q0, w0, report, stats, parts[3])
        series = [
            s
            for name, devs, block in blocks
            for s in _series_of(name, [labels[d] for d in devs], block, partial.get(name))
        ]
        del blocks
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

    def _reject(self, name: str, rejected: list[tuple[dict, str]]) -> None:
        """Series of ``name`` an answer left out (a sample that is not a number), for the warnings."""
        if rejected:
            with self._rejected_lock:
                self._rejected.extend((name, lab, why) for lab, why in rejected)

    def _once(self, selector: str, keys: list[bytes]) -> list[bytes]:
        """``keys`` (an answer's label sets), noting those it holds twice for the read's warnings."""
        doubled = len(keys) - len(set(keys))
        if doubled:
            with self._rejected_lock:
                self._doubled[selector] = max(doubled, self._doubled.get(selector, 0))
        return keys

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
        rows: list[Piece] | None = None,
    ) -> SourceResult:
        """The read's warnings, scrape interval and query count, and its buckets in order: those
        of ``groups`` (merged per device) and the devices kept as rows (``rows``, in order)."""
        client = self.client
        unattributed = stats.gpus - stats.attributed
        if unattributed:
            report.warnings.append(
                f"{len(unattributed)} of {len(stats.gpus)} GPUs had no workload pod label in the window "
                "(not in use, or not attributed): not audited as jobs"
            )
        if stats.rejected:
            report.rejected = stats.rejected
            report.warnings.extend(stats.rejected.lines())
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
        report.warnings.extend(_rejected_warnings(self._rejected))
        report.warnings.extend(
            f"{n:,} series answered twice with identical labels for {sel} (an HA pair without deduplication?): "
            "each counted once"
            for sel, n in sorted(self._doubled.items())
        )
        self.stats = stats
        pieces = per_device(merge_duplicates(groups.values(), report))
        if rows:
            pieces = _in_order(pieces, rows) if pieces else rows
        return SourceResult(buckets=LazyBuckets(pieces), report=report)  # type: ignore[arg-type]

    def _raw_groups(
        self,
        blocks: list[tuple[str, list[int], Any]],
        keys: list[bytes],
        labels: list[dict[str, str]],
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
        list[Piece],
    ]:
        """The raw read's blocks as buckets, as :meth:`read_lazy` makes them of series, but a
        name at a time with no per-series objects: the rows are classified as they are, and a
        device with one label set, nothing to re-read and one name per metric stays as its rows
        (:mod:`auditor.sources.device_rows`: the pieces returned, in order); the other devices'
        series become runs and re-reads in the groups returned (with the convention and the
        interval histogram), as the aggregate path makes them."""
        import numpy as np

        aligned = window.aligned(timedelta(milliseconds=width_ms))
        start_ms, end_ms = to_ms(aligned.start), to_ms(aligned.end)
        first_end = start_ms + width_ms
        n_ends = (end_ms - first_end) // width_ms + 1
        # the naming decides the unit of DCGM_FI_DEV_GPU_UTIL_RATIO (as read_lazy does)
        util = [v for name, _, block in blocks if name == UTIL_RATIO for v in block[2:4].ravel().tolist()]
        naming, stats.naming_why, unknown = detect_naming(names, util)
        stats.naming = naming
        used: Sequence[int] = range(len(labels))
        if unknown:
            blocks = [b for b in blocks if b[0] != UTIL_RATIO]
            report.warnings.append(stats.naming_why)
            used = list(dict.fromkeys(d for _, devs, _ in blocks for d in devs))
        distinct = [labels[d] for d in used]
        conv = self.forced or promql.detect_convention(distinct)
        report.labels = conv.describe()
        report.labels.update(device_labels(distinct))
        report.labels["naming"] = naming.value
        del distinct
        gpus, gpu_keys, pods = self._identities(keys, labels, used, conv, stats)
        n_dev = len(labels)
        has_gpu = np.array([g is not None for g in gpus], dtype=bool)
        has_pod = np.array([p is not None for p in pods], dtype=bool)
        host_ids: dict[str, int] = {}
        host_of = np.array(
            [host_ids.setdefault(g.hostname, len(host_ids)) if g is not None and g.hostname else -1 for g in gpus],
            dtype=np.int64,
        )
        hosts = list(host_ids)
        spans = [
            (from_ms(first_end + i * width_ms - width_ms), from_ms(first_end + i * width_ms)) for i in range(n_ends)
        ]
        histogram: dict[int, int] = {}
        last_open = aligned.end > window.end
        #: per name: metric, its rows' devices, the attributed rows' block and clean/dirty masks
        read: list[tuple[str, Metric, Any, Any, Any, Any]] = []
        simple = has_pod.copy()
        for name, devs, block in blocks:
            metric = BY_NAME[name]
            dev = np.asarray(devs, dtype=np.int64)
            gpu_rows = has_gpu[dev]
            if not gpu_rows.all():
                for j in np.flatnonzero(~gpu_rows).tolist():
                    report.warnings.append(
                        f"{name} series without a GPU identity skipped: {short_labels(labels[devs[j]])}"
                    )
            if gpu_rows.any():
                report.present.add(metric)
            on = host_of[dev]
            for h in np.unique(on[on >= 0]).tolist():
                stats.hosts[hosts[h]].add(metric)
            sel = np.flatnonzero(has_pod[dev])
            if not len(sel):
                continue
            part = block[:, sel, :] if len(sel) < len(dev) else block
            ok, bad = classify_masks(part[0], part[1], part[2], part[3], name, naming, histogram, last_open=last_open)
            dev = dev[sel]
            simple[dev[bad.any(axis=1)]] = False
            # one label set twice in an answer (an engine's failed deduplication): merged per bucket
            simple[np.bincount(dev, minlength=n_dev) > 1] = False
            read.append((name, metric, dev, part, ok, bad))
        # a metric read from two names (a rename inside the window) is merged per bucket, and
        # a device with two label sets (duplicate scrapes) per bucket too: the general path
        for metric in {m for _, m, *_ in read}:
            mine = [(dev, ok) for _, m, dev, _, ok, _ in read if m is metric]
            if len(mine) > 1:
                names_with = np.zeros(n_dev, dtype=np.int64)
                for dev, ok in mine:
                    names_with[dev[ok.any(axis=1)]] += 1
                simple[names_with > 1] = False
        seen: dict[tuple[int, str], int] = {}
        for d in np.flatnonzero(has_pod).tolist():
            other = seen.setdefault((id(pods[d]), gpu_keys[d]), d)
            if other != d:
                simple[d] = simple[other] = False
        groups: dict[tuple[int, str, str], tuple[PodRef, str, Metric, list[BucketRun | list[Bucket]]]] = {}
        dirty: dict[str, list[tuple[Series, PodRef, GpuId, list[int]]]] = {}
        kept: list[NameRows] = []
        sizes = np.zeros(n_dev, dtype=np.int64)
        for name, metric, dev, part, ok, bad in sorted(read, key=lambda r: r[1].value):
            scale = scale_of(name, naming)
            is_simple = simple[dev]
            rows = name_rows(metric, scale, part, ok, np.flatnonzero(is_simple & ok.any(axis=1)), dev, n_dev, sizes)
            if rows is not None:
                kept.append(rows)
            general = np.flatnonzero(~is_simple).tolist()
            if not general:
                continue
            mkey = metric.value
            for j, (idx, ends) in zip(general, row_verdicts(ok, bad, general, first_end, width_ms)):
                d = int(dev[j])
                gpu, pod = gpus[d], pods[d]
                assert gpu is not None and pod is not None
                cnts, sums, mins, maxs = part[:, j, :].tolist()
                if idx:
                    run = BucketRun(pod, gpu, metric, scale, spans, sums, cnts, mins, maxs, idx)
                    _add_part(groups, pod, gpu_keys[d], metric, mkey, run)
                if ends:
                    row = Series(name, metric, labels[d], {"count": cnts, "sum": sums, "min": mins, "max": maxs})
                    dirty.setdefault(name, []).append((row, pod, gpu, ends))
        counts: dict[int, int] = dict(histogram)
        self._reread_dirty(dirty, groups, width_ms, major, naming, report)
        block = ReadBlock(kept, spans)
        pieces: list[Piece] = []
        for d in np.flatnonzero(simple & (sizes > 0)).tolist():
            pod, gpu = pods[d], gpus[d]
            assert pod is not None and gpu is not None
            pieces.append((pod, gpu_keys[d], DeviceRows(block, d, pod, gpu, int(sizes[d]))))
        return groups, conv, counts, _in_order(pieces)

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
        gpu, key, pod, exporter = _identify(labels, conv, gpu_objs, pod_objs)
        if gpu is not None:
            _record(stats, gpu, key, pod, exporter)
        return gpu, pod

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
    ) -> tuple[list[bytes], list[dict[str, str]], list[tuple[str, list[int], Any]], dict[str, Any]]:
        """Run the bucket queries (concurrently) and fold each answer in as it arrives.

        Returns what :meth:`_read_raw` returns (the distinct label sets as keys and dicts, and per
        name its rows' label-set indices and one ``(4, series, buckets)`` block of
        :data:`~auditor.sources.samples.STATS`), and per name whose rows some answer lacked (an
        incomplete answer) which aggregates each row has (``(4, rows)`` booleans). Each answer is
        read from its bytes (:func:`~auditor.sources.samples.parse_matrix`: a query_range answer
        is a matrix of one point per bucket end), so no Python object is made per point; at most
        ``concurrency`` queries are in flight, each answer's rows held as arrays until the end.
        """
        import numpy as np

        jobs = [
            (name, agg, a, b)
            for name in names
            for agg in promql.AGGREGATES
            for a, b in promql.chunks(first_end, last_end, width_ms, self.max_points - 1)
        ]
        n = (last_end - first_end) // width_ms + 1
        stat_of = {agg: STATS.index(agg) for agg in promql.AGGREGATES}

        def fetch(name: str, agg: str, a: int, b: int) -> list[tuple[list[bytes], list[int], Any, Any]]:
            return self._range_chunk(name, agg, a, b, width_ms, rng, n)

        #: per name: label-set key → row, and its answers' (stat, rows, lens, columns, values)
        rows_of: dict[str, dict[bytes, int]] = {name: {} for name in names}
        #: per name: its (4, rows, buckets) block and which (statistic, row) an answer had,
        #: grown as answers bring new rows (the first answer of a name usually brings them all)
        held: dict[str, tuple[Any, Any]] = {}

        def empty(rows: int) -> tuple[Any, Any]:
            return np.full((len(STATS), rows, n), np.nan), np.zeros((len(STATS), rows), dtype=bool)

        def fold(name: str, k: int, keys: list[bytes], lens: list[int], ts: Any, values: Any) -> None:
            row_of = rows_of[name]
            rows = np.array([row_of.setdefault(key, len(row_of)) for key in keys], dtype=np.int64)
            block, seen = held.get(name) or empty(0)
            if len(row_of) > block.shape[1]:
                grown = empty(max(len(row_of), 2 * block.shape[1]))
                grown[0][:, : block.shape[1]], grown[1][:, : block.shape[1]] = block, seen
                block, seen = held[name] = grown
            seen[k, rows] = True
            at = np.repeat(rows, lens)
            # evaluation timestamps are bucket ends - 1 ms (promql.parse_ts_ms's rounding)
            cols = (np.rint(ts * 1000).astype(np.int64) + 1 - first_end) // width_ms
            inside = (cols >= 0) & (cols < n)
            if not inside.all():
                at, cols, values = at[inside], cols[inside], values[inside]
            # (a series' points are one per bucket end: two points share a cell only where a
            # label set comes twice in an answer)
            if len(set(keys)) == len(keys):
                block[k, at, cols] = values
            else:  # an engine's failed deduplication: the later point wins, as it always did
                for r, c, v in zip(at.tolist(), cols.tolist(), values.tolist()):
                    block[k, r, c] = v

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            queue = iter(jobs)
            inflight: dict[Future, tuple[str, str]] = {}

            def submit_next() -> None:
                job = next(queue, None)
                if job is not None:
                    inflight[pool.submit(fetch, *job)] = job[:2]

            for _ in range(self.concurrency):
                submit_next()
            while inflight:
                done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                for future in done:
                    name, agg = inflight.pop(future)
                    # (a failed query submits no other: the read then ends with the queries in
                    # flight, each within its answer's deadline, not with all those left)
                    parts = future.result()
                    submit_next()
                    for part in parts:
                        fold(name, stat_of[agg], *part)
                    del future, parts
        index: dict[bytes, int] = {}
        out: list[tuple[str, list[int], Any]] = []
        partial: dict[str, Any] = {}
        for name in names:
            mine = rows_of[name]
            block, seen = held.pop(name) if name in held else empty(0)
            block, seen = block[:, : len(mine)], seen[:, : len(mine)]
            if not seen.all():
                partial[name] = seen
            out.append((name, [index.setdefault(k, len(index)) for k in mine], block))
        keys = list(index)
        return keys, self._labels_of(keys), out, partial

    def _read_raw(
        self, names: list[str], first_end: int, last_end: int, width_ms: int, major: int
    ) -> tuple[list[bytes], list[dict[str, str]], list[tuple[str, list[int], Any]]]:
        """One raw-sample query per exporter name over the whole read, its statistics per bucket
        computed here exactly as the aggregate queries would answer them
        (:func:`auditor.sources.samples.bucket_stats`).

        Returns the read's distinct label sets (the exporter names of a GPU carry the same
        labels: one set per device) as their JSON keys and their label dicts, and per name its
        rows' label-set indices and one ``(4, series, buckets)`` block. The label sets are
        matched across names by their bytes, and only those a read sees first are decoded
        (:meth:`_labels_of`).
        """
        n = (last_end - first_end) // width_ms + 1
        first_start = first_end - width_ms

        def fetch(name: str) -> list[tuple[int, int, list[bytes], Any]]:
            return self._raw_chunk(name, first_end, last_end, width_ms, major, first_start, n)

        if self.concurrency == 1:
            answers = [fetch(name) for name in names]
        else:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                futures = [pool.submit(fetch, name) for name in names]
                try:
                    answers = [f.result() for f in futures]
                except BaseException:
                    for f in futures:  # the queries not yet started are not asked (see _read_aggregates)
                        f.cancel()
                    raise
        index: dict[bytes, int] = {}
        out: list[tuple[str, list[int], Any]] = []
        for name, parts in zip(names, answers):
            if len(parts) == 1:
                _, _, keys, block = parts[0]
            else:  # split by time: the same series in several answers, each for its buckets
                keys, block = _join_parts(parts, n, first_end, width_ms)
            out.append((name, [index.setdefault(k, len(index)) for k in keys], block))
        keys = list(index)
        return keys, self._labels_of(keys), out

    def _labels_of(self, keys: list[bytes]) -> list[dict[str, str]]:
        """The label dicts of label-set keys; those the last read saw are kept, not decoded again
        (a cycle reads the same series as the one before, bar a few)."""
        known = self._labels
        fresh = [k for k in keys if k not in known]
        if fresh:
            known = {**known, **dict(zip(fresh, labels_of(fresh)))}
        out = [known[k] for k in keys]
        self._labels = dict(zip(keys, out))
        return out

    def _identities(
        self,
        keys: list[bytes],
        labels: list[dict[str, str]],
        used: Sequence[int],
        conv: promql.LabelConvention,
        stats: ReadStats,
    ) -> tuple[list[GpuId | None], list[str], list[PodRef | None]]:
        """:meth:`_identity` of the label sets ``used`` (by index; the others get None): their
        GPUs, GPU keys and workload pods, recorded in ``stats``. Worked out once per label set
        and convention, and kept for the next read, whose label sets are mostly the same."""
        cache = self._known if self._known_conv == conv else {}
        gpus: list[GpuId | None] = [None] * len(keys)
        gpu_keys: list[str] = [""] * len(keys)
        pods: list[PodRef | None] = [None] * len(keys)
        kept: dict[bytes, tuple[GpuId | None, str, PodRef | None, str | InvalidIdentity]] = {}
        objs: tuple[dict[GpuId, GpuId], dict[PodRef, PodRef]] | None = None
        for d in used:
            key = keys[d]
            known = cache.get(key)
            if known is None:
                if objs is None:  # one object per GPU and pod, across reads too
                    objs = ({g: g for g, *_ in cache.values() if g}, {p: p for *_, p, _ in cache.values() if p})
                known = _identify(labels[d], conv, *objs)
            kept[key] = known
            gpu, gkey, pod, exporter = known
            if gpu is not None:
                gpus[d], gpu_keys[d], pods[d] = gpu, gkey, pod
                _record(stats, gpu, gkey, pod, exporter)
        self._known, self._known_conv = kept, conv
        return gpus, gpu_keys, pods

    def _raw_chunk(
        self, name: str, first_end: int, last_end: int, width_ms: int, major: int, first_start: int, n: int
    ) -> list[tuple[int, int, list[bytes], Any]]:
        """The raw samples of bucket ends ``first_end..last_end`` as ``(first_end, last_end,
        label-set keys, statistics)``; halves itself on the engines' size limits, as
        :meth:`_range_chunk`."""
        sel = promql.selector(name, self.matchers, self.regex_matchers)

        def decoded(data: Any) -> tuple[list[bytes], Any]:
            rejected: list[tuple[dict, str]] = []
            labels, block = bucket_stats(matrix_result(data), first_start, width_ms, n, rejected)
            self._reject(name, rejected)
            return self._once(sel, [label_key(lab) for lab in labels]), block

        def read(body: bytes) -> tuple[list[bytes], Any] | None:
            got = parse_matrix(body, name, times=n > 1)
            if got is None:
                return None
            keys, lens, ts, values = got
            return self._once(sel, keys), stats_of(lens, ts, values, first_start, width_ms, n)

        def query(a: int, b: int) -> list[tuple[int, int, list[bytes], Any]]:
            rng = promql.range_ms(b - a + width_ms, major)
            keys, block = self.client.query(
                f"{sel}[{rng}ms]", at_ms=b - 1, convert=decoded, raw=read, selector=sel, series_bytes=BYTES_PER_CELL * n
            )
            return [(a, b, keys, block)]

        return _halving(query, first_end, last_end, width_ms, f"the raw read of {sel}")

    def _range_chunk(
        self, name: str, agg: str, first_end: int, last_end: int, width_ms: int, rng: int, n: int
    ) -> list[tuple[list[bytes], list[int], Any, Any]]:
        """One query_range over bucket ends ``first_end..last_end``; halves itself on sample limits.

        Returns per answer (one, or one per half) what :func:`~auditor.sources.samples.parse_matrix`
        reads of it (label-set keys with ``__name__`` removed, samples per series, timestamps and
        values); a body it does not read is decoded as JSON and given the same form. ``n`` is
        the whole read's buckets (each series is held for all of them).
        """
        sel = promql.selector(name, self.matchers, self.regex_matchers)
        expr = promql.bucket_query(sel, agg, rng)

        def read(body: bytes) -> list[tuple[list[bytes], list[int], Any, Any]] | None:
            parsed = parse_matrix(body, name)
            if parsed is None:
                return None
            self._once(sel, parsed[0])
            return [parsed]

        def decoded(data: Any) -> list[tuple[list[bytes], list[int], Any, Any]]:
            rejected: list[tuple[dict, str]] = []
            labels, lens, ts, values = matrix_of(matrix_result(data), rejected=rejected)
            self._reject(name, rejected)
            return [(self._once(sel, [label_key(lab) for lab in labels]), lens, ts, values)]

        def query(a: int, b: int) -> list:
            return self.client.query_range(
                expr, a - 1, b - 1, width_ms, convert=decoded, raw=read, selector=sel, series_bytes=BYTES_PER_CELL * n
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
            result = self.client.query(f"{sel}[{rng}ms]", at_ms=last - 1, convert=matrix_result, selector=sel)
            for item in result:
                labels = dict(item.get("metric", {}))
                labels.pop("__name__", None)
                key = frozenset(labels.items())
                if key in wanted:
                    samples.setdefault(key, []).extend(
                        (promql.parse_ts_ms(t), _number(v)) for t, v in item.get("values", [])
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


def _number(value: Any) -> float:
    """A raw sample's value; one that is not a number is NaN, dropped and counted as garbage."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _rejected_warnings(rejected: list[tuple[str, dict, str]]) -> list[str]:
    """The warnings of the series a read left out: each distinct one named (the four aggregate
    answers of a name reject the same series), up to :data:`NAMED_REJECTS`, then a count."""
    seen: dict[tuple[str, str], str] = {}
    for name, labels, why in rejected:
        seen.setdefault((name, short_labels(labels)), why)
    out = [f"{name} series left out, {why}: {labels}" for (name, labels), why in list(seen.items())[:NAMED_REJECTS]]
    if len(seen) > NAMED_REJECTS:
        out.append(f"{len(seen) - NAMED_REJECTS} more series left out for samples that are not numbers")
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
    parts: list[tuple[int, int, list[bytes], Any]], n: int, first_end: int, width_ms: int
) -> tuple[list[bytes], Any]:
    """The answers of a time-split raw read as one: a row per distinct label set (in order of
    first appearance), each part's buckets copied from its own columns."""
    import numpy as np

    index: dict[bytes, int] = {}
    rows = [[index.setdefault(k, len(index)) for k in keys] for _, _, keys, _ in parts]
    block = np.full((len(STATS), len(index), n), np.nan)
    for (a, b, _, part), mine in zip(parts, rows):
        lo, hi = (a - first_end) // width_ms, (b - first_end) // width_ms + 1
        block[:, mine, lo:hi] = part[:, :, lo:hi]
    return list(index), block


def _identify(
    labels: dict[str, str], conv: promql.LabelConvention, gpu_objs: dict[GpuId, GpuId], pod_objs: dict[PodRef, PodRef]
) -> tuple[GpuId | None, str, PodRef | None, str | InvalidIdentity]:
    """The GPU, its key, the workload pod and (where the "workload" is dcgm-exporter itself)
    the exporter pod's name of a label set, as :meth:`PrometheusSource._identity` finds them."""
    gpu = promql.gpu_of(labels)
    if gpu is None:
        return None, "", None, ""
    gpu = gpu_objs.setdefault(gpu, gpu)
    try:
        pod = promql.pod_of(labels, conv)
    except InvalidIdentity as bad:  # quarantined: counted by _record, never a job
        return gpu, gpu.key, None, bad
    exporter = ""
    if pod is not None and promql.looks_like_exporter(labels, conv):
        exporter, pod = f"{pod.namespace}/{pod.pod}", None
    return gpu, gpu.key, None if pod is None else pod_objs.setdefault(pod, pod), exporter


def _record(stats: ReadStats, gpu: GpuId, key: str, pod: PodRef | None, exporter: str | InvalidIdentity) -> None:
    """A label set's GPU (key ``key``), pod and exporter pod name (or "") in a read's ``stats``;
    a refused identity in ``stats.rejected`` (said there, not as a GPU without a pod)."""
    if gpu.hostname:  # the node's exporter answered, whatever its series' pod label says
        stats.hosts.setdefault(gpu.hostname, set())
    if isinstance(exporter, InvalidIdentity):
        stats.rejected.add(exporter)
        return
    stats.gpus.add(key)
    if gpu.instance:
        stats.mig = True
    if exporter:
        stats.exporter_pods.add(exporter)
    if pod is not None:
        stats.attributed.add(key)


def _in_order(*lists: list[Piece]) -> list[Piece]:
    """The pieces of ``lists`` as one list sorted by pod and GPU key (as
    :func:`~auditor.sources.series.merge_duplicates` sorts them; the pods are shared objects,
    so each one's sort key is made once)."""
    out = [p for pieces in lists for p in pieces]
    pod_keys: dict[int, tuple[str, str, str]] = {}
    for pod, _, _ in out:
        if id(pod) not in pod_keys:
            pod_keys[id(pod)] = (pod.namespace, pod.pod, pod.container)
    out.sort(key=lambda p: (pod_keys[id(p[0])], p[1]))
    return out


def _series_of(name: str, own: list[dict[str, str]], block: Any, seen: Any = None) -> list[Series]:
    """A read's block of one name as :class:`Series` (rows as lists of floats, made in C);
    where ``seen`` (``(4, rows)`` booleans) is given, a row has only the statistics its
    answers had (an incomplete answer: the series is re-read raw)."""
    import numpy as np

    metric = BY_NAME[name]
    cnts, sums, mins, maxs = block.tolist()
    out = [
        Series(name, metric, lab, {"count": cnt, "sum": sm, "min": lo, "max": hi})
        for lab, cnt, sm, lo, hi in zip(own, cnts, sums, mins, maxs)
    ]
    if seen is not None:
        for j in np.flatnonzero(~seen.all(axis=0)).tolist():
            aggs = out[j].aggs
            for k in np.flatnonzero(~seen[:, j]).tolist():
                del aggs[STATS[k]]
    return out
