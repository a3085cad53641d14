"""Every phase of both shipped H200 traces, replayed as its own job through the replay source
and the engine (the same bucketing as a Prometheus fetch), gets the verdict the traces' README
gives — with all series, without the FP32-pipe series, and (for the SM-based verdicts) an
honest insufficient_data without SM activity."""

import json
from datetime import datetime, timedelta, timezone
from importlib import resources

import pytest
from workload_verdicts import REASONS, WORKLOADS

from auditor.core.metrics import Metric
from auditor.core.model import PodRef, Window
from auditor.correlate import NoKubeResolver
from auditor.engine import run_audit
from auditor.sources.replay import ReplaySource
from auditor.traces import TraceJob, load_trace, make_gpus

END = datetime(2026, 11, 30, 12, 0, 7, tzinfo=timezone.utc)  # deliberately not bucket-aligned

MICRO = {
    "idle": "idle",
    "one_sm_spin": "low_sm_efficiency",
    "all_sm_spin": "no_tensor_cores",
    "memcpy_only": "memory_bound",
    "naive_softmax": "memory_bound",
    "bf16_matmul": "healthy",
    "tiny_kernels_gaps": "underutilized",
}
CLUSTER = {
    "resnet50_bf16_training": "healthy",
    "mlp_fp32_training_no_tf32": "no_tensor_cores",
    "llm_batched_inference_bf16": "healthy",
    "embedding_gather": "memory_bound",
    "kernel_spin_waiting_4_blocks": "low_sm_efficiency",
    "cpu_bound_preprocessing": "underutilized",
    "notebook_idle_model_loaded": "idle",
}
TRACES = [("h200-microbench", MICRO), ("h200-demo-cluster", CLUSTER), ("h200-workloads", WORKLOADS)]
ALL = set(Metric)
NO_FP32 = ALL - {Metric.FP32_ACTIVE}
NO_SM = ALL - {Metric.SM_ACTIVE}


def audit(trace_name: str, include, interval_s: int = 15) -> dict[str, dict]:
    trace = load_trace(trace_name)
    jobs = [TraceJob(PodRef("bench", p.replace("_", "-")), make_gpus(1, f"node-{p}"), p) for p in trace.phases()]
    src = ReplaySource(
        [(trace, jobs)], end=END, duration=timedelta(hours=1), interval=timedelta(seconds=interval_s), include=include
    )
    res = run_audit(src, NoKubeResolver(), None, Window(END - timedelta(hours=3), END), now=END)
    return {s.job.removeprefix("Pod/").replace("-", "_"): s.to_json() for s in res.summaries}


@pytest.mark.parametrize("trace_name, expected", TRACES)
@pytest.mark.parametrize("include", [ALL, NO_FP32], ids=["all-series", "without-fp32"])
def test_phase_verdicts(trace_name, expected, include):
    got = audit(trace_name, include)
    assert {k: v["verdict"] for k, v in got.items()} == expected
    trace = load_trace(trace_name)
    for phase, s in got.items():
        means = trace.steady_means(phase)
        for field, metric in (("gpu_util", Metric.GPU_UTIL), ("sm_active", Metric.SM_ACTIVE)):
            want, have = means[metric], s[field]
            assert abs(have - want) <= max(0.001, 0.05 * want), (phase, field, have, want)
        assert s["coverage"] == 1.0
        assert s["gpu_hours"] == pytest.approx(1.0, abs=0.01)
        if include is NO_FP32:
            assert s["fp32_active"] is None


def test_without_fp32_the_split_rests_on_dram():
    got = audit("h200-demo-cluster", NO_FP32)
    for phase in ("mlp_fp32_training_no_tf32", "embedding_gather"):
        codes = [f["code"] for f in got[phase]["findings"]]
        assert "fp32_pipe_missing" in codes
    reason = {p: got[p]["findings"][0]["evidence"]["reason"] for p in ("mlp_fp32_training_no_tf32", "embedding_gather")}
    assert reason == {"mlp_fp32_training_no_tf32": "dram_quiet", "embedding_gather": "dram_busy"}
    with_fp32 = audit("h200-demo-cluster", ALL)
    assert with_fp32["embedding_gather"]["findings"][0]["evidence"]["reason"] == "no_math_pipe"
    assert with_fp32["mlp_fp32_training_no_tf32"]["findings"][0]["evidence"]["reason"] == "math_pipe_busy"


@pytest.mark.parametrize("trace_name, expected", TRACES)
def test_without_sm_activity(trace_name, expected):
    got = audit(trace_name, NO_SM)
    for phase, s in got.items():
        assert s["sm_active"] is None and s["waste_gpu_hours"] is None
        # judged from GPU_UTIL alone when it is below busy_util; above it (an underutilized job
        # whose SMs show the waste, issue 28) the SM series is needed
        if expected[phase] in ("idle", "underutilized") and s["gpu_util"] < 0.6:
            assert s["verdict"] == expected[phase]
        else:
            assert s["verdict"] == "insufficient_data"
            assert s["findings"][0]["code"] == "metric_missing"


def test_demo_cluster_mfu_tracks_measured_mfu():
    got = audit("h200-demo-cluster", ALL)
    # truth.json: llm 0.379, resnet 0.108 measured by the workloads themselves
    assert got["llm_batched_inference_bf16"]["mfu_estimate"] == pytest.approx(0.379, abs=0.03)
    assert got["resnet50_bf16_training"]["mfu_estimate"] == pytest.approx(0.108, abs=0.03)


def test_30s_interval_gives_same_verdicts():
    got = audit("h200-microbench", ALL, interval_s=30)
    assert {k: v["verdict"] for k, v in got.items()} == MICRO


def test_workloads_reasons_and_advice():
    got = audit("h200-workloads", ALL)
    assert {p: got[p]["findings"][0]["evidence"].get("reason") for p in REASONS} == REASONS
    assert "FlashAttention" in got["transformer_materialized_bf16_s4096"]["findings"][0]["message"]
    headroom = [f for f in got["transformer_materialized_bf16_s1024"]["findings"] if f["code"] == "tensor_headroom"]
    assert headroom and headroom[0]["evidence"]["reason"] == "dram_busy" and "FlashAttention" in headroom[0]["message"]
    assert "input pipeline" in got["dataloader_stall_busy50"]["findings"][0]["message"]
    assert "CUDA Graphs" in got["tiny_kernels_launch_bound"]["findings"][0]["message"]


def test_copy_only_job_says_so_with_pcie_evidence():
    everything = audit("h200-workloads", ALL)
    got = everything["h2d_copy_pinned"]
    first, *rest = got["findings"]
    assert first["code"] == "low_sm_efficiency" and "thread blocks" not in first["message"]
    copy = next(f for f in rest if f["code"] == "copy_only")
    assert copy["evidence"]["pcie_rx_bytes_per_s"] > 50e9  # pinned 1 GiB copies: ~55 GB/s of payload
    assert "transfer-bound" in copy["message"]
    assert got["pcie_rx_bytes_per_s"] == pytest.approx(copy["evidence"]["pcie_rx_bytes_per_s"], rel=1e-6)
    assert got["pcie_tx_bytes_per_s"] > 0
    # a job that runs kernels is never called copy-only, whatever its PCIe traffic
    assert all(
        "copy_only" not in [f["code"] for f in s["findings"]] for p, s in everything.items() if p != "h2d_copy_pinned"
    )


def test_pcie_means_are_null_when_absent():
    got = audit("h200-microbench", ALL)  # recorded without the PCIe counters
    assert all(s["pcie_rx_bytes_per_s"] is None and s["pcie_tx_bytes_per_s"] is None for s in got.values())
    no_pcie = audit("h200-workloads", ALL - {Metric.PCIE_RX, Metric.PCIE_TX})["h2d_copy_pinned"]
    copy = next(f for f in no_pcie["findings"] if f["code"] == "copy_only")
    assert copy["evidence"]["pcie_rx_bytes_per_s"] is None and "not exported" in copy["message"]


#: precisions whose estimate must be within 0.02 of measured MFU (issue 15 asked 0.06, issue 28 0.03);
#: TF32 is measured apart
PRECISE = ("bf16", "fp8")


def test_workloads_mfu_estimate_tracks_measured_mfu():
    got = audit("h200-workloads", ALL)
    truth = json.loads(resources.files("auditor").joinpath("data", "h200-workloads.truth.json").read_text())
    checked = 0
    for phase, w in truth["workloads"].items():
        if "mfu" not in w or phase not in got:
            continue
        err = got[phase]["mfu_estimate"] - w["mfu"]
        if w["precision"] in PRECISE:
            assert abs(err) <= 0.02, (phase, got[phase]["mfu_estimate"], w["mfu"])  # issue 28: ±0.03 asked
            checked += 1
    assert checked >= 19
    # TF32: a plain matmul runs at its nominal TF32 peak per active tensor cycle (error -0.003 with
    # the 0.97 per-cycle rate of issue 28), the TF32 transformer does not (estimate 0.36 against
    # 0.23 measured): docs/verdicts.md
    assert got["tf32_matmul"]["mfu_estimate"] - truth["workloads"]["tf32_matmul"]["mfu"] == pytest.approx(0.0, abs=0.01)
    tf32 = got["transformer_sdpa_tf32_s1024"]["mfu_estimate"] - truth["workloads"]["transformer_sdpa_tf32_s1024"]["mfu"]
    assert tf32 == pytest.approx(0.124, abs=0.02)
