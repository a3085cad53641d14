"""Issue 28: verdicts that agree with the numbers beside them, and advice from the evidence —
periodic stalls read from the buckets' extremes, a healthy job's bounded waste, host offload,
serving, low occupancy and the straggler headline."""

from dataclasses import replace

import pytest
from test_classify import ev
from test_summary import BUSY, JOB, NOW, POD, T0, WINDOW, W, gpu, series, summarize

from auditor.core.accumulate import JobAggregate, Stat, idle_phase_samples
from auditor.core.metrics import Metric
from auditor.core.model import Bucket, Verdict
from auditor.core.summary import summarize_job
from auditor.core.thresholds import Thresholds
from auditor.core.verdicts import RankLoad, Straggler, classify

V = Verdict
TH = Thresholds()


def square_wave(busy_share: float, *, buckets=range(12), count: int = 60, within: bool = True) -> list[Bucket]:
    """A training that stops periodically: GPU_UTIL 1.0 while it trains, 0 while it stalls.

    ``within``: stalls of tens of seconds inside every 5-minute bucket (each bucket's minimum 0,
    maximum 1, mean ``busy_share``); else whole buckets alternate between busy and idle."""
    out: list[Bucket] = []
    for k in buckets:
        start = T0 + k * W
        if within:
            util, lo, hi = busy_share, 0.0, 1.0
        else:
            util = lo = hi = 1.0 if (k % 3) else 0.0
        sm = 0.9 * util
        for m, v, mn, mx in (
            (Metric.GPU_UTIL, util, lo, hi),
            (Metric.SM_ACTIVE, sm, 0.0, 0.9 if hi else 0.0),
            (Metric.TENSOR_ACTIVE, 0.45 * util, 0.0, 0.45 if hi else 0.0),
            (Metric.DRAM_ACTIVE, 0.25 * util, 0.0, 0.25 if hi else 0.0),
            (Metric.FP32_ACTIVE, 0.05 * util, 0.0, 0.05 if hi else 0.0),
        ):
            out.append(Bucket(POD, gpu(), m, start, start + W, v * count, count, mn, mx))
    return out


def test_idle_phase_samples_reads_the_square_wave_from_min_max_and_mean():
    b = square_wave(0.67, buckets=range(1))
    util = [x for x in b if x.metric is Metric.GPU_UTIL]
    assert idle_phase_samples(util) == pytest.approx(60 * 0.33)
    # a steady job whose samples wander within 0.26 (the recorded 20 %-busy data-loader stall) has none
    steady = Bucket(POD, gpu(), Metric.GPU_UTIL, T0, T0 + W, 0.19 * 60, 60, 0.0, 0.26)
    assert idle_phase_samples([steady]) == 0.0
    # a bucket idle throughout counts whole
    idle = Bucket(POD, gpu(), Metric.GPU_UTIL, T0, T0 + W, 0.0, 60, 0.0, 0.01)
    assert idle_phase_samples([idle]) == 60


def test_idle_phases_survive_merge_copy_and_the_stored_state():
    agg = JobAggregate()
    agg.fold(square_wave(0.67), {})
    (row,) = agg.rows.values()
    st = row.stats[Metric.GPU_UTIL]
    assert st.low == pytest.approx(12 * 60 * 0.33)
    assert row.stats[Metric.SM_ACTIVE].low == 0.0  # only the busy signals are read for phases
    assert Stat.from_json(st.to_json()) == st and st.copy() == st
    again = JobAggregate.from_json(agg.to_json())
    assert next(iter(again.rows.values())).stats[Metric.GPU_UTIL].low == st.low


@pytest.mark.parametrize("within", [True, False], ids=["inside-buckets", "bucket-to-bucket"])
def test_checkpoint_stalls_are_underutilized_periodic_stall_not_healthy(within):
    """The issue's case: a healthy bf16 training stopping every ~30 s for ~10 s reads utilization
    ~67 %, SM ~0.59 and was called healthy beside a waste of ~40 %."""
    s = summarize(square_wave(0.67, within=within), interval=5.0)
    assert s["gpu_util"] == pytest.approx(0.67, abs=0.01)
    assert s["verdict"] == "underutilized"
    first = s["findings"][0]
    assert first["evidence"]["reason"] == "periodic_stall"
    assert first["evidence"]["idle_phase_share"] == pytest.approx(0.33, abs=0.01)
    share = first["evidence"]["idle_phase_share"]
    assert "asynchronous checkpointing" in first["message"] and f"about {share * 100:.1f} %" in first["message"]


def test_short_gaps_between_steps_are_not_periodic():
    """A data-loader stall: utilization 0.5 in every sample, no swing → input_stall."""
    vals = {Metric.GPU_UTIL: 0.5, Metric.SM_ACTIVE: 0.45, Metric.TENSOR_ACTIVE: 0.2, Metric.DRAM_ACTIVE: 0.1}
    s = summarize(series(vals))
    assert s["verdict"] == "underutilized" and s["findings"][0]["evidence"]["reason"] == "input_stall"


def test_a_healthy_jobs_waste_is_bounded():
    # busy 0.70, SM 0.58: a waste of 42 % is not healthy (the recorded batch-4 SDPA training)
    v, f = classify(ev(busy=0.70, sm=0.58, tensor=0.27), TH)
    assert v is V.UNDERUTILIZED and f[0].evidence["reason"] == "input_stall"
    # busy, but the SMs only 60 % used while busy: low_sm_efficiency, with the bound quoted
    v, f = classify(ev(busy=0.99, sm=0.60), TH)
    assert v is V.LOW_SM_EFFICIENCY and f[0].evidence["healthy_max_waste"] == 0.35
    # at the bound: healthy
    assert classify(ev(busy=0.9, sm=0.66), TH)[0] is V.HEALTHY
    for sm in (0.65, 0.8, 0.95):
        v, _ = classify(ev(sm=sm), TH)
        assert v is V.HEALTHY and 1 - sm <= TH.healthy_max_waste + 1e-9


def test_host_offload_needs_pcie_both_ways():
    offload = dict(busy=0.08, sm=0.06, tensor=0.03, pcie_rx=1.1e9, pcie_tx=0.9e9)
    v, f = classify(ev(**offload), TH)
    assert v is V.UNDERUTILIZED and f[0].evidence["reason"] == "host_offload"
    assert "0.9 GB/s" in f[0].message and "1.1 GB/s" in f[0].message and "optimizer" in f[0].message
    assert "CUDA Graphs" not in f[0].message
    # one way only (a data loader pushing batches in): not offload
    v, f = classify(ev(**{**offload, "pcie_tx": 2e7}), TH)
    assert f[0].evidence["reason"] == "input_stall"


def test_a_server_idle_between_requests_gets_serving_advice():
    v, f = classify(ev(busy=0.07, sm=0.02, tensor=0.01, serving=True), TH)
    assert v is V.UNDERUTILIZED and f[0].evidence["reason"] == "serving"
    assert "batch" in f[0].message and "MIG" in f[0].message and "CUDA Graphs" not in f[0].message
    # a Deployment is a server without any class
    vals = {Metric.GPU_UTIL: 0.07, Metric.SM_ACTIVE: 0.02, Metric.TENSOR_ACTIVE: 0.01, Metric.DRAM_ACTIVE: 0.01}
    dep = replace(JOB, kind="Deployment")
    got = summarize_job(dep, series(vals), window=WINDOW, now=NOW, interval=15.0)
    assert got.findings[0].evidence["reason"] == "serving"


def test_one_warp_per_sm_is_low_occupancy_not_no_tensor_cores():
    """SM activity 99.6 %, occupancy 1.6 %, FP32 pipe 9 %: latency-bound, far too few warps."""
    v, f = classify(ev(sm=0.996, occupancy=0.016, tensor=0.0, fp32=0.09, dram=0.01), TH)
    assert v is V.LOW_SM_EFFICIENCY and f[0].evidence["reason"] == "low_occupancy"
    assert "warps" in f[0].message and "bf16" not in f[0].message
    # an FP32 product without TF32 keeps its FP32 pipe busy at the same occupancy as a GEMM: no_tensor_cores
    assert classify(ev(sm=0.97, occupancy=0.14, tensor=0.0, fp32=0.73, dram=0.08), TH)[0] is V.NO_TENSOR_CORES
    # a GEMM's big tiles keep few warps too, on the tensor cores: healthy
    assert classify(ev(sm=0.95, occupancy=0.14, tensor=0.92), TH)[0] is V.HEALTHY
    # gathers with no math pipe: memory_bound, whatever the occupancy
    assert classify(ev(sm=0.99, occupancy=0.1, tensor=0.0, fp32=0.01, dram=0.2), TH)[0] is V.MEMORY_BOUND


def test_straggler_is_the_headline():
    slow = (RankLoad("train-0 n1:gpu1", 0.35, 0.30),)
    waiting = (RankLoad("train-0 n1:gpu0", 0.98, 0.05),)
    v, f = classify(ev(busy=0.66, sm=0.17, straggler=Straggler(slow, waiting)), TH)
    assert v is V.UNDERUTILIZED and f[0].evidence["reason"] == "straggler"
    assert f[0].message.index("gpu1") < f[0].message.index("gpu0")  # the slow rank first
    assert "CUDA Graphs" not in f[0].message


def test_two_gpu_ddp_with_a_slow_rank():
    """Rank 0 spins in the all-reduce (busy, few SMs), rank 1 is slowed: pooled it reads
    launch-bound; the headline must be rank 1."""
    waiting = {Metric.GPU_UTIL: 0.95, Metric.SM_ACTIVE: 0.06, Metric.TENSOR_ACTIVE: 0.02, Metric.DRAM_ACTIVE: 0.02}
    slow = {Metric.GPU_UTIL: 0.40, Metric.SM_ACTIVE: 0.30, Metric.TENSOR_ACTIVE: 0.15, Metric.DRAM_ACTIVE: 0.1}
    s = summarize(series(waiting, g=gpu(0)) + series(slow, g=gpu(1)))
    first = s["findings"][0]
    assert s["verdict"] == "underutilized" and first["evidence"]["reason"] == "straggler"
    assert first["evidence"]["slow"][0]["gpu"].endswith("gpu1")
    assert "collective_wait_straggler" in [f["code"] for f in s["findings"][1:]]


def test_mig_estimate_is_relative_to_the_slice():
    """A 1g slice whose counters (relative to the slice) read tensor 0.6 at 1980 of 1980 MHz: the
    estimate is 0.6 x 0.97 of what the slice can do, and the finding says so."""
    vals = dict(BUSY, **{Metric.SM_CLOCK: 1980.0})
    vals.pop(Metric.POWER)
    vals[Metric.GR_ENGINE_ACTIVE] = vals.pop(Metric.GPU_UTIL)
    vals[Metric.TENSOR_ACTIVE] = 0.6
    s = summarize(series(vals, g=gpu(instance="3", profile="1g.18gb")))
    assert s["mfu_estimate"] == pytest.approx(0.6 * 0.97)
    f = next(f for f in s["findings"] if f["code"] == "mfu_estimate")
    assert "MIG slice" in f["evidence"]["relative_to"]
