"""Trace CSV → steady state → dcgm-exporter OpenMetrics / raw samples."""

import re
from datetime import datetime, timedelta, timezone

import pytest

from auditor.core.metrics import Metric
from auditor.core.model import GpuId, PodRef
from auditor.errors import BadInput
from auditor.traces import TraceJob, load_trace, make_gpus, parse_trace, trace_samples, trace_to_openmetrics

END = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
POD = PodRef("team-a", "spin-0", "main")


def test_bundled_traces_load_with_their_columns():
    micro = load_trace("h200-microbench")
    assert micro.phases() == [
        "idle",
        "one_sm_spin",
        "all_sm_spin",
        "memcpy_only",
        "bf16_matmul",
        "tiny_kernels_gaps",
        "naive_softmax",
    ]
    assert Metric.POWER not in micro.metrics and Metric.SM_ACTIVE in micro.metrics
    cluster = load_trace("h200-demo-cluster")
    assert {Metric.POWER, Metric.FB_USED, Metric.SM_CLOCK} <= cluster.metrics
    assert "gap" not in cluster.phases() and "warmup" in cluster.phases(workloads_only=False)


def test_units_and_steady_state():
    micro = load_trace("h200-microbench")
    steady = micro.steady("one_sm_spin")
    assert len(steady) == 5  # six rows, the first straddles the phase change
    assert steady[0].values[Metric.GPU_UTIL] == 100.0  # GPU_UTIL stays a percent
    assert steady[0].values[Metric.SM_ACTIVE] == pytest.approx(0.0076)  # percent → ratio
    means = micro.steady_means("one_sm_spin")
    assert means[Metric.GPU_UTIL] == pytest.approx(1.0) and means[Metric.SM_ACTIVE] == pytest.approx(0.0076)


def test_fill_repeats_steady_state_in_order():
    micro = load_trace("h200-microbench")
    steady = micro.steady("memcpy_only")
    job = TraceJob(POD, make_gpus(1, "n1"), "memcpy_only")
    got = [
        s
        for s in trace_samples(micro, [job], end=END, duration=timedelta(seconds=20), interval=timedelta(seconds=1))
        if s.metric is Metric.DRAM_ACTIVE
    ]
    assert len(got) == 20
    assert [s.raw for s in got] == [steady[k % len(steady)].values[Metric.DRAM_ACTIVE] for k in range(20)]
    assert got[-1].t == END.timestamp() - 1 and got[0].t == END.timestamp() - 20


def test_openmetrics_pod_convention():
    micro = load_trace("h200-microbench")
    job = TraceJob(POD, make_gpus(2, "node-7"), "bf16_matmul")
    text = trace_to_openmetrics(micro, [job], end=END, duration=timedelta(minutes=1), interval=timedelta(seconds=15))
    assert text.endswith("# EOF\n")
    assert "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert labels["pod"] == "spin-0" and labels["namespace"] == "team-a" and labels["container"] == "main"
    assert labels["Hostname"] == "node-7" and labels["modelName"] == "NVIDIA H200" and labels["device"] == "nvidia0"
    assert labels["UUID"].startswith("GPU-") and labels["gpu"] == "0"
    value, ts = line.rsplit(" ", 2)[1:]
    assert value == "100" and float(ts) == END.timestamp() - 60
    # families are not interleaved
    names = [ln.split("{")[0] for ln in text.splitlines() if not ln.startswith("#")]
    runs = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert len(runs) == len(set(runs))
    assert sum(1 for ln in text.splitlines() if ln.startswith("DCGM_FI_PROF_SM_ACTIVE{")) == 2 * 4


def test_openmetrics_exported_convention_hostname_and_subset():
    micro = load_trace("h200-microbench")
    job = TraceJob(POD, make_gpus(1, "node-7"), "one_sm_spin")
    text = trace_to_openmetrics(
        micro,
        [job],
        end=END,
        duration=timedelta(minutes=1),
        interval=timedelta(seconds=30),
        convention="exported_pod",
        hostname_label="hostname",
        include={Metric.GPU_UTIL, Metric.TENSOR_ACTIVE},
    )
    line = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert labels["exported_pod"] == "spin-0" and labels["exported_namespace"] == "team-a"
    assert labels["pod"].startswith("nvidia-dcgm-exporter-") and labels["hostname"] == "node-7"
    assert "Hostname" not in labels
    assert "SM_ACTIVE" not in text and "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" in text


def test_dcgm46_names_and_mig():
    micro = load_trace("h200-microbench")
    mig = GpuId("GPU-x", instance="2", hostname="n", index="0", model="NVIDIA H200", mig_profile="1g.18gb")
    job = TraceJob(POD, (mig,), "bf16_matmul")
    text = trace_to_openmetrics(
        micro, [job], end=END, duration=timedelta(minutes=1), interval=timedelta(seconds=15), dcgm46_names=True
    )
    assert "DCGM_FI_PROF_SM_UTIL_RATIO{" in text and "DCGM_FI_PROF_SM_ACTIVE{" not in text
    assert "GPU_UTIL" not in text  # no GPU_UTIL on MIG
    assert 'GPU_I_ID="2"' in text and 'GPU_I_PROFILE="1g.18gb"' in text


def test_per_gpu_phases_and_exclude():
    cluster = load_trace("h200-demo-cluster")
    job = TraceJob(
        POD,
        make_gpus(2, "n"),
        "kernel_spin_waiting_4_blocks",
        gpu_phases=("kernel_spin_waiting_4_blocks", "cpu_bound_preprocessing"),
        exclude=frozenset({Metric.SM_ACTIVE}),
    )
    got = list(trace_samples(cluster, [job], end=END, duration=timedelta(minutes=1), interval=timedelta(seconds=15)))
    util = {s.gpu.index: s.raw for s in got if s.metric is Metric.GPU_UTIL}
    assert util["0"] == 100.0 and util["1"] < 50
    assert not any(s.metric is Metric.SM_ACTIVE for s in got)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("a,b\n1,2\n", "not a trace CSV"),
        ("t,phase,foo\n1,x,2\n", "no known metric columns"),
        ("t,phase,sm_active_pct\n1,x,abc\n", "line 2|:2: column sm_active_pct"),
        ("t,phase,sm_active_pct\nzz,x,1\n", "column t"),
    ],
)
def test_bad_csv(text, needle):
    with pytest.raises(BadInput, match=needle):
        parse_trace(text, name="bad.csv")


def test_bad_requests():
    micro = load_trace("h200-microbench")
    with pytest.raises(BadInput, match="no phase"):
        micro.steady("nope")
    with pytest.raises(BadInput, match="cannot read"):
        load_trace("/nonexistent/trace.csv")
    job = TraceJob(POD, make_gpus(1, "n"), "idle")
    with pytest.raises(BadInput, match="convention"):
        trace_to_openmetrics(
            micro, [job], end=END, duration=timedelta(minutes=1), interval=timedelta(seconds=15), convention="podz"
        )
    with pytest.raises(BadInput, match="shorter than one scrape interval"):
        list(trace_samples(micro, [job], end=END, duration=timedelta(seconds=5), interval=timedelta(seconds=15)))


def test_empty_cells_are_absent_not_zero():
    tr = parse_trace("t,phase,gpu_util_pct,sm_active_pct\n1,a,50,\n2,a,60,-\n3,a,70,NaN\n")
    assert all(Metric.SM_ACTIVE not in r.values for r in tr.rows)
