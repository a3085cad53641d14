"""The verdict table, one row per rule, in DESIGN.md's order (first match wins)."""

import pytest

from auditor.core.metrics import Metric
from auditor.core.model import Verdict
from auditor.core.thresholds import Thresholds
from auditor.core.verdicts import Evidence, classify

V = Verdict


def ev(**kw) -> Evidence:
    base = dict(
        busy=1.0,
        busy_metric=Metric.GPU_UTIL,
        sm=0.9,
        tensor=0.4,
        dram=0.3,
        fp32=0.05,
        fp16=0.0,
        power=600.0,
        samples=240,
        span_s=3600.0,
        coverage=1.0,
        shared_fraction=0.0,
        model="NVIDIA H200",
    )
    base.update(kw)
    return Evidence(**base)


CASES = [
    # name, evidence overrides, verdict, first finding code
    ("healthy", {}, V.HEALTHY, "healthy"),
    ("no busy signal", dict(busy=None, busy_metric=None), V.INSUFFICIENT_DATA, "metric_missing"),
    ("too few samples", dict(samples=3), V.INSUFFICIENT_DATA, "too_short"),
    ("too short", dict(span_s=30.0), V.INSUFFICIENT_DATA, "too_short"),
    ("low coverage", dict(coverage=0.5), V.INSUFFICIENT_DATA, "low_coverage"),
    ("coverage unknown is not low", dict(coverage=None), V.HEALTHY, "healthy"),
    ("mostly shared GPU", dict(shared_fraction=0.9), V.INSUFFICIENT_DATA, "gpu_shared_unjudged"),
    ("silent zero", dict(sm=0.0, silent_zero=[{"gpu": "GPU-1"}]), V.INSUFFICIENT_DATA, "profiling_zero_suspect"),
    ("idle", dict(busy=0.0, sm=0.0, tensor=0.0), V.IDLE, "idle"),
    ("idle without SM series", dict(busy=0.01, sm=None), V.IDLE, "idle"),
    ("idle on MIG", dict(busy=0.0, busy_metric=Metric.GR_ENGINE_ACTIVE), V.IDLE, "idle"),
    ("underutilized", dict(busy=0.32, sm=0.0024), V.UNDERUTILIZED, "underutilized"),
    ("underutilized without SM", dict(busy=0.12, sm=None), V.UNDERUTILIZED, "underutilized"),
    ("busy without SM series", dict(sm=None), V.INSUFFICIENT_DATA, "metric_missing"),
    ("one SM of 132", dict(sm=0.0076, tensor=0.0, dram=0.0), V.LOW_SM_EFFICIENCY, "low_sm_efficiency"),
    # issue 15: low SM activity explained by idle time (SMs well used while busy) is underutilized
    ("idle 35 %, SMs well used while busy", dict(busy=0.65, sm=0.48), V.UNDERUTILIZED, "underutilized"),
    ("busy, SMs half used while busy", dict(busy=0.95, sm=0.45), V.LOW_SM_EFFICIENCY, "low_sm_efficiency"),
    (
        "copies only: no kernel",
        dict(sm=0.0, tensor=0.0, dram=0.01, fp32=0.0, gr_engine=0.0001, power=129.0),
        V.LOW_SM_EFFICIENCY,
        "low_sm_efficiency",
    ),
    # single-digit tensor activity with busy DRAM: never healthy
    ("materialised attention", dict(tensor=0.078, dram=0.67, fp32=0.037), V.MEMORY_BOUND, "memory_bound"),
    ("tensor 8 %, FP32 busy", dict(tensor=0.08, dram=0.1, fp32=0.3), V.NO_TENSOR_CORES, "no_tensor_cores"),
    ("real low SM at idle power is not suspect", dict(sm=0.03, power=124.0), V.LOW_SM_EFFICIENCY, "low_sm_efficiency"),
    ("no tensor series", dict(tensor=None), V.INSUFFICIENT_DATA, "metric_missing"),
    ("memcpy: DRAM busy", dict(tensor=0.0, dram=0.89, fp32=0.0), V.MEMORY_BOUND, "memory_bound"),
    ("gather: no pipe doing math", dict(tensor=0.005, dram=0.2, fp32=0.014), V.MEMORY_BOUND, "memory_bound"),
    ("softmax: fp32 a bit busy but DRAM busy", dict(tensor=0.0, dram=0.68, fp32=0.064), V.MEMORY_BOUND, "memory_bound"),
    ("mlp fp32", dict(tensor=0.0, dram=0.077, fp32=0.73), V.NO_TENSOR_CORES, "no_tensor_cores"),
    ("all-SM spin: fp32 pipe busy", dict(tensor=0.0, dram=0.0, fp32=0.1165), V.NO_TENSOR_CORES, "no_tensor_cores"),
    ("fp16 on CUDA cores", dict(tensor=0.0, dram=0.05, fp32=0.01, fp16=0.5), V.NO_TENSOR_CORES, "no_tensor_cores"),
    ("no FP32 series, DRAM quiet", dict(tensor=0.0, dram=0.077, fp32=None), V.NO_TENSOR_CORES, "no_tensor_cores"),
    ("no FP32 series, DRAM busy", dict(tensor=0.0, dram=0.39, fp32=None), V.MEMORY_BOUND, "memory_bound"),
    (
        "FP16 alone does not stand in for FP32",
        dict(tensor=0.0, dram=0.0, fp32=None, fp16=0.0),
        V.NO_TENSOR_CORES,
        "no_tensor_cores",
    ),
    ("tensor idle, no DRAM nor FP32", dict(tensor=0.0, dram=None, fp32=None), V.INSUFFICIENT_DATA, "metric_missing"),
    ("no DRAM series but FP32 busy", dict(tensor=0.0, dram=None, fp32=0.7), V.NO_TENSOR_CORES, "no_tensor_cores"),
]


@pytest.mark.parametrize("name, overrides, verdict, code", CASES, ids=[c[0] for c in CASES])
def test_verdict_table(name, overrides, verdict, code):
    got, findings = classify(ev(**overrides), Thresholds())
    assert got is verdict
    assert findings[0].code == code
    assert findings[0].message  # plain-language


@pytest.mark.parametrize(
    "verdict_overrides, words",
    [
        (dict(tensor=0.0, dram=0.89, fp32=0.0), ["fus", "FlashAttention"]),
        (dict(tensor=0.0, dram=0.077, fp32=0.73), ["bf16", "TF32"]),
        (dict(busy=0.3), ["input pipeline", "batch size"]),
        (dict(sm=0.03), ["thread blocks", "batch", "collective"]),
    ],
)
def test_findings_carry_advice(verdict_overrides, words):
    _, findings = classify(ev(**verdict_overrides), Thresholds())
    for w in words:
        assert w in findings[0].message


def test_fp32_missing_is_said():
    _, findings = classify(ev(tensor=0.0, dram=0.39, fp32=None), Thresholds())
    assert [f.code for f in findings] == ["memory_bound", "fp32_pipe_missing"]


def test_healthy_with_tensor_headroom():
    v, findings = classify(ev(tensor=0.127), Thresholds())
    assert v is V.HEALTHY and [f.code for f in findings] == ["healthy", "tensor_headroom"]


def test_thresholds_are_used():
    assert classify(ev(sm=0.45), Thresholds())[0] is V.LOW_SM_EFFICIENCY
    assert classify(ev(sm=0.45), Thresholds(low_sm=0.4))[0] is V.LOW_SM_EFFICIENCY  # waste 55 % > 35 %
    assert classify(ev(sm=0.45), Thresholds(low_sm=0.4, healthy_max_waste=0.6))[0] is V.HEALTHY


def test_low_sm_advice_follows_the_evidence():
    th = Thresholds()
    _, few = classify(ev(sm=0.03, gr_engine=1.0), th)
    assert few[0].evidence["reason"] == "few_blocks" and "thread blocks" in few[0].message
    _, stall = classify(ev(busy=0.65, sm=0.48), th)
    assert stall[0].evidence["reason"] == "input_stall" and "input pipeline" in stall[0].message
    _, launch = classify(ev(busy=0.3, sm=0.003), th)
    assert launch[0].evidence["reason"] == "launch_bound" and "CUDA Graphs" in launch[0].message
    v, copy = classify(ev(sm=0.0, tensor=0.0, gr_engine=0.0, pcie_rx=59e9, pcie_tx=3.5e9, power=129.0), th)
    assert [f.code for f in copy] == ["low_sm_efficiency", "copy_only"]
    assert copy[0].evidence["reason"] == "no_kernel" and "thread blocks" not in copy[0].message
    assert "transfer-bound" in copy[1].message and copy[1].evidence["pcie_rx_bytes_per_s"] == 59e9
    # on MIG the graphics engine is the busy signal itself: never read as "no kernel"
    v, mig = classify(ev(busy=0.9, busy_metric=Metric.GR_ENGINE_ACTIVE, sm=0.0076, gr_engine=0.9), th)
    assert mig[0].evidence["reason"] == "few_blocks"
