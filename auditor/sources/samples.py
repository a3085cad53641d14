"""Raw samples of a range-vector answer → per-bucket count, sum, min and max, as Prometheus's
``*_over_time`` functions compute them.

A short window (an operator cycle's one or two buckets) is cheaper to read as one raw-sample
query per exporter name than as four aggregate queries: Prometheus selects the samples once
instead of evaluating four functions, and the auditor decodes each series' labels once instead
of four times. The statistics must then be exactly those the aggregate queries would have
answered, so the garbage checks and every figure built on them stay the same:

- ``count``: the number of samples (NaN samples included, as ``count_over_time``);
- ``sum``: Kahan-Neumaier summation in sample order, as ``sum_over_time`` (Prometheus
  ``kahanSumInc``; an infinite sum is returned without the compensation term);
- ``min``/``max``: the first sample, replaced by a later one that is smaller/larger or when the
  value so far is NaN, as ``min_over_time``/``max_over_time`` (NaN only when every sample is).

All of it runs in numpy over every (series, bucket) of an answer at once: the Python cost is
per series (collecting its values), not per sample or per bucket. Pure: no I/O.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

#: the four statistics, in the order :func:`bucket_stats` returns them
STATS = ("count", "sum", "min", "max")


def bucket_stats(result: list[dict], first_start_ms: int, width_ms: int, n: int) -> tuple[list[dict], Any]:
    """The label sets of a range-vector answer's series and their per-bucket statistics.

    ``result`` is the decoded ``data.result`` of an instant query ``sel[range]`` (each item a
    ``metric`` label dict and ``values`` ``[ts, "value"]`` pairs in time order); buckets are
    ``[first_start + i*width, first_start + (i+1)*width)`` for ``i < n``. Returns the label
    dicts (as decoded, ``__name__`` removed) and a float64 array of shape ``(4, series, n)``:
    :data:`STATS` per series and bucket, NaN where a bucket has no sample.
    """
    labels: list[dict] = []
    lens: list[int] = []
    for item in result:
        lab = item.get("metric", {})
        lab.pop("__name__", None)
        labels.append(lab)
        lens.append(len(item.get("values") or ()))
    out = np.full((4, len(labels), n), np.nan)
    total = sum(lens)
    if not total:
        return labels, out
    points = list(chain.from_iterable(item.get("values") or () for item in result))
    values = np.fromiter(map(float, map(itemgetter(1), points)), dtype=np.float64, count=total)
    row = np.repeat(np.arange(len(labels), dtype=np.int64), lens)
    if n == 1:  # the query's range is the one bucket: every sample is in it
        col = np.zeros(total, dtype=np.int64)
    else:
        ts = np.fromiter(map(itemgetter(0), points), dtype=np.float64, count=total)
        # whole milliseconds, rounded as auditor.sources.promql.parse_ts_ms does (half to even)
        col = (np.rint(ts * 1000).astype(np.int64) - first_start_ms) // width_ms
        inside = (col >= 0) & (col < n)
        if not inside.all():
            row, col, values = row[inside], col[inside], values[inside]
            if not len(values):
                return labels, out
    del points
    cell = row * n + col
    # samples of one series are in time order, so each (series, bucket) cell is one run
    starts = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
    runs = np.diff(np.append(starts, len(cell)))
    cnt = runs.astype(np.float64)
    s = np.zeros(len(starts))
    c = np.zeros(len(starts))
    lo = values[starts].copy()
    hi = lo.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(int(runs.max())):
            has = np.flatnonzero(runs > k) if k else None
            v = values[starts + k] if has is None else values[starts[has] + k]
            s_k = s if has is None else s[has]
            t = s_k + v
            comp = np.where(np.abs(s_k) >= np.abs(v), (s_k - t) + v, (v - t) + s_k)
            m_lo = lo if has is None else lo[has]
            m_hi = hi if has is None else hi[has]
            new_lo = np.where((v < m_lo) | np.isnan(m_lo), v, m_lo)
            new_hi = np.where((v > m_hi) | np.isnan(m_hi), v, m_hi)
            if has is None:
                s, c, lo, hi = t, c + comp, new_lo, new_hi
            else:
                s[has], c[has], lo[has], hi[has] = t, c[has] + comp, new_lo, new_hi
        tot = np.where(np.isinf(s), s, s + c)
    flat = out.reshape(4, -1)
    at = cell[starts]
    flat[0, at], flat[1, at], flat[2, at], flat[3, at] = cnt, tot, lo, hi
    return labels, out
