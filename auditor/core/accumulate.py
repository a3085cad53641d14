"""Mergeable per-GPU statistics: the state a job's summary is computed from. Pure.

A summary needs, per (pod, GPU) row, pooled statistics of each metric (sum, count, min, max,
dropped, the bucket means for percentiles) and the row's presence (first and last bucket with
samples, the time in between, the GPU time after sharing). All of that folds bucket by bucket
in time order, so the same :class:`JobAggregate` serves two uses:

* a one-shot audit folds every bucket of its window into a fresh aggregate and summarizes it;
* the operator keeps a job's aggregate in the store and folds only the buckets no later cycle
  can rewrite (``freeze``), then summarizes a *copy* with the still-open buckets folded in. A
  cycle then costs what its new buckets cost, whatever the age of the job.

The folded result equals the one-shot result with two bounded exceptions, both documented in
docs/store.md: percentiles come from at most :data:`POINT_LIMIT` centroids of bucket means
(exact until a row has more buckets than that; nearest centroids are merged after, a streaming
histogram after Ben-Haim & Tom-Tov), and the peak GPU count of the frozen part is kept as one
number, so a scrape gap that a later bucket turns into presence is not added to past peaks.
The scrape interval comes from the job's own full buckets (:meth:`JobAggregate.sample_interval`),
the same in both uses; only a job without any (shorter than three buckets) depends on what a
source told, which the operator keeps from the first cycle that saw the job.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import accumulate, groupby
from operator import itemgetter
from typing import Any, Iterable, Mapping, Sequence

from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, PodRef, Window

#: centroids of bucket means kept per metric and row once frozen (5-min buckets: 5 h 20 min exact)
POINT_LIMIT = 64
#: version of :meth:`JobAggregate.to_json`; another version is rebuilt from the buckets
#: (2: rows keep the sample counts of their full buckets, for :meth:`JobAggregate.sample_interval`;
#: 3: the busy signal's stats keep their idle-phase samples, :attr:`Stat.low`)
STATE_VERSION = 3

#: the busy signals, whose buckets are read for idle phases (:attr:`Stat.low`)
PHASED = frozenset({Metric.GPU_UTIL, Metric.GR_ENGINE_ACTIVE})
#: a bucket whose samples span at least this much of the 0–1 scale swings between an idle and a
#: busy level inside it (a stall of tens of seconds in a bucket of minutes); steady jobs recorded on
#: the H200 span at most 0.26 (a data-loader stall at 20 % busy: 0.00–0.26)
SWING = 0.5
#: a bucket whose every sample is below this is an idle phase as a whole (the verdicts' idle line)
IDLE_LEVEL = 0.05

ShareMap = Mapping[tuple[str, datetime], int]

# Bucket's fields by position (it is a named tuple, and the fold unpacks it by position too):
# an index is cheaper than the field's descriptor, once per bucket of every cycle
_METRIC = itemgetter(2)  # Bucket.metric
_WEIGHT = itemgetter(1)
_METRIC_START = itemgetter(2, 3)  # Bucket.metric, Bucket.start
_POD_GPU = itemgetter(0, 1)  # Bucket.pod, Bucket.gpu


#: the start before a run's first bucket (never a bucket's: nothing is added under it)
_NO_START = datetime.min.replace(tzinfo=timezone.utc)


def idle_phase_samples(buckets: Iterable[Bucket]) -> float:
    """The samples of ``buckets`` (one busy signal, ratios) estimated to lie in idle phases
    (:attr:`Stat.low` says how)."""
    low = 0.0
    for b in buckets:
        n, lo, hi = b[6], b[7], b[8]  # Bucket.count, .minimum, .maximum
        if n <= 0:
            continue
        if hi < IDLE_LEVEL:
            low += n
        elif hi - lo >= SWING:
            low += n * (hi - b[5] / n) / (hi - lo)  # Bucket.total
    return low


class StaleFold(ValueError):
    """Buckets at or before what an aggregate already holds: it must be rebuilt from the store."""


# --------------------------------------------------------------------------- statistics


class Stat:
    """Pooled statistics of one metric over a set of buckets.

    The points for the percentiles (bucket mean, weight) are two flat arrays of doubles rather
    than a list of pairs: the operator keeps every running job's stats between cycles (99 per
    10-GPU job, up to :data:`POINT_LIMIT` points each), and as tuples of Python floats they took
    ~5x the memory and most of the allocator's small-object arenas (issue 18: 105 MiB at 10,000
    GPUs one hour in). Weights are sample counts: whole numbers (a merged centroid's is the sum
    of its points').
    """

    __slots__ = ("total", "count", "dropped", "minimum", "maximum", "values", "weights", "low")

    def __init__(
        self,
        total: float = 0.0,
        count: int = 0,
        dropped: int = 0,
        minimum: float = float("inf"),
        maximum: float = float("-inf"),
        points: Iterable[tuple[float, int]] = (),
        low: float = 0.0,
    ) -> None:
        self.total = total
        self.count = count
        self.dropped = dropped
        self.minimum = minimum
        self.maximum = maximum
        #: bucket means and their weights (sample counts), in the order they were added;
        #: centroids after :meth:`compress`
        self.values = array("d")
        self.weights = array("q")
        for v, w in points:
            self.values.append(v)
            self.weights.append(w)
        #: the samples (an estimate) in idle phases, for the busy signals (:data:`PHASED`) only:
        #: every sample of a bucket below :data:`IDLE_LEVEL`, and in a bucket that swings
        #: (range ≥ :data:`SWING`) the share ``(max − mean) / (max − min)`` of its samples — the
        #: time at the low level of a two-level (square) wave with that mean, minimum and maximum.
        #: Why: a job that stops every 30 s for 10 s reads a steady 0.67 in every bucket mean; only
        #: the buckets' extremes show the square wave (issue 28).
        self.low = low

    @property
    def points(self) -> list[tuple[float, int]]:
        """The (bucket mean, weight) pairs, in the order they were added."""
        return list(zip(self.values, self.weights))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stat):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in Stat.__slots__)

    def __repr__(self) -> str:
        return (
            f"Stat(total={self.total!r}, count={self.count!r}, dropped={self.dropped!r}, "
            f"minimum={self.minimum!r}, maximum={self.maximum!r}, points={self.points!r}, low={self.low!r})"
        )

    def merge(self, other: "Stat") -> None:
        self.total += other.total
        self.count += other.count
        self.dropped += other.dropped
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)
        self.values += other.values
        self.weights += other.weights
        self.low += other.low

    def copy(self) -> "Stat":
        c = Stat(self.total, self.count, self.dropped, self.minimum, self.maximum, low=self.low)
        c.values = self.values[:]
        c.weights = self.weights[:]
        return c

    def compress(self, limit: int = POINT_LIMIT) -> None:
        """Keep at most ``limit`` points (see :func:`merge_nearest`)."""
        if len(self.values) > limit:
            values, weights = _merged(sorted(zip(self.values, self.weights)), limit)
            self.values = array("d", values)
            self.weights = array("q", weights)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    @property
    def exactly_zero(self) -> bool:
        """Every valid sample read exactly 0 (the silent-zero signature)."""
        return self.count > 0 and self.maximum == 0.0 and self.minimum == 0.0

    def percentiles(self, *ps: float) -> list[float | None]:
        """Count-weighted percentiles of the bucket means (the lower value at ties), for several
        ``p`` at once, sorting the points only once (:func:`percentiles_of`)."""
        return percentiles_of(sorted(self.points), ps)

    def to_json(self) -> list[Any]:
        flat: list[float | int] = [0] * (2 * len(self.values))
        flat[0::2] = self.values.tolist()
        flat[1::2] = self.weights.tolist()
        has = self.count > 0
        return [
            self.total,
            self.count,
            self.dropped,
            self.minimum if has else None,
            self.maximum if has else None,
            flat,
            self.low,
        ]

    @classmethod
    def from_json(cls, doc: Sequence[Any]) -> "Stat":
        total, count, dropped, lo, hi, flat, low = doc
        st = cls(
            float(total),
            int(count),
            int(dropped),
            float("inf") if lo is None else float(lo),
            float("-inf") if hi is None else float(hi),
            low=float(low),
        )
        st.values = array("d", flat[0::2])  # JSON numbers: floats and ints
        st.weights = array("q", flat[1::2])
        if len(st.values) != len(st.weights):
            raise ValueError(f"stat points: {len(flat)} numbers, not (mean, weight) pairs")
        return st


def percentiles_of(pts: Sequence[tuple[float, int]], ps: Sequence[float]) -> list[float | None]:
    """Count-weighted percentiles of ordered (value, weight) points: for each ``p`` the first
    value whose cumulative weight reaches ``p`` of the total (None without points)."""
    if not pts:
        return [None] * len(ps)
    cumulative = list(accumulate(map(_WEIGHT, pts)))
    total = cumulative[-1]
    last = len(pts) - 1
    out: list[float | None] = []
    for p in ps:
        # the first point whose cumulative weight reaches p of the total
        i = bisect_left(cumulative, p * total - 1e-9)
        out.append(pts[i if i <= last else last][0])
    return out


def merge_nearest(points: Sequence[tuple[float, int]], limit: int) -> list[tuple[float, int]]:
    """At most ``limit`` weighted points: the two adjacent points closest in value are merged
    into their weighted mean until few enough are left.

    Equal values merge first (at no cost to any percentile); with spread-out values the error of
    a percentile is at most the widest merged gap. Deterministic: ties go to the lower value.
    """
    return list(zip(*_merged(sorted(points), limit)))


def _merged(pts: Sequence[tuple[float, int]], limit: int) -> tuple[list[float], list[int]]:
    """:func:`merge_nearest` of points already sorted, as their values and weights."""
    if not pts:
        return [], []
    vals, wts = (list(c) for c in zip(*pts))
    if len(set(vals)) != len(vals):  # equal values (0.0 and -0.0 too): their weights summed first
        vals, wts = [], []
        for v, w in pts:
            if vals and vals[-1] == v:
                wts[-1] += w
            else:
                vals.append(v)
                wts.append(w)
    if len(vals) <= limit:
        return vals, wts
    if len(vals) - limit <= _SCAN_MERGES:
        return _merge_scan(vals, wts, limit)
    return _merge_heap(vals, wts, limit)


#: up to this many merges, a scan for the closest pair beats a heap (a cycle adds 1-2 points)
_SCAN_MERGES = 8


def _merge_scan(vals: list[float], wts: list[int], limit: int) -> tuple[list[float], list[int]]:
    """:func:`merge_nearest` by scanning for the closest pair once per merge (the same choice as
    :func:`_merge_heap`: the smallest gap, the lowest value at ties)."""
    while len(vals) > limit:
        best, i = vals[1] - vals[0], 0
        for k in range(1, len(vals) - 1):
            gap = vals[k + 1] - vals[k]
            if gap < best:
                best, i = gap, k
        w = wts[i] + wts[i + 1]
        vals[i] = (vals[i] * wts[i] + vals[i + 1] * wts[i + 1]) / w
        wts[i] = w
        del vals[i + 1], wts[i + 1]
    return vals, wts


def _merge_heap(vals: list[float], wts: list[int], limit: int) -> tuple[list[float], list[int]]:
    """:func:`merge_nearest` with a heap of gaps: many merges at once (a first fold of a long
    history, a catch-up)."""
    n = len(vals)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = [(vals[i + 1] - vals[i], i, i + 1) for i in range(n - 1)]
    heapq.heapify(heap)
    left = n
    while left > limit:
        gap, i, j = heapq.heappop(heap)
        if not (alive[i] and alive[j] and nxt[i] == j and vals[j] - vals[i] == gap):
            continue  # an entry from before one of the two was merged
        w = wts[i] + wts[j]
        vals[i] = (vals[i] * wts[i] + vals[j] * wts[j]) / w
        wts[i] = w
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[j] < n:
            prv[nxt[j]] = i
            heapq.heappush(heap, (vals[nxt[j]] - vals[i], i, nxt[j]))
        if prv[i] >= 0:
            heapq.heappush(heap, (vals[i] - vals[prv[i]], prv[i], i))
        left -= 1
    keep = [i for i in range(n) if alive[i]]
    return [vals[i] for i in keep], [wts[i] for i in keep]


# --------------------------------------------------------------------------- per-row view


@dataclass(slots=True)
class RowView:
    """Everything computed for one (pod, GPU) pair."""

    pod: PodRef
    gpu: GpuId
    stats: dict[Metric, Stat]
    start: datetime
    end: datetime
    span_s: float
    gpu_seconds: float  # presence × fraction / sharing
    shared_seconds: float  # presence in buckets shared with other pods
    max_share: int
    coverage: float | None
    busy_metric: Metric | None
    #: per bucket start: GPU equivalents this row held there (not-yet-frozen buckets only)
    presence: dict[datetime, float]

    def mean(self, m: Metric) -> float | None:
        s = self.stats.get(m)
        return s.mean if s else None

    @property
    def busy(self) -> float | None:
        return self.mean(self.busy_metric) if self.busy_metric else None

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def waste_gpu_hours(self) -> float | None:
        sm = self.mean(Metric.SM_ACTIVE)
        return None if sm is None else self.gpu_hours * (1.0 - sm)


def busy_metric_of(stats: Mapping[Metric, Stat], gpu: GpuId) -> Metric | None:
    """GPU_UTIL where it exists (never on MIG), else GR_ENGINE_ACTIVE."""
    if not gpu.instance and Metric.GPU_UTIL in stats and stats[Metric.GPU_UTIL].count:
        return Metric.GPU_UTIL
    if Metric.GR_ENGINE_ACTIVE in stats and stats[Metric.GR_ENGINE_ACTIVE].count:
        return Metric.GR_ENGINE_ACTIVE
    return None


# --------------------------------------------------------------------------- one row


@dataclass(slots=True)
class RowAggregate:
    """The folded state of one (pod, GPU) row.

    Presence follows the summary's definition (docs/verdicts.md): every bucket from the first to
    the last with samples counts in full (scrape gaps included) except the first and the last,
    which count for ``samples × interval``. Until a later bucket arrives the last one may still
    be the row's end, so it is kept apart (``last_*``) and only the interior is summed.
    """

    pod: PodRef
    gpu: GpuId
    stats: dict[Metric, Stat] = field(default_factory=dict)
    #: earliest bucket start seen at all (the row's time when no bucket has samples)
    first_any: datetime | None = None
    width: float = 0.0
    first: datetime | None = None
    first_end: datetime | None = None
    first_scraped: int = 0
    first_share: int = 1
    last: datetime | None = None
    last_scraped: int = 0
    last_share: int = 1
    inner_s: float = 0.0
    inner_gpu_s: float = 0.0
    inner_shared_s: float = 0.0
    max_share: int = 1
    #: the last bucket follows a bucket with samples (so it is full once a next one follows it)
    last_follows: bool = False
    #: samples per *full* bucket (samples in it and in both neighbours) → how many such buckets
    full: dict[int, int] = field(default_factory=dict)
    #: the most samples in any one bucket (``width / most`` bounds the interval from above)
    most: int = 0
    #: bucket start → GPU equivalents held, for buckets folded since the last freeze
    held: dict[datetime, float] = field(default_factory=dict)

    def fold(self, buckets: Sequence[Bucket], shares: ShareMap) -> None:
        """Add this row's buckets, sorted by (metric, start), all later than what it holds."""
        if not buckets:
            return
        stats = self.stats
        scraped: dict[datetime, int] = {}  # bucket start → samples seen (max over metrics)
        ends: dict[datetime, datetime] = {}
        # One pass per metric run with the Stat fields in locals: this loop sees every bucket of
        # an audit. Buckets without valid samples add only their dropped count. A run is in start
        # order, so a metric's samples at one start (summed, should it hold two buckets there)
        # are complete when the start changes.
        for metric, run in groupby(buckets, key=_METRIC):
            st = stats.get(metric)
            if st is None:
                st = stats[metric] = Stat()
            if metric in PHASED:
                run = list(run)  # type: ignore[assignment]  # read twice: the idle phases, then the sums
                st.low += idle_phase_samples(run)
            total, count, dropped, lo, hi = st.total, st.count, st.dropped, st.minimum, st.maximum
            add_value, add_weight = st.values.append, st.weights.append
            prev, seen = _NO_START, 0
            for _, _, _, start, end, t, n, mn, mx, d in run:  # Bucket's fields, in order
                ends[start] = end
                if start == prev:
                    seen += n + d
                else:
                    if seen > scraped.get(prev, 0):
                        scraped[prev] = seen
                    prev, seen = start, n + d
                dropped += d
                if n <= 0:
                    continue
                total += t
                count += n
                if mn < lo:
                    lo = mn
                if mx > hi:
                    hi = mx
                add_value(t / n)
                add_weight(n)
            if seen > scraped.get(prev, 0):
                scraped[prev] = seen
            st.total, st.count, st.dropped, st.minimum, st.maximum = total, count, dropped, lo, hi
        earliest = min(ends)
        if self.first_any is None or earliest < self.first_any:
            self.first_any = earliest
        key = self.gpu.key
        for s in sorted(scraped):  # only starts with samples are in it
            self._present(s, ends[s], scraped[s], max(1, shares.get((key, s), 1)), key, shares)

    def _present(self, s: datetime, end: datetime, scraped: int, share: int, key: str, shares: ShareMap) -> None:
        frac = self.gpu.fraction
        if scraped > self.most:
            self.most = scraped
        if share > self.max_share:
            self.max_share = share
        if self.first is None:
            self.width = (end - s).total_seconds()
            self.first, self.first_end, self.first_scraped, self.first_share = s, end, scraped, share
        else:
            last = self.last
            assert last is not None
            if s <= last:
                raise StaleFold(f"bucket {s.isoformat()} is not after the folded {last.isoformat()}")
            if last != self.first:
                self._inner(self.last_share)  # the previous last bucket is interior now
            step = timedelta(seconds=self.width)
            g = last + step
            follows = s == g
            if follows and self.last_follows:
                # samples on both sides: the job ran through the whole bucket, so its count
                # is the scrape rate's (a first or last bucket, or one by a gap, may be partial)
                self.full[self.last_scraped] = self.full.get(self.last_scraped, 0) + 1
            self.last_follows = follows
            while g < s:  # a scrape gap inside the span: held without telemetry
                n = max(1, shares.get((key, g), 1))
                self.max_share = max(self.max_share, n)
                self._inner(n)
                self.held[g] = frac / n
                g += step
        self.last, self.last_scraped, self.last_share = s, scraped, share
        self.held[s] = frac / share

    def _inner(self, share: int) -> None:
        w = self.width
        self.inner_s += w
        self.inner_gpu_s += w * self.gpu.fraction / share
        if share > 1:
            self.inner_shared_s += w

    def copy(self) -> "RowAggregate":
        return RowAggregate(
            self.pod,
            self.gpu,
            {m: s.copy() for m, s in self.stats.items()},
            self.first_any,
            self.width,
            self.first,
            self.first_end,
            self.first_scraped,
            self.first_share,
            self.last,
            self.last_scraped,
            self.last_share,
            self.inner_s,
            self.inner_gpu_s,
            self.inner_shared_s,
            self.max_share,
            self.last_follows,
            dict(self.full),
            self.most,
            dict(self.held),
        )

    def view(self, window: Window, interval: float) -> RowView:
        """The row as the summary sees it, its first and last bucket counted as partial."""
        w0, w1 = window.start, window.end
        span_s = self.inner_s
        gpu_s = self.inner_gpu_s
        shared_s = self.inner_shared_s
        frac = self.gpu.fraction

        def partial(s: datetime, scraped: int) -> float:
            full = max(0.0, (min(s + timedelta(seconds=self.width), w1) - max(s, w0)).total_seconds())
            return min(full, scraped * interval)

        if self.first is None or self.last is None or self.first_end is None:
            t = max(w0, self.first_any) if self.first_any is not None else w0
            row_start = row_end = t
        else:
            p_first = partial(self.first, self.first_scraped)
            span_s += p_first
            gpu_s += p_first * frac / self.first_share
            shared_s += p_first if self.first_share > 1 else 0.0
            if self.last == self.first:
                row_start = max(self.first, w0)
                row_end = row_start + timedelta(seconds=p_first)
            else:
                p_last = partial(self.last, self.last_scraped)
                span_s += p_last
                gpu_s += p_last * frac / self.last_share
                shared_s += p_last if self.last_share > 1 else 0.0
                row_start = min(self.first_end, w1) - timedelta(seconds=p_first)
                row_end = max(self.last, w0) + timedelta(seconds=p_last)
        busy = busy_metric_of(self.stats, self.gpu)
        expected = span_s / interval if interval > 0 else 0.0
        coverage: float | None = None
        if expected > 0 and busy is not None:
            counts = [self.stats[busy].count]
            if Metric.SM_ACTIVE in self.stats:
                counts.append(self.stats[Metric.SM_ACTIVE].count)
            coverage = min(1.0, min(counts) / expected)
        elif expected > 0:
            coverage = 0.0
        return RowView(
            pod=self.pod,
            gpu=self.gpu,
            stats=self.stats,
            start=row_start,
            end=row_end,
            span_s=span_s,
            gpu_seconds=gpu_s,
            shared_seconds=shared_s,
            max_share=self.max_share,
            coverage=coverage,
            busy_metric=busy,
            presence=self.held,
        )

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "pod": [self.pod.namespace, self.pod.pod, self.pod.container],
            "gpu": [
                self.gpu.uuid,
                self.gpu.instance,
                self.gpu.hostname,
                self.gpu.index,
                self.gpu.model,
                self.gpu.mig_profile,
            ],
            "stats": {m.value: s.to_json() for m, s in self.stats.items()},
        }
        for name in _ROW_SCALARS:
            v = getattr(self, name)
            doc[name] = _ts(v) if isinstance(v, datetime) else v
        doc["full"] = sorted(self.full.items())
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "RowAggregate":
        r = cls(PodRef(*doc["pod"]), GpuId(*doc["gpu"]))
        r.stats = {Metric(k): Stat.from_json(v) for k, v in doc["stats"].items()}
        for name in _ROW_SCALARS:
            v = doc[name]
            setattr(r, name, _dt(v) if name in _ROW_TIMES else v)
        r.full = {int(c): int(k) for c, k in doc["full"]}
        return r


_ROW_TIMES = ("first_any", "first", "first_end", "last")
_ROW_SCALARS = (
    "first_any",
    "width",
    "first",
    "first_end",
    "first_scraped",
    "first_share",
    "last",
    "last_scraped",
    "last_share",
    "inner_s",
    "inner_gpu_s",
    "inner_shared_s",
    "max_share",
    "last_follows",
    "most",
)


def _ts(t: datetime) -> float:
    return t.timestamp()


def _dt(v: float | None) -> datetime | None:
    return None if v is None else datetime.fromtimestamp(v, timezone.utc)


# --------------------------------------------------------------------------- one job


def peak_held(helds: Iterable[Mapping[datetime, float]]) -> float | None:
    """GPU equivalents held at the busiest bucket start, over rows' ``held`` maps (None: none)."""
    per: dict[datetime, float] = defaultdict(float)
    for held in helds:
        for s, h in held.items():
            per[s] += h
    return max(per.values()) if per else None


def interval_of(spacings: Iterable[tuple[float, int]]) -> float | None:
    """The scrape interval (s, to the millisecond) from ``(width / samples, buckets)`` pairs of
    full buckets: the spacing that 90 % of the buckets reach or exceed in samples.

    A high percentile of samples per bucket rather than the mean: a bucket that lost a scrape
    has fewer samples, and one scrape more than the interval predicts is a boundary effect
    that a few buckets show (21 samples in 300 s at 15 s). None without any bucket.
    """
    ordered = sorted(((iv, k) for iv, k in spacings if k > 0), reverse=True)  # fewest samples first
    total = sum(k for _, k in ordered)
    if not total:
        return None
    rank = min(total - 1, int(total * 0.9))
    seen = 0
    for iv, k in ordered:
        seen += k
        if rank < seen:
            return round(iv, 3)
    return None


@dataclass
class JobAggregate:
    """A job's rows folded up to ``through``: every bucket that starts before it is in here."""

    rows: dict[tuple[PodRef, str], RowAggregate] = field(default_factory=dict)
    through: datetime | None = None
    #: GPU equivalents at the busiest frozen bucket
    peak: float = 0.0
    #: scrape interval (s) a source told for this job, the first one: kept so that a job without
    #: full buckets does not follow each cycle's estimate (see :meth:`interval_for`)
    interval: float = 0.0

    def fold(self, buckets: Iterable[Bucket], shares: ShareMap) -> None:
        """Add buckets (any order): each row's new buckets must all be later than its last.

        Raises :class:`StaleFold` otherwise; the aggregate is then in an undefined state.
        """
        grouped: dict[tuple[PodRef, str], list[Bucket]] = {}
        for (pod, gpu), run in groupby(buckets, key=_POD_GPU):
            key = (pod, gpu.key)
            lst = grouped.get(key)
            if lst is None:
                lst = grouped[key] = []
                if key not in self.rows:
                    self.rows[key] = RowAggregate(pod, gpu)
            lst.extend(run)
        for key, lst in grouped.items():
            # Metric is a str enum: members order as their names do, so this is (name, start)
            lst.sort(key=_METRIC_START)
            self.rows[key].fold(lst, shares)

    def freeze(self, through: datetime, limit: int = POINT_LIMIT) -> None:
        """Mark everything folded so far as final up to ``through``: the peak of the buckets
        folded since the last freeze is kept as one number, and the points are compressed."""
        peak = peak_held(r.held for r in self.rows.values())
        if peak is not None:
            self.peak = max(self.peak, peak)
        for r in self.rows.values():
            r.held = {}
            for st in r.stats.values():
                st.compress(limit)
        self.through = through if self.through is None else max(self.through, through)

    def copy(self) -> "JobAggregate":
        return JobAggregate({k: r.copy() for k, r in self.rows.items()}, self.through, self.peak, self.interval)

    def views(self, window: Window, interval: float) -> list[RowView]:
        """Every row as the summary sees it, in (pod, GPU key) order."""
        return [self.rows[k].view(window, interval) for k in sorted(self.rows)]

    def sample_interval(self) -> float | None:
        """The job's scrape interval from its own full buckets (:func:`interval_of`), or None
        when it has none (a job shorter than three buckets, or never scraped without a gap).

        Only full buckets tell the spacing of samples: a job that starts or ends inside a bucket,
        or a gap that does, leaves that bucket with fewer samples than its width holds, and
        ``width / samples`` there overstates the interval (15 s data ending after 75 s of a
        5-minute bucket reads as 60 s). They depend on the stored buckets only, so re-running a
        cycle over unchanged data gives the same interval whatever the cycle's window held.
        """
        return interval_of(
            (r.width / c, k) for r in self.rows.values() if r.width > 0 for c, k in r.full.items() if c > 0
        )

    def interval_for(self, told: float | None) -> float:
        """The scrape interval a summary of this job uses (s; 0 when nothing tells it).

        The job's own full buckets first (:meth:`sample_interval`). Without any, ``told`` (what
        the source saw across its window, or what it first told for this job), but never more
        than the job's busiest bucket allows: ``width / most`` is an upper bound, since no
        bucket holds more samples than its width over the interval (plus the one on the edge).
        """
        measured = self.sample_interval()
        if measured:
            return measured
        bounds = [r.width / r.most for r in self.rows.values() if r.most > 0 and r.width > 0]
        bound = round(min(bounds), 3) if bounds else None
        if told and told > 0:
            return min(told, bound) if bound else told
        return bound or 0.0

    @property
    def earliest(self) -> datetime | None:
        """The earliest bucket start of any row."""
        starts = [r.first_any for r in self.rows.values() if r.first_any is not None]
        return min(starts) if starts else None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "through": None if self.through is None else _ts(self.through),
            "peak": self.peak,
            "interval": self.interval,
            "rows": [r.to_json() for _, r in sorted(self.rows.items(), key=lambda kv: kv[0])],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "JobAggregate":
        """Parse :meth:`to_json`; ValueError for another version or a malformed document."""
        try:
            if doc.get("version") != STATE_VERSION:
                raise ValueError(f"aggregate state version {doc.get('version')!r}, expected {STATE_VERSION}")
            rows = [RowAggregate.from_json(r) for r in doc["rows"]]
            return cls(
                {(r.pod, r.gpu.key): r for r in rows}, _dt(doc["through"]), float(doc["peak"]), float(doc["interval"])
            )
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"malformed aggregate state: {type(exc).__name__}: {exc}") from exc
