"""Raw samples → buckets: alignment, half-open boundaries, garbage dropped and counted."""

from datetime import datetime, timedelta, timezone

import pytest

from auditor.core.metrics import Metric
from auditor.core.model import GpuId, PodRef, Window
from auditor.core.rollup import Sample, aggregate

POD = PodRef("ns", "p")
GPU = GpuId("GPU-1", index="0")
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc).timestamp()
W = timedelta(minutes=5)


def s(t: float, raw: float, metric: Metric = Metric.SM_ACTIVE) -> Sample:
    return Sample(POD, GPU, metric, T0 + t, raw)


def test_boundary_sample_belongs_to_the_bucket_it_starts():
    out = aggregate([s(0, 0.5), s(299.999, 0.7), s(300, 0.9)], W)
    assert [(b.count, round(b.total, 6)) for b in out] == [(2, 1.2), (1, 0.9)]
    assert out[0].start.timestamp() == T0 and out[0].end - out[0].start == W
    assert out[0].minimum == 0.5 and out[0].maximum == 0.7


@pytest.mark.parametrize(
    "metric, raw, expected",
    [
        (Metric.GPU_UTIL, 100.0, 1.0),  # percent → ratio
        (Metric.GPU_UTIL, 4294967295.0, None),  # the famous garbage value
        (Metric.SM_ACTIVE, float("nan"), None),
        (Metric.SM_ACTIVE, -0.1, None),
        (Metric.SM_ACTIVE, 1.02, 1.0),  # small MIG overshoot is clamped
        (Metric.POWER, 550.5, 550.5),
    ],
)
def test_normalization_and_garbage(metric, raw, expected):
    (b,) = aggregate([s(10, raw, metric)], W)
    if expected is None:
        assert (b.count, b.dropped, b.mean) == (0, 1, None)
    else:
        assert (b.count, b.dropped) == (1, 0) and b.mean == pytest.approx(expected)


def test_garbage_is_not_averaged():
    (b,) = aggregate([s(0, 50, Metric.GPU_UTIL), s(15, 4294967295, Metric.GPU_UTIL), s(30, 100, Metric.GPU_UTIL)], W)
    assert b.count == 2 and b.dropped == 1 and b.mean == pytest.approx(0.75)


def test_window_filters_half_open():
    win = Window(datetime.fromtimestamp(T0 + 60, timezone.utc), datetime.fromtimestamp(T0 + 120, timezone.utc))
    (b,) = aggregate([s(59, 0.1), s(60, 0.2), s(119, 0.3), s(120, 0.4)], W, win)
    assert b.count == 2 and b.total == pytest.approx(0.5)


def test_series_are_kept_apart():
    other = Sample(PodRef("ns", "q"), GPU, Metric.SM_ACTIVE, T0, 0.3)
    out = aggregate([s(0, 0.5), other, s(0, 0.2, Metric.TENSOR_ACTIVE)], W)
    assert len(out) == 3


def test_bad_width():
    with pytest.raises(ValueError):
        aggregate([], timedelta(0))
