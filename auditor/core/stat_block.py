"""Every metric statistic of one job at once: the percentiles of a job's per-GPU and pooled
:class:`~auditor.core.accumulate.Stat` values and the rounding of all their figures (a job of
10 GPUs has 99 statistics of 6 figures, and 11 sets of 13 means). Pure.

The results are the ones :meth:`Stat.percentiles` and :func:`~auditor.core.job_summary.rounded`
give, value for value. The percentiles are computed as :meth:`Stat.percentiles` does (a pooled
stat's points are its rows' points in row order, sorted once, without building the pooled
point list each time a row is merged). The rounding is where the time went: Python's
``round(v, 6)`` converts through a decimal string (~0.4 us a value), so a job's figures are
rounded in one numpy operation, and only the values where that could differ from Python's
correctly rounded result go through ``round``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from itertools import accumulate
from operator import itemgetter
from typing import Mapping, Sequence

import numpy as np

from auditor.core.accumulate import Stat
from auditor.core.job_summary import MEAN_FIELDS, Means, MetricStats
from auditor.core.metrics import Metric

#: beyond this (in units of 1e-6) a float has too few fraction bits for the numpy rounding
_EXACT_BELOW = 2.0**50
_WEIGHT = itemgetter(1)
#: a named tuple from its values without its Python-level ``__new__`` (99 per job and cycle)
_new = tuple.__new__
_MEAN_METRICS = tuple(m for _, m in MEAN_FIELDS)
_MEAN_NAMES = tuple(name for name, _ in MEAN_FIELDS)


def round6(x: np.ndarray) -> list[float]:
    """``[round(v, 6) for v in x]``, exactly.

    Python rounds the exact binary value (half to even) and returns the double nearest the
    decimal result; ``rint(x * 1e6) / 1e6`` does the same unless the product's own rounding
    moved it across a half (within a few ulps of one) or it has no fraction bits left, so
    those values, and non-finite ones, are rounded by Python."""
    y = x * 1e6
    out: list[float] = (np.rint(y) / 1e6).tolist()
    with np.errstate(invalid="ignore"):
        ay = np.abs(y)
        near_half = np.abs(y - np.floor(y) - 0.5) <= 4 * np.spacing(ay)
        suspect = near_half | ~(ay < _EXACT_BELOW)
    if suspect.any():
        for i in np.flatnonzero(suspect).tolist():
            out[i] = round(float(x[i]), 6)
    return out


def metric_stats(stats: Sequence[Stat], pools: Sequence[Sequence[int]]) -> list[MetricStats]:
    """The :class:`MetricStats` of ``stats`` (in order): the first ``len(stats) - len(pools)``
    are rows' stats with their own points; stat ``rows + k`` is pooled over the rows' stats
    ``pools[k]`` (its scalars already summed; its points are theirs, in that order)."""
    pcts = _percentile_block(stats, pools)
    figures: list[float] = []
    for s, pc in zip(stats, pcts):
        n = s.count
        if n:
            figures += (s.total / n, s.minimum, s.maximum)
        else:
            figures += (0.0, 0.0, 0.0)
        figures += pc if pc is not None else (0.0, 0.0, 0.0)
    r = round6(np.array(figures, dtype=float))
    out = []
    for k, (s, pc) in enumerate(zip(stats, pcts)):
        mean, lo, hi, p10, p50, p90 = r[6 * k : 6 * k + 6]
        n = s.count
        if pc is not None and n:
            out.append(_new(MetricStats, (mean, p10, p50, p90, lo, hi, n, s.dropped)))
        elif pc is not None:
            out.append(_new(MetricStats, (None, p10, p50, p90, None, None, n, s.dropped)))
        else:
            out.append(
                _new(
                    MetricStats,
                    (mean if n else None, None, None, None, lo if n else None, hi if n else None, n, s.dropped),
                )
            )
    return out


#: the percentiles of every statistic
_PS = np.array([0.1, 0.5, 0.9])


def _percentile_block(stats: Sequence[Stat], pools: Sequence[Sequence[int]]) -> list[tuple[float, float, float] | None]:
    """p10, p50 and p90 of each stat's points (a pooled stat's are its members' points), None for
    a stat without points: the rows' stats sorted as one padded matrix, the pools' as another.

    The same values as sorting each stat's (mean, weight) pairs and bisecting their cumulative
    weights (:func:`_p10_p50_p90`). Points of equal mean are equal in bits unless they are 0.0
    and -0.0, so where there is no -0.0 the order of equal means does not change which mean is
    picked, only which of them; and with whole weights (sample counts, :class:`Stat`'s) the
    cumulative sums are exact in doubles, so ``bisect_left(cum, p * total - 1e-9)`` is the number
    of sums below ``ceil(p * total - 1e-9)``. Padding is +inf with weight 0: never below a
    threshold, and a picked +inf mean is +inf either way. Anything else (a -0.0 or NaN mean, a
    weight that is not positive, pools that do not each take rows of their own) is computed
    stat by stat as before."""
    n_rows = len(stats) - len(pools)
    values, weights = array("d"), array("q")
    lens: list[int] = []
    for s in stats[:n_rows]:
        values += s.values
        weights += s.weights
        lens.append(len(s.values))
    member_of = _partition(pools, n_rows)
    v = np.frombuffer(values, dtype=float)
    w = np.frombuffer(weights, dtype=np.int64)
    if (
        member_of is None
        or not v.size
        or np.isnan(v).any()
        or (np.signbit(v) & (v == 0.0)).any()
        or not (w > 0).all()
        or int(w.sum()) >= 2**52
    ):
        return _one_by_one(stats, pools)
    row_lens = np.array(lens, dtype=np.int64)
    out = _padded_percentiles(v, w.astype(float), row_lens)
    if pools:
        seg = np.repeat(np.asarray(member_of, dtype=np.int64) - n_rows, row_lens)  # len(pools): in none
        order = np.argsort(seg, kind="stable")  # each pool's points in row order
        pool_lens = np.bincount(seg, minlength=len(pools) + 1)[: len(pools)]
        keep = order[: int(pool_lens.sum())]
        out += _padded_percentiles(v[keep], w[keep].astype(float), pool_lens)
    return out


def _padded_percentiles(v: np.ndarray, w: np.ndarray, lens: np.ndarray) -> list[tuple[float, float, float] | None]:
    """:func:`_percentile_block` of consecutive runs of points (``lens`` of them each)."""
    n = len(lens)
    width = int(lens.max()) if n else 0
    if not width:
        return [None] * n
    starts = np.cumsum(lens) - lens
    rows = np.repeat(np.arange(n), lens)
    cols = np.arange(len(v)) - starts[rows]
    mv = np.full((n, width), np.inf)
    mw = np.zeros((n, width))
    mv[rows, cols] = v
    mw[rows, cols] = w
    order = np.argsort(mv, axis=1)
    mv = np.take_along_axis(mv, order, axis=1)
    cum = np.cumsum(np.take_along_axis(mw, order, axis=1), axis=1)
    need = np.ceil(_PS[None, :] * cum[:, -1:] - 1e-9)  # (n, 3)
    at = (cum[:, None, :] < need[:, :, None]).sum(axis=2)
    at = np.minimum(at, np.maximum(lens - 1, 0)[:, None])
    picked = np.take_along_axis(mv, at, axis=1).tolist()
    return [tuple(picked[k]) if has else None for k, has in enumerate((lens > 0).tolist())]


def _partition(pools: Sequence[Sequence[int]], n_rows: int) -> list[int] | None:
    """Each row stat's pooled stat (``n_rows + k``, or ``n_rows + len(pools)`` for none), when
    every row is in at most one pool and each pool lists its rows in ascending order."""
    member_of = [n_rows + len(pools)] * n_rows
    for k, members in enumerate(pools):
        prev = -1
        for i in members:
            if i <= prev or member_of[i] != n_rows + len(pools):
                return None
            member_of[i] = n_rows + k
            prev = i
    return member_of


def _one_by_one(stats: Sequence[Stat], pools: Sequence[Sequence[int]]) -> list[tuple[float, float, float] | None]:
    """:func:`_percentile_block` one stat at a time (sorted pairs, bisected cumulative weights)."""
    n_rows = len(stats) - len(pools)
    ordered = [sorted(s.points) for s in stats[:n_rows]]
    for members in pools:
        # the rows' ordered points: a stable sort of sorted runs orders equal points as one of
        # the rows' points in row order would (row, then insertion)
        union: list[tuple[float, int]] = []
        for i in members:
            union += ordered[i]
        union.sort()
        ordered.append(union)
    return [_p10_p50_p90(pts) if pts else None for pts in ordered]


def _p10_p50_p90(pts: list[tuple[float, int]]) -> tuple[float, float, float]:
    """:meth:`Stat.percentiles` (0.1, 0.5, 0.9) of ordered points, without the call per ``p``."""
    cumulative = list(accumulate(map(_WEIGHT, pts)))
    total = cumulative[-1]
    last = len(pts) - 1
    i = bisect_left(cumulative, 0.1 * total - 1e-9)
    j = bisect_left(cumulative, 0.5 * total - 1e-9)
    k = bisect_left(cumulative, 0.9 * total - 1e-9)
    return pts[i if i < last else last][0], pts[j if j < last else last][0], pts[k if k < last else last][0]


def means_of(stats: Sequence[Mapping[Metric, Stat]]) -> list[Means]:
    """:meth:`Means.of` each map of stats (a row's, the pooled ones), rounded all at once."""
    figures: list[float] = []
    present: list[bool] = []
    for by_metric in stats:
        for m in _MEAN_METRICS:
            s = by_metric.get(m)
            if s is not None and s.count:
                figures.append(s.total / s.count)
                present.append(True)
            else:
                figures.append(0.0)
                present.append(False)
    r = round6(np.array(figures, dtype=float))
    width = len(_MEAN_METRICS)
    return [
        Means(
            **{name: v if has else None for name, v, has in zip(_MEAN_NAMES, r[k : k + width], present[k : k + width])}
        )
        for k in range(0, len(r), width)
    ]
