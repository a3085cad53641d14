"""Pure maths on decoded Prometheus answers: series as flat arrays per bucket, which buckets are
clean, raw samples into buckets, duplicate series, the scrape interval, the label spellings.

No I/O: :class:`~auditor.sources.prometheus.PrometheusSource` asks Prometheus and hands the
decoded answers here. Values stay flat ``array('d')`` rows (NaN: no sample) until a caller needs
bucket objects, and the clean/dirty test runs with numpy over a whole exporter name at once.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping, Sequence

from auditor.core.accumulate import interval_of
from auditor.core.metrics import BY_NAME, SPECS, Metric, Naming, scale_of
from auditor.core.model import Bucket, GpuId, PodRef
from auditor.core.readings import SourceReport
from auditor.core.rollup import BucketRun, Piece, Sample, aggregate
from auditor.sources import promql

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NANS = array("d", [math.nan]) * 4096


def from_ms(ms: int) -> datetime:
    """Prometheus's milliseconds since the epoch as an aware UTC datetime."""
    return _EPOCH + timedelta(milliseconds=ms)


def to_ms(value: datetime) -> int:
    """An aware datetime as milliseconds since the epoch (exact: no float rounding)."""
    return (value - _EPOCH) // timedelta(milliseconds=1)


@dataclass(slots=True)
class Series:
    """One series of a read: its exporter name, metric, own labels and per-aggregate rows."""

    name: str
    metric: Metric
    labels: dict[str, str]
    #: aggregate ("sum", "count", "min", "max") → raw value per bucket of the read (NaN: none),
    #: a list of floats (a block's row: ``_series_of`` in auditor/sources/prometheus.py)
    aggs: dict[str, array | list[float]] = field(default_factory=dict)


def raw_spans(ends: list[int], width_ms: int, max_buckets: int) -> list[tuple[int, int]]:
    """Cover sorted bucket ends with runs of at most ``max_buckets`` buckets (first, last end)."""
    out: list[tuple[int, int]] = []
    for e in ends:
        if out and e - out[-1][0] < max_buckets * width_ms:
            out[-1] = (out[-1][0], e)
        else:
            out.append((e, e))
    return out


def aggregate_raw(
    pod: PodRef,
    gpu: GpuId,
    metric: Metric,
    start: datetime,
    end: datetime,
    raw: list[float],
    scale: float | None = None,
) -> Bucket:
    """One bucket from raw samples through the core's rollup (garbage dropped and counted there)."""
    width = end - start
    t0 = start.timestamp()
    rolled = aggregate((Sample(pod, gpu, metric, t0, r, scale) for r in raw), width)
    if not rolled:
        return Bucket(pod, gpu, metric, start, end, 0.0, 0, 0.0, 0.0, 0)
    return rolled[0]


def classify(
    series: list[Series],
    n: int,
    first_end: int,
    width_ms: int,
    counts: dict[int, int],
    naming: Naming = Naming.CLASSIC,
    *,
    last_open: bool = False,
) -> dict[int, tuple[Sequence[int] | None, list[int] | None]]:
    """Per series (by ``id``): the positions of its clean buckets and the ends of its dirty ones.

    A bucket is dirty when its sum is NaN or infinite (a NaN sample), an aggregate is missing,
    or min/max fall outside the metric's valid range (garbage, or an overshoot that must be
    clamped): it is re-read raw. (NaN compares false, so NaN min/max are dirty too.) Done with
    numpy over all series of one exporter name at once, so the cost per bucket is a few
    machine instructions; the sample count of each clean full bucket goes into ``counts``: one
    with samples in both neighbours (outside the read, a neighbour is taken as present), except
    a last bucket the window's end cuts (``last_open``: its samples stop at the window's end).
    """
    import numpy as np  # only here: imported once per read, not at CLI start

    out: dict[int, tuple[Sequence[int] | None, list[int] | None]] = {}
    by_name: dict[str, list[Series]] = {}
    for s in series:
        by_name.setdefault(s.name, []).append(s)
    nan_row = nans(n)
    histogram: dict[int, int] = {}
    for name, rows in by_name.items():

        def stack(agg: str, rows: list[Any] = rows) -> Any:
            got = [s.aggs.get(agg) or nan_row for s in rows]
            if any(type(g) is list for g in got):  # the raw read's rows
                return np.array(got, dtype=np.float64).reshape(len(rows), n)
            return np.frombuffer(b"".join(got), dtype=np.float64).reshape(len(rows), n)

        ok, bad = classify_masks(
            stack("count"), stack("sum"), stack("min"), stack("max"), name, naming, histogram, last_open=last_open
        )
        rows_out = row_verdicts(ok, bad, range(len(rows)), first_end, width_ms)
        for s, got in zip(rows, rows_out):
            out[id(s)] = got
    for v, t in histogram.items():
        counts[v] = counts.get(v, 0) + t
    return out


def classify_masks(
    cnt: Any,
    tot: Any,
    mins: Any,
    maxs: Any,
    name: str,
    naming: Naming,
    histogram: dict[int, int],
    *,
    last_open: bool = False,
) -> tuple[Any, Any]:
    """The clean and the dirty buckets of one exporter name's rows (2-D arrays, series x
    buckets) as two boolean arrays of that shape; full buckets' sample counts are added to
    ``histogram``."""
    import numpy as np

    spec = SPECS[BY_NAME[name]]
    scale = scale_of(name, naming)
    present = cnt == cnt
    with np.errstate(invalid="ignore"):
        ok = present & np.isfinite(tot)
        ok &= mins * scale >= spec.low
        ok &= maxs * scale <= spec.high
    bad = present & ~ok
    # only full buckets tell the scrape interval: a series that starts, ends or pauses inside
    # a bucket has fewer samples there, and so has the bucket the window's end cuts
    left = np.ones_like(present)
    left[:, 1:] = present[:, :-1]
    right = np.full_like(present, not last_open)
    right[:, :-1] = present[:, 1:]
    full_ok = ok & left & right
    values, times = np.unique(cnt[full_ok].astype(np.int64), return_counts=True)
    for v, t in zip(values.tolist(), times.tolist()):
        histogram[v] = histogram.get(v, 0) + t
    return ok, bad


def row_verdicts(
    ok: Any, bad: Any, rows: Iterable[int], first_end: int, width_ms: int
) -> list[tuple[Sequence[int] | None, list[int] | None]]:
    """Per row of :func:`classify_masks`' arrays (those ``rows``): its clean bucket positions
    (a range where they are consecutive) and its dirty buckets' ends (None for none)."""
    import numpy as np

    n = ok.shape[1]
    whole = range(n)
    full, any_ok, any_bad = ok.all(axis=1).tolist(), ok.any(axis=1).tolist(), bad.any(axis=1).tolist()
    out: list[tuple[Sequence[int] | None, list[int] | None]] = []
    for j in rows:
        idx: Sequence[int] | None = None
        if full[j]:
            idx = whole
        elif any_ok[j]:
            clean = np.flatnonzero(ok[j]).tolist()
            idx = range(clean[0], clean[-1] + 1) if clean[-1] - clean[0] + 1 == len(clean) else clean
        ends = [first_end + i * width_ms for i in np.flatnonzero(bad[j]).tolist()] if any_bad[j] else None
        out.append((idx, ends))
    return out


def nans(n: int) -> array:
    return array("d", _NANS[:n] if n <= len(_NANS) else [math.nan] * n)


def merge_duplicates(
    groups: Iterable[tuple[PodRef, str, Metric, list[BucketRun | list[Bucket]]]], report: SourceReport
) -> list[Piece]:
    """All buckets, sorted by (pod, GPU, metric, start), one per (pod, GPU, metric, start), as
    pieces of a :class:`~auditor.core.rollup.LazyBuckets` (one per (pod, GPU, metric)).

    ``groups`` holds each (pod, GPU key, metric) once, with its parts: runs of clean buckets and
    lists of re-read ones. Where two series give the same pod, GPU, metric and bucket (HA
    Prometheus pairs, two scrape jobs on one exporter, a classic → ``_RATIO`` rename mid-bucket)
    the fuller bucket is kept: adding them would double-count samples.
    """
    out: list[Piece] = []
    duplicates = False
    # the pods are shared objects: their sort key is built once per pod (by identity, which
    # also spares the dataclass's Python-level hash per group)
    pod_keys: dict[int, tuple[str, str, str]] = {}
    rows = list(groups)
    for pod, _, _, _ in rows:
        if id(pod) not in pod_keys:
            pod_keys[id(pod)] = (pod.namespace, pod.pod, pod.container)
    # (an Enum member's hash and value are Python-level code: by identity instead)
    values = {id(m): m.value for m in Metric}
    rows.sort(key=lambda g: (pod_keys[id(g[0])], g[1], values[id(g[2])]))
    for pod, gpu_key, _, parts in rows:
        if len(parts) == 1:
            out.append((pod, gpu_key, parts[0]))
            continue
        best: dict[datetime, Bucket] = {}
        for part in parts:
            for b in part.buckets() if isinstance(part, BucketRun) else part:
                old = best.get(b.start)
                if old is None:
                    best[b.start] = b
                    continue
                duplicates = True
                if (b.count, b.dropped) > (old.count, old.dropped):
                    best[b.start] = b
        out.append((pod, gpu_key, [best[t] for t in sorted(best)]))
    if duplicates:
        report.warnings.append(
            "duplicate series for the same pod, GPU and metric (HA replicas or two scrape jobs?): kept the fuller one"
        )
    return out


def interval_estimate(counts: Mapping[int, int], width_ms: int) -> float | None:
    """Scrape-interval estimate (:func:`~auditor.core.accumulate.interval_of`) from ``counts``:
    samples per full bucket → the number of buckets with that many (a histogram, so that
    millions of buckets need no sorted list). None when the window held no full bucket."""
    return interval_of((width_ms / 1000 / c, k) for c, k in counts.items() if c > 0)


def device_labels(label_sets: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Which spelling of the host and UUID labels the series use."""
    out: dict[str, str] = {}
    for labels in label_sets:
        for key, names in (("hostname", ("Hostname", "hostname")), ("uuid", ("UUID", "uuid"))):
            if key not in out:
                name, _ = promql.first_label(labels, *names)
                if name:
                    out[key] = name
        if "mig" not in out and labels.get("GPU_I_ID"):
            out["mig"] = "GPU_I_ID"
        if len(out) == 3:
            break
    return out


def short_labels(labels: Mapping[str, str]) -> str:
    keys = ("Hostname", "hostname", "instance", "gpu", "pod", "exported_pod")
    return ",".join(f"{k}={labels[k]}" for k in keys if k in labels) or "(no identifying labels)"
