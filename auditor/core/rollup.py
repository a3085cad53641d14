"""Raw samples → rollup buckets: the one aggregation every sample-level path shares.

The Prometheus source aggregates server-side (``sum/count/min/max_over_time``) but falls back to
raw samples when a bucket holds garbage; the trace replay source produces raw samples only. Both
end here, so the bucketing rules exist once:

- buckets are half-open ``[start, end)`` on ``width``-aligned boundaries since the epoch (the
  same alignment as :meth:`auditor.core.model.Window.aligned`), so a sample on a boundary
  belongs to the bucket it starts;
- every raw value goes through :func:`auditor.core.metrics.normalize`; garbage (NaN, ±Inf,
  out of range) is dropped and *counted* in the bucket's ``dropped``, never averaged;
- with a ``window``, samples outside ``[window.start, window.end)`` are ignored (not counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable, Iterator, Protocol, Sequence

from auditor.core.metrics import Metric, normalize
from auditor.core.model import Bucket, GpuId, PodRef, Window


@dataclass(frozen=True, slots=True)
class Sample:
    """One exported value as a scrape stored it: ``raw`` is in the exporter's unit.

    ``t`` is Unix seconds (float). GPU_UTIL stays a percent here; :func:`aggregate` scales it,
    by ``scale`` when given (the exporter name's, :func:`auditor.core.metrics.scale_of`), else by
    the classic name's.
    """

    pod: PodRef
    gpu: GpuId
    metric: Metric
    t: float
    raw: float
    scale: float | None = None


def _bucket_start(t: float, step: float) -> float:
    return t // step * step


def aggregate(samples: Iterable[Sample], width: timedelta, window: Window | None = None) -> list[Bucket]:
    """Roll raw samples up into ``width``-aligned buckets per (pod, GPU, metric).

    Returns buckets sorted by (pod, GPU key, metric, start). A bucket whose samples were all
    garbage is still returned, with ``count == 0`` and its ``dropped`` count, so coverage and
    ``doctor`` can see the garbage.
    """
    step = width.total_seconds()
    if step <= 0:
        raise ValueError("bucket width must be positive")
    lo = window.start.timestamp() if window else float("-inf")
    hi = window.end.timestamp() if window else float("inf")
    # key → [total, count, min, max, dropped]
    acc: dict[tuple[PodRef, GpuId, Metric, float], list[float]] = {}
    for s in samples:
        if not (lo <= s.t < hi):
            continue
        key = (s.pod, s.gpu, s.metric, _bucket_start(s.t, step))
        cell = acc.get(key)
        if cell is None:
            cell = acc[key] = [0.0, 0, float("inf"), float("-inf"), 0]
        value = normalize(s.metric, s.raw, s.scale)
        if value is None:
            cell[4] += 1
            continue
        cell[0] += value
        cell[1] += 1
        if value < cell[2]:
            cell[2] = value
        if value > cell[3]:
            cell[3] = value
    out = []
    for (pod, gpu, metric, start), (total, count, mn, mx, dropped) in acc.items():
        t0 = datetime.fromtimestamp(start, timezone.utc)
        out.append(
            Bucket(
                pod=pod,
                gpu=gpu,
                metric=metric,
                start=t0,
                end=t0 + width,
                total=total,
                count=int(count),
                minimum=mn if count else 0.0,
                maximum=mx if count else 0.0,
                dropped=int(dropped),
            )
        )
    out.sort(key=lambda b: (b.pod, b.gpu.key, b.metric.value, b.start))
    return out


class BucketRun:
    """The clean buckets of one series, kept as the series' aggregate arrays until needed.

    A 2 h audit of a thousand 8-GPU jobs has 1.7 million buckets; as objects they take over
    300 MB, as the arrays the source read them into a fraction of that. ``idx`` lists the
    bucket positions that are clean; ``spans[i]`` is bucket ``i``'s (start, end). Values are
    in the exporter's unit and scaled by ``scale`` when the buckets are made.
    """

    __slots__ = ("pod", "gpu", "metric", "scale", "spans", "sums", "counts", "mins", "maxs", "idx")

    def __init__(
        self,
        pod: PodRef,
        gpu: GpuId,
        metric: Metric,
        scale: float,
        spans: Sequence[tuple[datetime, datetime]],
        sums: Sequence[float],
        counts: Sequence[float],
        mins: Sequence[float],
        maxs: Sequence[float],
        idx: Sequence[int],
    ) -> None:
        self.pod, self.gpu, self.metric, self.scale, self.spans = pod, gpu, metric, scale, spans
        self.sums, self.counts, self.mins, self.maxs, self.idx = sums, counts, mins, maxs, idx

    def __len__(self) -> int:
        return len(self.idx)

    def buckets(self) -> list[Bucket]:
        out: list[Bucket] = []
        s = self.scale
        sums, mins, maxs = (
            (self.sums, self.mins, self.maxs)
            if s == 1.0
            else ([v * s for v in a] for a in (self.sums, self.mins, self.maxs))
        )
        add_runs(out, self.pod, self.gpu, self.spans, [(self.metric, sums, self.counts, mins, maxs, self.idx, 0)])
        return out


#: one series' clean buckets for :func:`add_runs`: its metric; its sums, counts, minima and
#: maxima in the metric's unit (bucket ``i``'s at ``base + i``); its clean positions; ``base``
RunRows = tuple[Metric, Sequence[float], Sequence[float], Sequence[float], Sequence[float], Iterable[int], int]


def add_runs(
    out: list[Bucket], pod: PodRef, gpu: GpuId, spans: Sequence[tuple[datetime, datetime]], runs: Iterable[RunRows]
) -> None:
    """Append the clean buckets of one device's series ``runs`` to ``out``, run by run."""
    new = tuple.__new__
    append = out.append
    for metric, sums, counts, mins, maxs, idx, base in runs:
        for i in idx:
            k = base + i
            lo, hi = mins[k], maxs[k]
            if hi == lo and lo != 0.0:  # one float object for both (a steady reading): less memory
                hi = lo
            start, end = spans[i]
            append(new(Bucket, (pod, gpu, metric, start, end, sums[k], int(counts[k]), lo, hi, 0)))


class Run(Protocol):
    """Buckets kept compact until a caller needs them as objects (in their order)."""

    def __len__(self) -> int: ...

    def buckets(self) -> list[Bucket]: ...


class DeviceParts:
    """One device's buckets (of one pod) as its parts in order: runs of clean buckets and
    lists of others, metric by metric."""

    __slots__ = ("parts",)

    def __init__(self, parts: list["Run | list[Bucket]"]) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def buckets(self) -> list[Bucket]:
        out: list[Bucket] = []
        for part in self.parts:
            out.extend(part if type(part) is list else part.buckets())  # type: ignore[union-attr]
        return out


#: a piece of a lazy read: the pod, the GPU key, and that device's buckets (one piece per device)
Piece = tuple[PodRef, str, "Run | list[Bucket]"]


def per_device(pieces: Iterable[tuple[PodRef, str, "Run | list[Bucket]"]]) -> list[Piece]:
    """Consecutive pieces of one (pod, GPU) as one piece of that device (a read's pieces are
    sorted by pod, GPU and metric, so each device's are consecutive)."""
    out: list[Piece] = []
    parts: list[Run | list[Bucket]] = []
    for pod, key, part in pieces:
        if parts and out[-1][1] == key and out[-1][0] is pod:
            parts.append(part)
            continue
        parts = [part]
        out.append((pod, key, DeviceParts(parts)))
    return out


class LazyBuckets:
    """A read's buckets in their order, made into :class:`Bucket` objects only on demand.

    Iterating yields every bucket (as the list a source's ``read`` returns would hold);
    :meth:`by_pod` lets a caller keep one job's buckets at a time as objects. ``pieces``
    holds one entry per (pod, GPU): sorted by pod, then GPU key, each with its buckets in
    (metric, start) order.
    """

    __slots__ = ("pieces",)

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces

    def __len__(self) -> int:
        return sum(len(p) for _, _, p in self.pieces)

    def __iter__(self) -> Iterator[Bucket]:
        for _, _, piece in self.pieces:
            yield from (piece if type(piece) is list else piece.buckets())  # type: ignore[union-attr]

    def by_pod(self) -> list[tuple[PodRef, list[Piece]]]:
        """Consecutive pieces of the same pod, in order."""
        out: list[tuple[PodRef, list[Piece]]] = []
        for piece in self.pieces:
            pod = piece[0]
            if out and (out[-1][0] is pod or out[-1][0] == pod):
                out[-1][1].append(piece)
            else:
                out.append((pod, [piece]))
        return out

    @staticmethod
    def materialize(pieces: Iterable[Piece]) -> list[Bucket]:
        out: list[Bucket] = []
        for _, _, piece in pieces:
            out.extend(piece if type(piece) is list else piece.buckets())  # type: ignore[union-attr]
        return out
