"""Issue 3's Done-when, end to end: real H200 traces → OpenMetrics → a real Prometheus →
``gpu-auditor audit --no-kube`` → the store → the verdicts the traces README gives.

All the data is backfilled once for the module (each Prometheus backfill may restart the server),
every data set under its own ``case`` label so the audits (``--match case=...``) see only it.
Each job replays a whole number of its phase's steady-state cycles, so the audited means must
match the trace's steady-state means (5 % relative or 0.001 absolute).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from workload_verdicts import REASONS, WORKLOADS

from auditor import traces
from auditor.cli.main import main
from auditor.core.metrics import Metric, Naming
from auditor.core.model import PodRef

pytestmark = pytest.mark.testbed

TRACES = Path("/work/shared/traces")
INTERVAL = timedelta(seconds=15)
TARGET = timedelta(minutes=30)

MICROBENCH_VERDICTS = {
    "idle": "idle",
    "one_sm_spin": "low_sm_efficiency",
    "all_sm_spin": "no_tensor_cores",
    "memcpy_only": "memory_bound",
    "naive_softmax": "memory_bound",
    "bf16_matmul": "healthy",
    "tiny_kernels_gaps": "underutilized",
}
DEMO_VERDICTS = {
    "resnet50_bf16_training": "healthy",
    "mlp_fp32_training_no_tf32": "no_tensor_cores",
    "llm_batched_inference_bf16": "healthy",
    "embedding_gather": "memory_bound",
    "kernel_spin_waiting_4_blocks": "low_sm_efficiency",
    "cpu_bound_preprocessing": "underutilized",
    "notebook_idle_model_loaded": "idle",
}


def _trace(name: str) -> traces.Trace:
    path = TRACES / f"{name}.csv"
    return traces.load_trace(path if path.exists() else name)


def _pod(phase: str) -> str:
    return phase.replace("_", "-")


def _whole_cycles(trace: traces.Trace, phase: str) -> timedelta:
    """The shortest duration >= TARGET holding a whole number of the phase's steady cycles."""
    cycle = len(trace.steady(phase)) * INTERVAL
    return cycle * math.ceil(TARGET / cycle)


def _tag(text: str, case: str) -> str:
    """Add ``case="..."`` to every sample line so each data set can be selected alone."""
    return re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M)


class DataSet:
    def __init__(self, trace: traces.Trace, case: str, end: datetime, start: datetime, phases: list[str]) -> None:
        self.trace, self.case, self.end, self.start, self.phases = trace, case, end, start, phases


def _build(
    trace: traces.Trace,
    end: datetime,
    *,
    convention: str,
    hostname: str,
    namespace: str,
    include: set[Metric] | None = None,
    dcgm46: bool = False,
    no_sm: tuple[str, ...] = (),
    naming: Naming | None = None,
) -> tuple[str, DataSet]:
    case = f"e2e{uuid.uuid4().hex[:10]}"
    phases = trace.phases()
    jobs = [
        traces.TraceJob(
            PodRef(namespace, _pod(p), "main"),
            traces.make_gpus(1, f"{case}-node-{i}"),
            p,
            duration=_whole_cycles(trace, p),
            exclude=frozenset({Metric.SM_ACTIVE}) if p in no_sm else frozenset(),
        )
        for i, p in enumerate(phases)
    ]
    longest = max(j.duration for j in jobs)
    text = traces.trace_to_openmetrics(
        trace,
        jobs,
        end=end,
        duration=longest,
        interval=INTERVAL,
        convention=convention,
        include=include,
        hostname_label=hostname,
        dcgm46_names=dcgm46,
        naming=naming,
    )
    start = end - longest
    start = datetime.fromtimestamp(start.timestamp() // 300 * 300, timezone.utc)
    return _tag(text, case), DataSet(trace, case, end, start, phases)


#: backfilled data sets per Prometheus URL: backfill once however the fixture is scoped
_BACKFILLED: dict[str, dict[str, DataSet]] = {}


@pytest.fixture
def data(prometheus) -> dict[str, DataSet]:
    """Every data set of this module, backfilled into the real Prometheus in one go."""
    if prometheus.url not in _BACKFILLED:
        _BACKFILLED[prometheus.url] = _backfill_all(prometheus)
    return _BACKFILLED[prometheus.url]


def _backfill_all(prometheus) -> dict[str, DataSet]:
    end = datetime.fromtimestamp(int(time.time()) // 300 * 300 - 2 * 3600, timezone.utc)
    micro, demo = _trace("h200-microbench"), _trace("h200-demo-cluster")
    work = traces.load_trace("h200-workloads")
    mfu = traces.load_trace("h200-mfu-workloads")
    everything = {
        "workloads": _build(work, end, convention="pod", hostname="Hostname", namespace="work"),
        "mfu-workloads": _build(mfu, end, convention="pod", hostname="Hostname", namespace="mfu"),
        "micro-pod": _build(micro, end, convention="pod", hostname="Hostname", namespace="bench"),
        "micro-exported": _build(micro, end, convention="exported_pod", hostname="hostname", namespace="bench"),
        "micro-ratio": _build(micro, end, convention="pod", hostname="hostname", namespace="bench", dcgm46=True),
        "demo": _build(demo, end, convention="pod", hostname="Hostname", namespace="demo"),
        "demo-exported": _build(demo, end, convention="exported_pod", hostname="hostname", namespace="demo"),
        # the same workloads as DCGM 4.6 and dcgm-exporter 4.9 name them (4.9: GPU_UTIL a ratio, clocks in Hz)
        "demo-4.6": _build(demo, end, convention="pod", hostname="hostname", namespace="demo", naming=Naming.DCGM46),
        "demo-4.9": _build(
            demo, end, convention="pod", hostname="hostname", namespace="demo", naming=Naming.EXPORTER49
        ),
        "demo-no-fp32": _build(
            demo,
            end,
            convention="pod",
            hostname="Hostname",
            namespace="demo",
            include=demo.metrics - {Metric.FP32_ACTIVE},
        ),
        "no-sm": _build(
            micro, end, convention="pod", hostname="Hostname", namespace="nosm", no_sm=("one_sm_spin", "idle")
        ),
    }
    prometheus.backfill("".join(t.replace("# EOF\n", "") for t, _ in everything.values()) + "# EOF\n")
    return {k: ds for k, (_, ds) in everything.items()}


def _audit(prometheus, ds: DataSet, db: str, capsys, *extra: str) -> list[dict]:
    rc = main(
        [
            "audit",
            "--prometheus",
            prometheus.url,
            "--no-kube",
            "--match",
            f"case={ds.case}",
            "--start",
            ds.start.isoformat(),
            "--end",
            ds.end.isoformat(),
            "--db",
            db,
            "--output",
            "json",
            *extra,
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def _close(actual: float | None, expected: float) -> bool:
    return actual is not None and (abs(actual - expected) <= 0.001 or abs(actual - expected) <= 0.05 * abs(expected))


def _check(ds: DataSet, summaries: list[dict], verdicts: dict[str, str]) -> None:
    by_pod = {s["job"]: s for s in summaries}
    assert set(by_pod) == {f"Pod/{_pod(p)}" for p in ds.phases}
    wrong = {}
    for phase in ds.phases:
        s = by_pod[f"Pod/{_pod(phase)}"]
        if s["verdict"] != verdicts[phase]:
            wrong[phase] = (s["verdict"], [f["code"] for f in s["findings"]])
        means = ds.trace.steady_means(phase)
        for key, metric in (("gpu_util", Metric.GPU_UTIL), ("sm_active", Metric.SM_ACTIVE)):
            assert _close(s[key], means[metric]), (phase, key, s[key], means[metric])
        assert s["coverage"] == pytest.approx(1.0, abs=0.02), (phase, s["coverage"])
    assert not wrong, wrong


@pytest.mark.parametrize("which", ["micro-pod", "micro-exported", "micro-ratio"])
def test_microbench_phases_get_readme_verdicts(prometheus, data, which, tmp_path, capsys):
    ds = data[which]
    summaries = _audit(prometheus, ds, f"sqlite:///{tmp_path}/a.db", capsys)
    _check(ds, summaries, MICROBENCH_VERDICTS)
    assert {s["namespace"] for s in summaries} == {"bench"}


@pytest.mark.parametrize("which", ["demo", "demo-exported", "demo-no-fp32", "demo-4.6", "demo-4.9"])
def test_demo_cluster_workloads_get_readme_verdicts(prometheus, data, which, tmp_path, capsys):
    ds = data[which]
    summaries = _audit(prometheus, ds, f"sqlite:///{tmp_path}/a.db", capsys)
    _check(ds, summaries, DEMO_VERDICTS)
    fp32 = {s["job"]: s.get("fp32_active") for s in summaries}
    if which == "demo-no-fp32":
        assert set(fp32.values()) == {None}  # absent, never 0
    else:
        assert fp32["Pod/mlp-fp32-training-no-tf32"] == pytest.approx(0.731, abs=0.02)


def test_recorded_workloads_get_their_verdicts_and_pcie_rates(prometheus, data, tmp_path, capsys):
    """Issue 15's workloads through the real Prometheus: each gets the verdict and reason its
    physics implies, and the PCIe rates come through DCGM_FI_PROF_PCIE_{RX,TX}_BYTES."""
    ds = data["workloads"]
    summaries = _audit(prometheus, ds, f"sqlite:///{tmp_path}/a.db", capsys)
    _check(ds, summaries, WORKLOADS)
    by_pod = {s["job"]: s for s in summaries}
    assert {p: by_pod[f"Pod/{_pod(p)}"]["findings"][0]["evidence"].get("reason") for p in REASONS} == REASONS
    copy = by_pod["Pod/h2d-copy-pinned"]
    assert "copy_only" in [f["code"] for f in copy["findings"]]
    means = ds.trace.steady_means("h2d_copy_pinned")
    assert _close(copy["pcie_rx_bytes_per_s"], means[Metric.PCIE_RX])
    assert _close(copy["pcie_tx_bytes_per_s"], means[Metric.PCIE_TX])


#: issue 28's recording through the real Prometheus with --no-kube: no class, no kind, so what the
#: buckets alone decide (the classes' verdicts: tests/audit/test_mfu_workloads.py)
MFU_NO_KUBE = {
    "idle": ("idle", None),
    "gpt_unfused_d1536_s2048": ("healthy", None),  # no reference without a class: never low_mfu
    "gpt_fused_d1536_s2048": ("healthy", None),
    "gpt_unfused_d2048_s1024": ("healthy", None),
    "gpt_fused_d2048_s1024": ("healthy", None),
    "gpt_unfused_d1024_s3072": ("memory_bound", "no_math_pipe"),
    "gpt_fused_d1024_s3072": ("healthy", None),
    "gpt_ckpt_sync_period20s": ("underutilized", "periodic_stall"),
    "gpt_ckpt_sync_period40s": ("underutilized", "periodic_stall"),
    "gpt_eval_stall_period24s": ("underutilized", "periodic_stall"),
    "gpt_zero_offload_cpu_adam": ("underutilized", "host_offload"),
    "llm_server_poisson_0p25rps": ("idle", None),
    "llm_server_poisson_1p0rps": ("underutilized", "launch_bound"),  # a bare Pod: not known as a server
    "fp32_one_warp_per_sm_ilp2": ("low_sm_efficiency", "low_occupancy"),
    "fp32_register_limited": ("low_sm_efficiency", "low_occupancy"),
    "convnext_tiny_bf16_autocast": ("memory_bound", "dram_busy"),
    "dlrm_embeddingbag_sparse_sgd": ("memory_bound", "no_math_pipe"),
    "unet_diffusion_bf16_autocast": ("healthy", None),
}


def test_mfu_workloads_idle_phases_and_advice_through_prometheus(prometheus, data, tmp_path, capsys):
    """Issue 28's workloads through the real Prometheus: the checkpoint stalls' square wave comes
    through min_over_time/max_over_time of each bucket (periodic_stall, idle phases 0.36 and 0.31),
    PCIe both ways through the PCIe counters (host_offload), occupancy (low_occupancy)."""
    ds = data["mfu-workloads"]
    summaries = _audit(prometheus, ds, f"sqlite:///{tmp_path}/a.db", capsys)
    _check(ds, summaries, {p: v for p, (v, _) in MFU_NO_KUBE.items()})
    by_pod = {s["job"].removeprefix("Pod/"): s for s in summaries}
    got = {p: (by_pod[_pod(p)]["verdict"], by_pod[_pod(p)]["findings"][0]["evidence"].get("reason")) for p in ds.phases}
    assert got == MFU_NO_KUBE
    for p, share in (
        ("gpt_ckpt_sync_period20s", 0.36),
        ("gpt_ckpt_sync_period40s", 0.31),
        ("gpt_eval_stall_period24s", 0.32),
    ):
        assert by_pod[_pod(p)]["findings"][0]["evidence"]["idle_phase_share"] == pytest.approx(share, abs=0.03)


def test_every_naming_audits_to_the_same_numbers(prometheus, data, tmp_path, capsys):
    """The demo workloads under classic, DCGM 4.6 and dcgm-exporter 4.9 names give the same
    verdicts, means and MFU estimates (which need the SM clock: hertz under 4.9)."""
    keys = ("verdict", "gpu_util", "sm_active", "tensor_active", "dram_active", "mfu_estimate", "gpu_hours")
    got = {}
    for which in ("demo", "demo-4.6", "demo-4.9"):
        rows = _audit(prometheus, data[which], f"sqlite:///{tmp_path}/{which}.db", capsys)
        got[which] = {s["job"]: tuple(round(s[k], 6) if isinstance(s[k], float) else s[k] for k in keys) for s in rows}
    assert got["demo"] == got["demo-4.6"] == got["demo-4.9"]
    assert any(v[5] is not None for v in got["demo-4.9"].values())  # an MFU estimate was made


def test_job_without_sm_series_is_insufficient_data(prometheus, data, tmp_path, capsys):
    ds = data["no-sm"]
    by_job = {s["job"]: s for s in _audit(prometheus, ds, f"sqlite:///{tmp_path}/a.db", capsys)}
    spin = by_job["Pod/one-sm-spin"]
    assert spin["verdict"] == "insufficient_data"
    assert spin["sm_active"] is None and spin["waste_gpu_hours"] is None
    # idle needs no SM activity: it is judged from GPU utilization alone
    assert by_job["Pod/idle"]["verdict"] == "idle" and by_job["Pod/idle"]["sm_active"] is None
    assert by_job["Pod/bf16-matmul"]["verdict"] == "healthy"


def _comparable(summaries: list[dict]) -> list[dict]:
    out = []
    for s in sorted(summaries, key=lambda s: (s["namespace"], s["job"])):
        s = dict(s)
        s.pop("computed_at", None)
        out.append(s)
    return out


def test_reaudit_is_idempotent_and_sqlite_equals_postgresql(prometheus, data, tmp_path, postgres_url, capsys):
    from auditor.store import Store

    ds = data["micro-pod"]
    sqlite = f"sqlite:///{tmp_path}/a.db"
    first = _audit(prometheus, ds, sqlite, capsys)
    again = _audit(prometheus, ds, sqlite, capsys)
    pg = _audit(prometheus, ds, postgres_url, capsys)
    assert _comparable(first) == _comparable(again) == _comparable(pg)

    stored = {}
    for url in (sqlite, postgres_url):
        store = Store.open(url)
        try:
            rows = store.summaries()
            assert len(rows) == len(ds.phases)  # one summary per job after two audits
            stored[url] = _comparable(rows)
            found = store.find_job("bench", "Pod", "one-sm-spin")
            assert found is not None
            per_metric = {}
            for b in store.buckets(found[0]):
                per_metric[b.metric] = per_metric.get(b.metric, 0) + 1
            assert set(per_metric.values()) == {len(set(b.start for b in store.buckets(found[0])))}
        finally:
            store.close()
    assert stored[sqlite] == stored[postgres_url]


def test_explain_shows_numbers_windows_and_picture(prometheus, data, tmp_path, capsys):
    ds = data["micro-pod"]
    db = f"sqlite:///{tmp_path}/a.db"
    _audit(prometheus, ds, db, capsys)
    png = tmp_path / "spin.png"
    assert main(["explain", "bench/Pod/one-sm-spin", "--db", db, "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "verdict: low_sm_efficiency" in out
    assert "SM active │" in out and "gpu util  │" in out
    assert "█" in out.split("gpu util  │")[1].splitlines()[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["explain", "bench/Pod/no-such-pod", "--db", db]) == 1
    assert main(["explain", "not-a-ref", "--db", db]) == 2


def test_audit_judges_with_the_configured_thresholds(prometheus, data, tmp_path, capsys, monkeypatch):
    """``audit`` takes the thresholds from the settings sources (``--config``, then
    ``GPU_AUDITOR_THRESHOLDS__*``): one spinning block (SM activity 0.0076) is low_sm_efficiency
    with the built-in low_sm 0.5 and memory_bound (no pipe does math) once low_sm is 0.005."""
    monkeypatch.delenv("GPU_AUDITOR_CONFIG", raising=False)
    ds = data["micro-pod"]
    cfg = tmp_path / "settings.yaml"
    cfg.write_text("thresholds: {low_sm: 0.005}\n")
    by_job = {s["job"]: s for s in _audit(prometheus, ds, f"sqlite:///{tmp_path}/a.db", capsys, "--config", str(cfg))}
    assert by_job["Pod/one-sm-spin"]["verdict"] == "memory_bound"
    assert by_job["Pod/bf16-matmul"]["verdict"] == "healthy"
    monkeypatch.setenv("GPU_AUDITOR_THRESHOLDS__LOW_SM", "0.5")  # the variable wins over the file
    by_job = {s["job"]: s for s in _audit(prometheus, ds, f"sqlite:///{tmp_path}/b.db", capsys, "--config", str(cfg))}
    assert by_job["Pod/one-sm-spin"]["verdict"] == "low_sm_efficiency"
    monkeypatch.setenv("GPU_AUDITOR_THRESHOLDS__LOW_SM", "50")
    rc = main(
        [
            "audit",
            "--prometheus",
            prometheus.url,
            "--no-kube",
            "--start",
            ds.start.isoformat(),
            "--end",
            ds.end.isoformat(),
            "--db",
            f"sqlite:///{tmp_path}/c.db",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "thresholds.low_sm (variable GPU_AUDITOR_THRESHOLDS__LOW_SM): 50 is out of range" in err, err


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "auditor.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def test_unreachable_prometheus_exits_1_naming_the_url(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    url = f"http://127.0.0.1:{port}"
    r = _cli(
        "audit",
        "--prometheus",
        url,
        "--no-kube",
        "--start",
        "now-1h",
        "--db",
        f"sqlite:///{tmp_path}/a.db",
        "--prometheus-retries",
        "0",
    )
    assert r.returncode == 1, r.stderr
    assert url in r.stderr and "unreachable" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--no-kube", "--start", "yesterday"], "--start"),
        (["--no-kube", "--start", "2026-11-30T09:00:00"], "UTC offset"),
        (["--no-kube", "--start", "now-1h", "--end", "now-2h"], "empty range"),
        (["--start", "now-1h", "--kubeconfig", "/nonexistent"], "cannot load the kubeconfig /nonexistent"),
        (["--start", "now-1h"], "--no-kube"),
        (["--no-kube", "--start", "now-1h", "--policies", "/nonexistent-policies"], "not a directory of policies"),
        (["--no-kube", "--start", "now-1h", "--bucket", "5x"], "--bucket"),
        (["--no-kube", "--start", "now-1h", "--match", "nolabel"], "--match"),
        (["--no-kube", "--start", "now-1h", "--output", "xml"], "invalid choice"),
        (["--no-kube"], "--start"),
    ],
)
def test_bad_flags_exit_2(tmp_path, args, message):
    r = _cli("audit", "--prometheus", "http://127.0.0.1:9", "--db", f"sqlite:///{tmp_path}/a.db", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
