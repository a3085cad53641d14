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
    n_rows = len(stats) - len(pools)
    ordered = [sorted(s.points) for s in stats[:n_rows]]
    for members in pools:
        # the rows' ordered points: a stable sort of sorted runs orders equal points as one of
        # the rows' points in row order would (row, then insertion), with fewer comparisons
        union: list[tuple[float, int]] = []
        for i in members:
            union += ordered[i]
        union.sort()
        ordered.append(union)
    figures: list[float] = []
    for s, pts in zip(stats, ordered):
        n = s.count
        if n:
            figures += (s.total / n, s.minimum, s.maximum)
        else:
            figures += (0.0, 0.0, 0.0)
        figures += _p10_p50_p90(pts) if pts else (0.0, 0.0, 0.0)
    r = round6(np.array(figures, dtype=float))
    out = []
    for k, (s, pts) in enumerate(zip(stats, ordered)):
        mean, lo, hi, p10, p50, p90 = r[6 * k : 6 * k + 6]
        n = s.count
        if pts and n:
            out.append(_new(MetricStats, (mean, p10, p50, p90, lo, hi, n, s.dropped)))
        elif pts:
            out.append(_new(MetricStats, (None, p10, p50, p90, None, None, n, s.dropped)))
        else:
            out.append(
                _new(
                    MetricStats,
                    (mean if n else None, None, None, None, lo if n else None, hi if n else None, n, s.dropped),
                )
            )
    return out


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
