"""Summaries from hand-made buckets: coverage, GPU-hours, waste, MFU, percentiles, multi-GPU
findings, sharing, the silent-zero guard and the audit-JSON shape."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, JobRef, PodRef, Window
from auditor.core.sharing import gpu_shares
from auditor.core.summary import summarize_job
from auditor.core.thresholds import Thresholds

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
W = timedelta(minutes=5)
IV = 15.0  # scrape interval: 20 samples per full bucket
WINDOW = Window(T0, T0 + timedelta(hours=1))
NOW = T0 + timedelta(hours=2)
JOB = JobRef("c1", "team-a", "Job", "train", uid="u-1", team="team-a")
POD = PodRef("team-a", "train-0")
H200 = "NVIDIA H200"

BUSY = {
    Metric.GPU_UTIL: 1.0,
    Metric.SM_ACTIVE: 0.9,
    Metric.TENSOR_ACTIVE: 0.4,
    Metric.DRAM_ACTIVE: 0.3,
    Metric.FP32_ACTIVE: 0.05,
    Metric.POWER: 600.0,
}


def gpu(i: int = 0, *, host: str = "n1", instance: str = "", profile: str = "", model: str = H200) -> GpuId:
    return GpuId(f"GPU-{host}-{i}", instance=instance, hostname=host, index=str(i), model=model, mig_profile=profile)


def series(
    values: dict, *, g: GpuId | None = None, pod: PodRef = POD, buckets=range(12), count: int = 20, dropped: int = 0
) -> list[Bucket]:
    """Constant-valued buckets for each metric; ``values`` maps metric → value."""
    g = g or gpu()
    out = []
    for k in buckets:
        start = T0 + k * W
        for m, v in values.items():
            out.append(Bucket(pod, g, m, start, start + W, v * count, count, v, v, dropped))
    return out


def summarize(buckets, **kw) -> dict:
    kw.setdefault("interval", IV)
    return summarize_job(JOB, buckets, window=WINDOW, now=NOW, **kw).to_json()


def codes(s: dict) -> list[str]:
    return [f["code"] for f in s["findings"]]


def test_full_hour_one_gpu():
    s = summarize(series(BUSY))
    assert s["verdict"] == "healthy"
    assert s["coverage"] == 1.0
    assert s["gpu_hours"] == pytest.approx(1.0)
    assert s["waste_gpu_hours"] == pytest.approx(0.1)
    assert (s["start"], s["end"]) == ("2026-11-30T09:00:00Z", "2026-11-30T10:00:00Z")
    assert s["gpu_util"] == 1.0 and s["sm_active"] == 0.9
    assert s["gpus"] == 1


def test_required_fields_and_json():
    s = summarize(series(BUSY))
    for key in (
        "cluster",
        "namespace",
        "job",
        "uid",
        "team",
        "gpu_model",
        "gpus",
        "start",
        "end",
        "gpu_hours",
        "gpu_util",
        "sm_active",
        "sm_occupancy",
        "tensor_active",
        "dram_active",
        "coverage",
        "mfu_estimate",
        "waste_gpu_hours",
        "verdict",
        "findings",
        "per_gpu",
    ):
        assert key in s, key
    assert s["job"] == "Job/train" and s["uid"] == "u-1" and s["cluster"] == "c1"
    assert s["sm_occupancy"] is None  # absent → null, never 0
    (g,) = s["per_gpu"]
    assert g["uuid"] == "GPU-n1-0" and g["verdict"] == "healthy" and g["stats"]["sm_active"]["samples"] == 240
    json.dumps(s)
    for f in s["findings"]:
        assert set(f) == {"code", "message", "evidence"}


def test_interior_gap_lowers_coverage():
    s = summarize(series(BUSY, buckets=[0, 1, 2, 3, 4, 7, 8, 9, 10, 11]))
    assert s["coverage"] == pytest.approx(10 / 12)
    assert s["verdict"] == "healthy"  # 0.83 ≥ 0.8
    s = summarize(series(BUSY, buckets=[0, 1, 2, 8, 9, 10, 11]))
    assert s["verdict"] == "insufficient_data" and codes(s)[0] == "low_coverage"


def test_garbage_counts_against_coverage_and_is_reported():
    s = summarize(series(BUSY, count=15, dropped=5))
    assert s["coverage"] == pytest.approx(0.75)
    assert s["verdict"] == "insufficient_data"
    f = next(f for f in s["findings"] if f["code"] == "garbage_dropped")
    assert f["evidence"]["dropped"]["gpu_util"] == 60


def test_job_starting_mid_bucket():
    b = series(BUSY, buckets=[0], count=8) + series(BUSY, buckets=range(1, 4))
    s = summarize(b)
    assert s["start"] == "2026-11-30T09:03:00Z"  # 8 samples × 15 s before the first bucket's end
    assert s["coverage"] == 1.0
    assert s["gpu_hours"] == pytest.approx((120 + 900) / 3600, abs=1e-6)


def test_missing_sm_is_null_and_insufficient():
    vals = {k: v for k, v in BUSY.items() if k is not Metric.SM_ACTIVE}
    s = summarize(series(vals))
    assert s["sm_active"] is None and s["waste_gpu_hours"] is None
    assert s["verdict"] == "insufficient_data" and codes(s)[0] == "metric_missing"


def test_mig_fraction_and_gr_engine():
    g = gpu(0, instance="1", profile="3g.71gb")
    vals = {
        Metric.GR_ENGINE_ACTIVE: 1.0,
        Metric.SM_ACTIVE: 0.99,
        Metric.TENSOR_ACTIVE: 0.0,
        Metric.DRAM_ACTIVE: 0.68,
        Metric.FP32_ACTIVE: 0.064,
    }
    s = summarize(series(vals, g=g))
    assert s["gpus"] == pytest.approx(3 / 7, abs=1e-4)
    assert s["gpu_hours"] == pytest.approx(3 / 7)
    assert s["gpu_util"] is None and s["busy_signal"] == "gr_engine_active"
    assert s["verdict"] == "memory_bound"
    assert "mig_busy_from_gr_engine" in codes(s)
    assert s["per_gpu"][0]["mig_instance"] == "1" and s["per_gpu"][0]["fraction"] == pytest.approx(3 / 7, abs=1e-6)


def test_time_sliced_gpu_is_not_counted_twice():
    other = PodRef("team-b", "infer-0")
    a = series(BUSY)
    b = series(BUSY, pod=other)
    shares = gpu_shares(a + b)
    s = summarize(a, shares=shares)
    assert s["gpu_hours"] == pytest.approx(0.5)
    assert s["verdict"] == "insufficient_data" and codes(s)[0] == "gpu_shared_unjudged"
    assert "gpu_shared" in codes(s)
    # shared for only a quarter of the job: judged, still split
    b2 = series(BUSY, pod=other, buckets=range(3))
    s = summarize(a, shares=gpu_shares(a + b2))
    assert s["verdict"] == "healthy" and "gpu_shared" in codes(s)
    assert s["gpu_hours"] == pytest.approx(1 - 0.25 / 2)


@pytest.mark.parametrize(
    "model, clock, max_clock, expected, method",
    [
        # × 0.97: the share of the peak a busy tensor pipe delivers (Thresholds.mfu_tensor_rate, issue 28)
        (H200, 1825.0, None, 0.4 * 1825 / 1980 * 0.97, "tensor_active*sm_clock/max_sm_clock*rate"),
        # no clock: the clock share assumed 1 − 0.3 × tensor (Thresholds.mfu_clock_drop, issue 28)
        (H200, None, None, 0.4 * (1 - 0.3 * 0.4) * 0.97, "tensor_active*(1-drop*tensor_active)*rate"),
        ("Tesla T4", 1500.0, None, 0.4 * (1 - 0.3 * 0.4) * 0.97, "tensor_active*(1-drop*tensor_active)*rate"),
        ("Tesla T4", 1500.0, 1590.0, 0.4 * 1500 / 1590 * 0.97, "tensor_active*sm_clock/max_sm_clock*rate"),
    ],
)
def test_mfu_estimate(model, clock, max_clock, expected, method):
    vals = dict(BUSY)
    if clock:
        vals[Metric.SM_CLOCK] = clock
    if max_clock:
        vals[Metric.MAX_SM_CLOCK] = max_clock
    s = summarize(series(vals, g=gpu(model=model)))
    assert s["mfu_estimate"] == pytest.approx(expected, abs=1e-6)
    f = next(f for f in s["findings"] if f["code"] == "mfu_estimate")
    assert f["evidence"]["method"] == method


def test_mfu_null_without_tensor():
    vals = {k: v for k, v in BUSY.items() if k is not Metric.TENSOR_ACTIVE}
    assert summarize(series(vals))["mfu_estimate"] is None


def test_percentiles_are_count_weighted_bucket_means():
    b = []
    for k, (v, n) in enumerate([(0.1, 20), (0.5, 20), (0.9, 20), (0.95, 20), (1.0, 20)] * 2 + [(0.2, 20), (0.3, 20)]):
        start = T0 + k * W
        b.append(Bucket(POD, gpu(), Metric.SM_ACTIVE, start, start + W, v * n, n, v, v))
        b.append(Bucket(POD, gpu(), Metric.GPU_UTIL, start, start + W, n, n, 1, 1))
    st = summarize(b)["stats"]["sm_active"]
    assert (st["p10"], st["p50"], st["p90"]) == (0.1, 0.5, 1.0)
    assert st["min"] == 0.1 and st["max"] == 1.0 and st["samples"] == 240


def test_straggler_in_collective():
    waiting = {
        Metric.GPU_UTIL: 1.0,
        Metric.SM_ACTIVE: 0.03,
        Metric.TENSOR_ACTIVE: 0.0,
        Metric.DRAM_ACTIVE: 0.0,
        Metric.POWER: 124.0,
    }
    slow = {
        Metric.GPU_UTIL: 0.12,
        Metric.SM_ACTIVE: 0.07,
        Metric.TENSOR_ACTIVE: 0.015,
        Metric.DRAM_ACTIVE: 0.03,
        Metric.POWER: 155.0,
    }
    b = series(waiting, g=gpu(0)) + series(waiting, g=gpu(1)) + series(waiting, g=gpu(2)) + series(slow, g=gpu(3))
    s = summarize(b)
    # issue 28: the headline is the cause — the slow rank — not the pooled low SM activity
    assert s["verdict"] == "underutilized"
    head = s["findings"][0]
    assert head["evidence"]["reason"] == "straggler"
    assert head["evidence"]["slow"][0]["gpu"] in head["message"].split(" is slow")[0]
    assert s["gpus"] == 4 and s["gpu_hours"] == pytest.approx(4.0)
    f = next(f for f in s["findings"] if f["code"] == "collective_wait_straggler")
    assert len(f["evidence"]["waiting"]) == 3 and len(f["evidence"]["stragglers"]) == 1
    assert "straggler" in f["message"]
    # the message names the slow rank and the waiting ones (issue 15)
    slow_gpu = f["evidence"]["stragglers"][0]["gpu"]
    assert f"Slow: {slow_gpu};" in f["message"]
    assert all(w["gpu"] in f["message"].split("waiting: ")[1] for w in f["evidence"]["waiting"])
    assert [g["verdict"] for g in s["per_gpu"]] == ["low_sm_efficiency"] * 3 + ["underutilized"]


def test_idle_gpu_inside_multi_gpu_job():
    idle = {
        Metric.GPU_UTIL: 0.0,
        Metric.SM_ACTIVE: 0.0,
        Metric.TENSOR_ACTIVE: 0.0,
        Metric.DRAM_ACTIVE: 0.0,
        Metric.POWER: 120.0,
    }
    s = summarize(series(BUSY, g=gpu(0)) + series(idle, g=gpu(1)))
    assert s["verdict"] == "underutilized"  # job mean utilization 50 %
    f = next(f for f in s["findings"] if f["code"] == "idle_gpus_in_job")
    assert f["evidence"]["idle_gpus"] == ["train-0 n1:gpu1"]
    assert s["waste_gpu_hours"] == pytest.approx(0.1 + 1.0)


def test_gpu_imbalance():
    half = dict(BUSY, **{Metric.SM_ACTIVE: 0.55})
    s = summarize(series(BUSY, g=gpu(0)) + series(half, g=gpu(1)))
    assert "gpu_imbalance" in codes(s)


@pytest.mark.parametrize(
    "power, verdict",
    [
        (600.0, "insufficient_data"),  # busy, power-hungry, SM exactly 0 → suspect telemetry
        (None, "insufficient_data"),  # power unknown: cannot clear the suspicion
        (121.0, "low_sm_efficiency"),  # idle power: a near-zero SM reading is plausible
    ],
)
def test_silent_zero_guard(power, verdict):
    vals = {Metric.GPU_UTIL: 1.0, Metric.SM_ACTIVE: 0.0, Metric.TENSOR_ACTIVE: 0.0, Metric.DRAM_ACTIVE: 0.0}
    if power is not None:
        vals[Metric.POWER] = power
    s = summarize(series(vals))
    assert s["verdict"] == verdict
    if verdict == "insufficient_data":
        assert codes(s)[0] == "profiling_zero_suspect"


def test_interval_estimated_when_unknown():
    s = summarize_job(JOB, series(BUSY), window=WINDOW, now=NOW).to_json()
    assert s["scrape_interval_s"] == 15.0 and s["coverage"] == 1.0


def test_metric_partial():
    vals = {k: v for k, v in BUSY.items() if k is not Metric.SM_ACTIVE}
    s = summarize(series(BUSY, g=gpu(0)) + series(vals, g=gpu(1)))
    assert "metric_partial" in codes(s) and s["waste_gpu_hours"] is None


def test_empty_job():
    s = summarize([])
    assert s["verdict"] == "insufficient_data" and s["gpu_hours"] == 0 and s["per_gpu"] == []


def test_thresholds_passed_through():
    vals = dict(BUSY, **{Metric.SM_ACTIVE: 0.45})
    assert summarize(series(vals))["verdict"] == "low_sm_efficiency"
    th = Thresholds(low_sm=0.4, healthy_max_waste=0.6)
    assert summarize(series(vals), thresholds=th)["verdict"] == "healthy"
