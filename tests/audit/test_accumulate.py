"""The mergeable aggregate behind cumulative summaries: folding a job's buckets in freeze steps
(what the operator does, cycle after cycle) gives the one-shot summary; the percentile points
stay bounded; the state survives its JSON form."""

import json
import random
from datetime import timedelta

import pytest
from test_summary import BUSY, IV, JOB, NOW, T0, W, gpu, series

from auditor.core.accumulate import POINT_LIMIT, JobAggregate, StaleFold, Stat, merge_nearest
from auditor.core.metrics import Metric
from auditor.core.model import Bucket, PodRef, Window
from auditor.core.sharing import gpu_shares
from auditor.core.summary import summarize_aggregate, summarize_job

WINDOW = Window(T0, T0 + timedelta(hours=1))


def noisy(values: dict, *, seed: int, **kw) -> list[Bucket]:
    """:func:`series` with every bucket's value jittered, so no two bucket means are equal."""
    rnd = random.Random(seed)
    out = []
    for b in series(values, **kw):
        v = b.minimum * (0.8 + 0.4 * rnd.random())
        out.append(
            b._replace(
                total=v * b.count, minimum=v * 0.9, maximum=min(v * 1.1, 1.0) if b.metric != Metric.POWER else v * 1.1
            )
        )
    return out


def fold_in_steps(buckets: list[Bucket], cuts: list, *, window: Window) -> dict:
    """The operator's way: freeze at each cut (a round trip through JSON, as the store keeps it),
    then summarize a copy with the rest folded in."""
    shares = gpu_shares(buckets)
    agg = JobAggregate()
    lo = None
    for cut in cuts:
        part = [b for b in buckets if (lo is None or b.start >= lo) and b.start < cut]
        agg.fold(part, shares)
        agg.freeze(cut)
        assert all(len(st.points) <= POINT_LIMIT for r in agg.rows.values() for st in r.stats.values())
        agg = JobAggregate.from_json(json.loads(json.dumps(agg.to_json())))
        lo = cut
    view = agg.copy()
    view.fold([b for b in buckets if lo is None or b.start >= lo], shares)
    # as the engine does: the job's own full buckets tell the interval, the source's is the fallback
    return summarize_aggregate(JOB, view, window=window, now=NOW, interval=view.interval_for(IV)).to_json()


def job_mix() -> list[Bucket]:
    """Two pods, a scrape gap, a partial first bucket, garbage, a MIG slice and a shared GPU."""
    a = noisy(BUSY, seed=1, buckets=[0, 1, 2, 5, 6, 7, 8, 11])
    a[0 : len(BUSY)] = [b._replace(count=7, total=b.total / 20 * 7) for b in a[0 : len(BUSY)]]
    b = noisy(
        {Metric.GR_ENGINE_ACTIVE: 0.9, Metric.SM_ACTIVE: 0.2},
        seed=2,
        g=gpu(1, instance="3", profile="3g.71gb"),
        pod=PodRef("team-a", "train-1"),
        buckets=range(2, 10),
        dropped=2,
    )
    shared = noisy(BUSY, seed=3, g=gpu(5), pod=PodRef("team-a", "train-2"), buckets=range(0, 6))
    other = noisy(BUSY, seed=4, g=gpu(5), pod=PodRef("team-a", "train-3"), buckets=range(3, 9))
    return a + b + shared + other


@pytest.mark.parametrize(
    "cuts",
    [
        [],
        [WINDOW.start + W],
        [WINDOW.start + 3 * W, WINDOW.start + 4 * W],
        [WINDOW.start + k * W for k in range(1, 12)],
        [WINDOW.start + 7 * W],
    ],
)
def test_folding_in_steps_equals_the_one_shot_summary(cuts: list) -> None:
    buckets = job_mix()
    whole = summarize_job(JOB, buckets, window=WINDOW, now=NOW, interval=IV).to_json()
    stepped = fold_in_steps(buckets, cuts, window=WINDOW)
    assert stepped["gpus"] == whole["gpus"]
    whole_s, stepped_s = json.dumps(whole, sort_keys=True), json.dumps(stepped, sort_keys=True)
    assert stepped_s == whole_s
    # the mix exercised what it is meant to
    codes = {f["code"] for f in whole["findings"]}
    assert {"gpu_shared", "garbage_dropped", "mig_busy_from_gr_engine"} <= codes
    assert whole["coverage"] < 1.0


def test_a_job_that_ends_before_the_freeze_keeps_its_partial_last_bucket() -> None:
    buckets = series(BUSY, buckets=range(4))
    buckets[-len(BUSY) :] = [b._replace(count=5, total=b.total / 4) for b in buckets[-len(BUSY) :]]
    whole = summarize_job(JOB, buckets, window=WINDOW, now=NOW, interval=IV).to_json()
    stepped = fold_in_steps(buckets, [WINDOW.start + 10 * W], window=WINDOW)
    assert stepped == whole
    assert whole["gpu_hours"] == pytest.approx((3 * 300 + 5 * IV) / 3600, abs=1e-6)


def test_refolding_a_frozen_bucket_is_refused() -> None:
    buckets = series(BUSY, buckets=range(3))
    agg = JobAggregate()
    agg.fold(buckets, {})
    agg.freeze(T0 + 3 * W)
    with pytest.raises(StaleFold):
        agg.fold(series(BUSY, buckets=[2]), {})


def test_points_stay_bounded_and_percentiles_close_on_a_long_job() -> None:
    rnd = random.Random(7)
    hours = 48
    buckets = []
    for k in range(hours * 12):
        start = T0 + k * W
        v = min(1.0, max(0.0, rnd.gauss(0.45 if k % 24 < 16 else 0.1, 0.05)))
        buckets.append(
            Bucket(PodRef("team-a", "long-0"), gpu(), Metric.SM_ACTIVE, start, start + W, v * 20, 20, v, v, 0)
        )
        buckets.append(
            Bucket(PodRef("team-a", "long-0"), gpu(), Metric.GPU_UTIL, start, start + W, 20.0, 20, 1.0, 1.0, 0)
        )
    window = Window(T0, T0 + timedelta(hours=hours))
    whole = summarize_job(JOB, buckets, window=window, now=window.end, interval=IV).to_json()
    cuts = [T0 + timedelta(minutes=m) for m in range(5, hours * 60, 5)]  # a freeze every cycle
    stepped = fold_in_steps(buckets, cuts, window=window)
    exact, approx = whole["stats"]["sm_active"], stepped["stats"]["sm_active"]
    for k in ("mean", "min", "max", "samples"):
        assert approx[k] == pytest.approx(exact[k], rel=1e-9)
    for k in ("p10", "p50", "p90"):
        assert approx[k] == pytest.approx(exact[k], abs=0.01), k
    for k in ("gpu_hours", "coverage", "waste_gpu_hours", "verdict", "gpus"):
        assert stepped[k] == pytest.approx(whole[k]) if isinstance(whole[k], float) else stepped[k] == whole[k]


def test_merge_nearest_keeps_weight_order_and_exactness() -> None:
    few = [(0.3, 2), (0.1, 1), (0.3, 3)]
    assert merge_nearest(few, 4) == [(0.1, 1), (0.3, 5)]  # equal values merge, nothing else
    rnd = random.Random(3)
    pts = [(rnd.random(), rnd.randint(1, 20)) for _ in range(1000)]
    out = merge_nearest(pts, POINT_LIMIT)
    assert len(out) == POINT_LIMIT
    assert sum(w for _, w in out) == sum(w for _, w in pts)
    assert [v for v, _ in out] == sorted(v for v, _ in out)
    assert min(v for v, _ in pts) <= out[0][0] and out[-1][0] <= max(v for v, _ in pts)
    exact, approx = Stat(points=pts), Stat(points=out)
    for p, q in zip(exact.percentiles(0.1, 0.5, 0.9), approx.percentiles(0.1, 0.5, 0.9)):
        assert q == pytest.approx(p, abs=0.03)


def test_state_round_trips_through_json_and_refuses_other_versions() -> None:
    agg = JobAggregate()
    agg.fold(job_mix(), {})
    agg.freeze(T0 + 12 * W)
    doc = json.loads(json.dumps(agg.to_json()))
    back = JobAggregate.from_json(doc)
    assert back.to_json() == agg.to_json()
    with pytest.raises(ValueError, match="version"):
        JobAggregate.from_json({**doc, "version": 99})
    with pytest.raises(ValueError, match="malformed"):
        JobAggregate.from_json({**doc, "rows": [{"pod": ["a"]}]})


def test_the_scan_and_the_heap_merge_the_same_pairs() -> None:
    from auditor.core.accumulate import _merge_heap, _merge_scan

    rnd = random.Random(11)
    for n in (POINT_LIMIT + 1, POINT_LIMIT + 2, POINT_LIMIT + 8):
        vals = sorted({round(rnd.random(), 3) for _ in range(n * 2)})[:n]  # ties in the gaps too
        wts = [rnd.randint(1, 20) for _ in vals]
        assert _merge_scan(list(vals), list(wts), POINT_LIMIT) == _merge_heap(list(vals), list(wts), POINT_LIMIT)


def test_the_fold_reads_buckets_by_position() -> None:
    """The fold indexes and unpacks a Bucket by position: its field order is part of that."""
    assert Bucket._fields == ("pod", "gpu", "metric", "start", "end", "total", "count", "minimum", "maximum", "dropped")
