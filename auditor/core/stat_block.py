"""Every metric statistic of one job at once: the percentiles and the rounding of a job's
per-GPU and pooled :class:`~auditor.core.accumulate.Stat` values in a few numpy operations
instead of a sort and six ``round`` calls per statistic (a job of 10 GPUs has 99). Pure.

The results are the ones :meth:`Stat.percentiles` and :func:`~auditor.core.job_summary.rounded`
give, value for value: the percentiles pick the same point (the count of cumulative weights
below the target is what ``bisect_left`` returns), and a value is rounded by numpy only where
that provably equals Python's correctly rounded ``round(v, 6)``; anything else (weights that
are not whole numbers, values that are not finite or are a negative zero, a product near a
half) goes through the Python code.
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np

from auditor.core.accumulate import Stat, percentiles_of
from auditor.core.job_summary import MetricStats

#: the percentiles of the audit JSON
PERCENTILES = (0.10, 0.50, 0.90)
#: beyond this (in units of 1e-6) a float has too few fraction bits for the numpy rounding
_EXACT_BELOW = 2.0**50


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
    ``pools[k]`` (its scalars already summed; its points are theirs, each row stat in at most
    one pool)."""
    n_rows = len(stats) - len(pools)
    pcts = _percentiles(stats[:n_rows], pools)
    if pcts is None:
        pcts = [s.percentiles(*PERCENTILES) for s in stats[:n_rows]]
        pcts += [percentiles_of(sorted(chain.from_iterable(stats[i].points for i in p)), PERCENTILES) for p in pools]
    counts = [s.count for s in stats]
    nums = np.array(
        [(s.total / s.count if s.count else 0.0, s.minimum, s.maximum) for s in stats], dtype=float
    ).reshape(-1, 3)
    p = np.array([[0.0 if v is None else v for v in row] for row in pcts], dtype=float).reshape(-1, 3)
    r = round6(np.concatenate((nums, p), axis=1).ravel())
    out = []
    for k, (s, n, row) in enumerate(zip(stats, counts, pcts)):
        mean, lo, hi, p10, p50, p90 = r[6 * k : 6 * k + 6]
        has_points = row[0] is not None
        out.append(
            MetricStats(
                mean if n else None,
                p10 if has_points else None,
                p50 if has_points else None,
                p90 if has_points else None,
                lo if n else None,
                hi if n else None,
                n,
                s.dropped,
            )
        )
    return out


def _percentiles(rows: Sequence[Stat], pools: Sequence[Sequence[int]]) -> list[list[float | None]] | None:
    """p10/p50/p90 of every row stat, then of every pool, from one sort of all their points by
    (statistic, value); None where the data needs the Python path (see the module's text)."""
    n_rows, n_pools = len(rows), len(pools)
    lens = [len(s.points) for s in rows]
    n = sum(lens)
    if n == 0:
        return [[None, None, None] for _ in range(n_rows + n_pools)]
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(s.points for s in rows)), float, 2 * n)
    v, w = flat[0::2], flat[1::2]
    if not (np.isfinite(v).all() and (w == np.rint(w)).all() and (w >= 0).all()) or (np.signbit(v) & (v == 0)).any():
        return None
    seg = np.repeat(np.arange(n_rows), lens)
    pool_of = np.full(n_rows, -1, dtype=np.int64)
    for k, members in enumerate(pools):
        pool_of[list(members)] = n_rows + k
    pooled = pool_of[seg]
    pooled_mask = pooled >= 0
    values = np.concatenate((v, v[pooled_mask]))
    weights = np.concatenate((w, w[pooled_mask]))
    segs = np.concatenate((seg, pooled[pooled_mask]))
    order = np.argsort(values, kind="stable")
    order = order[np.argsort(segs[order], kind="stable")]
    values, weights, segs = values[order], weights[order], segs[order]
    n_segs = n_rows + n_pools
    sizes = np.bincount(segs, minlength=n_segs)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    cum = np.cumsum(weights)  # whole numbers below 2**53: exact
    before = np.concatenate(([0.0], cum))[starts]
    local = cum - before[segs]
    totals = np.concatenate(([0.0], cum))[ends] - before
    picked = []
    for p in PERCENTILES:
        target = p * totals - 1e-9
        below = np.bincount(segs, weights=local < target[segs], minlength=n_segs).astype(np.int64)
        idx = starts + np.minimum(below, np.maximum(sizes - 1, 0))
        picked.append(values[np.minimum(idx, len(values) - 1)])
    vals = np.stack(picked, axis=1).tolist()
    return [row if size else [None, None, None] for row, size in zip(vals, sizes.tolist())]
