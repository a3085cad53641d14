"""The job's statistics computed all at once (auditor/core/stat_block.py) equal the one-by-one
definitions value for value: ``rounded`` for the rounding, :meth:`Stat.percentiles` for the
percentiles, pooled stats over the union of their rows' points."""

import math
import random
import struct

import numpy as np
import pytest

from auditor.core.accumulate import Stat
from auditor.core.job_summary import MEAN_FIELDS, Means, MetricStats, rounded
from auditor.core.metrics import Metric
from auditor.core.stat_block import means_of, metric_stats, round6


def _bits(v: float | None) -> object:
    """A value compared bit for bit (-0.0 is not 0.0; NaN equals NaN)."""
    return None if v is None else struct.pack("<d", v)


def _reference(st: Stat) -> MetricStats:
    """What the summary computed one statistic at a time before the block."""
    p10, p50, p90 = st.percentiles(0.10, 0.50, 0.90)
    return MetricStats(
        mean=rounded(st.mean),
        p10=rounded(p10),
        p50=rounded(p50),
        p90=rounded(p90),
        min=rounded(st.minimum) if st.count else None,
        max=rounded(st.maximum) if st.count else None,
        samples=st.count,
        dropped=st.dropped,
    )


def _hard_values(rnd: random.Random) -> list[float]:
    """Values where a naive rint(x * 1e6) / 1e6 goes wrong, and ordinary ones."""
    out = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-7, -1e-7, 5e-7, -5e-7, 1e-300, 4.5e9, 4.6e9, 1e10, 1.5e15, 1e300]
    out += [math.inf, -math.inf, math.nan]
    out += [k / 128 for k in range(-300, 300)]  # exact halves of 1e-6 (x * 1e6 = n + 0.5 exactly)
    for _ in range(3000):
        k = rnd.randrange(-(10**12), 10**12)
        half = (k + 0.5) / 1e6  # as near a half as a double gets
        out += [half, math.nextafter(half, math.inf), math.nextafter(half, -math.inf)]
        out.append(rnd.random() * 10 ** rnd.randint(-8, 11) * rnd.choice((1, -1)))
    return out


def test_round6_equals_python_round() -> None:
    values = _hard_values(random.Random(7))
    got = round6(np.array(values, dtype=float))
    want = [round(v, 6) for v in values]
    assert [_bits(v) for v in got] == [_bits(v) for v in want]
    assert all(type(v) is float for v in got)


def _stat(rnd: random.Random, n_points: int, *, ties: bool = False) -> Stat:
    pts = []
    for _ in range(n_points):
        v = rnd.choice((0.25, 0.5, 0.75)) if ties else rnd.random() * rnd.choice((1.0, 600.0, 4e4))
        pts.append((v, rnd.randint(1, 20)))
    count = sum(w for _, w in pts)
    lo = min((v for v, _ in pts), default=math.inf)
    hi = max((v for v, _ in pts), default=-math.inf)
    total = sum(v * w for v, w in pts)
    return Stat(total, count, rnd.randint(0, 2), lo, hi, pts)


def _pooled(stats: list[Stat]) -> Stat:
    p = Stat()
    for s in stats:
        p.merge(s)
    return p


def test_metric_stats_equal_the_one_by_one_statistics() -> None:
    rnd = random.Random(3)
    for case in range(60):
        n_rows, n_metrics = rnd.randint(1, 12), rnd.randint(1, 9)
        rows = [[_stat(rnd, rnd.randint(0, 70), ties=case % 3 == 0) for _ in range(n_metrics)] for _ in range(n_rows)]
        if case % 5 == 0:  # a row with nothing valid: no points, count 0
            rows[0][0] = Stat(dropped=3)
        flat = [s for r in rows for s in r]
        pools = [[i * n_metrics + m for i in range(n_rows)] for m in range(n_metrics)]
        pooled = [_pooled([flat[i] for i in p]) for p in pools]
        got = metric_stats(flat + [Stat(p.total, p.count, p.dropped, p.minimum, p.maximum) for p in pooled], pools)
        want = [_reference(s) for s in flat + pooled]
        assert [tuple(map(_bits_or_int, g)) for g in got] == [tuple(map(_bits_or_int, w)) for w in want], case


def test_metric_stats_on_odd_values() -> None:
    """A negative zero, a non-finite value, one point: still the same."""
    for pts in ([(-0.0, 3), (0.0, 5), (0.1, 1)], [(math.inf, 2), (0.3, 1)], [(0.2, 7)]):
        st = Stat(sum(v * w for v, w in pts), 3, 0, min(v for v, _ in pts), max(v for v, _ in pts), pts)
        (got,) = metric_stats([st], [])
        assert tuple(map(_bits_or_int, got)) == tuple(map(_bits_or_int, _reference(st)))


def _bits_or_int(v: object) -> object:
    return _bits(v) if isinstance(v, float) else v


def test_means_of_equals_means_of_each() -> None:
    rnd = random.Random(5)
    maps = []
    for _ in range(40):
        metrics = rnd.sample([m for _, m in MEAN_FIELDS] + [Metric.MAX_SM_CLOCK], rnd.randint(0, 10))
        maps.append({m: _stat(rnd, rnd.randint(0, 5)) for m in metrics})
    maps[0] = {Metric.SM_ACTIVE: Stat(dropped=2)}  # present, nothing valid: None
    want = [Means.of(lambda m, by=by: by[m].mean if m in by else None) for by in maps]
    got = means_of(maps)
    assert [tuple(map(_bits, (getattr(g, n) for n, _ in MEAN_FIELDS))) for g in got] == [
        tuple(map(_bits, (getattr(w, n) for n, _ in MEAN_FIELDS))) for w in want
    ]


def test_the_one_sort_gives_what_sorting_each_stat_gives_at_signed_zeros_and_nan() -> None:
    """Points that compare equal but differ in bits (-0.0 and 0.0 at one weight) in several rows
    of one pool come out of the job's one sort in the order sorting each row and then the pool
    gives them; a NaN mean and pools out of row order take the stat-by-stat path; every case
    equals the reference."""
    zero_rows = [
        Stat(0.0, 6, 0, 0.0, 0.0, [(-0.0, 3), (0.0, 3)]),
        Stat(0.0, 6, 0, 0.0, 0.0, [(0.0, 3), (-0.0, 3)]),
        Stat(0.0, 3, 0, 0.0, 0.0, [(-0.0, 3)]),
    ]
    nan_rows = [Stat(1.0, 3, 0, 0.5, 0.5, [(math.nan, 1), (0.5, 2)]), Stat(1.0, 2, 0, 0.5, 0.5, [(0.5, 2)])]
    for rows, pools in ((zero_rows, [[0, 1, 2]]), (zero_rows, [[2, 0], [1]]), (nan_rows, [[0, 1]])):
        pooled = [_pooled([rows[i] for i in p]) for p in pools]
        got = metric_stats(rows + [Stat(p.total, p.count, p.dropped, p.minimum, p.maximum) for p in pooled], pools)
        want = [_reference(s) for s in rows + pooled]
        assert [tuple(map(_bits_or_int, g)) for g in got] == [tuple(map(_bits_or_int, w)) for w in want]


def test_a_weight_is_a_whole_sample_count() -> None:
    """Weights are sample counts: a fractional one is refused where it is added, not rounded."""
    with pytest.raises(TypeError):
        Stat(points=[(0.2, 1.5)])
