"""``gpu-auditor doctor`` against a real Prometheus: what it finds and what it tells the user to fix.

Each test's series carry a unique ``case`` label and ``doctor --match case=...`` looks only at
them; the data ends a few minutes before now so it sits inside doctor's one-hour look-back.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from auditor import traces
from auditor.cli.main import main
from auditor.core.metrics import Metric
from auditor.core.model import PodRef


def _om(series: list[tuple[str, dict[str, str], list[tuple[int, float]]]]) -> str:
    """OpenMetrics text for promtool backfill, one family per metric name."""
    families: dict[str, list[str]] = {}
    for name, labels, samples in series:
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        families.setdefault(name, []).extend(f"{name}{{{lab}}} {v!r} {t}" for t, v in samples)
    out = [line for name, lines in families.items() for line in (f"# TYPE {name} gauge", *lines)]
    return "\n".join(out + ["# EOF"]) + "\n"


def _const(start: int, end: int, value: float) -> list[tuple[int, float]]:
    return [(t, value) for t in range(start, end, 15)]


def _gpu(case: str, n: int, **extra: str) -> dict[str, str]:
    return {
        "case": case,
        "gpu": str(n),
        "UUID": f"GPU-{case}-{n}",
        "Hostname": f"{case}-node",
        "modelName": "NVIDIA H200",
        **extra,
    }


pytestmark = pytest.mark.testbed


def _recent() -> tuple[int, int]:
    end = int(time.time()) // 60 * 60 - 300
    return end - 1800, end


def _doctor(prometheus, case: str, capsys, *extra: str) -> tuple[int, dict[str, dict]]:
    rc = main(["doctor", "--prometheus", prometheus.url, "--match", f"case={case}", "--output", "json", *extra])
    checks = json.loads(capsys.readouterr().out)
    by_name: dict[str, dict] = {}
    for c in checks:
        by_name.setdefault(c["name"], c)
    return rc, by_name


#: the set-ups per Prometheus URL: backfill once however the fixture is scoped
_BACKFILLED: dict[str, dict[str, str]] = {}


@pytest.fixture
def cases(prometheus) -> dict[str, str]:
    """Three telemetry set-ups, backfilled in one go."""
    if prometheus.url not in _BACKFILLED:
        _BACKFILLED[prometheus.url] = _backfill_cases(prometheus)
    return _BACKFILLED[prometheus.url]


def _backfill_cases(prometheus) -> dict[str, str]:
    s, e = _recent()
    good, no_sm, exported, v49 = (f"d{uuid.uuid4().hex[:8]}" for _ in range(4))
    series = []
    # healthy chain: classic names, pod labels, profiling on, one idle GPU without a pod
    for i in range(3):
        extra = {"pod": f"train-{i}", "namespace": "ml"} if i < 2 else {}
        labels = _gpu(good, i, **extra)
        for name, v in (
            ("DCGM_FI_DEV_GPU_UTIL", 100),
            ("DCGM_FI_PROF_SM_ACTIVE", 0.5),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.3),
            ("DCGM_FI_PROF_DRAM_ACTIVE", 0.2),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0),
            ("DCGM_FI_DEV_POWER_USAGE", 400),
        ):
            series.append((name, labels, _const(s, e, v)))
    series.append(
        ("kube_pod_owner", {"case": good, "namespace": "ml", "pod": "train-0", "owner_kind": "Job"}, _const(s, e, 1))
    )
    # the shipped CSV: no SM activity, DCGM 4.6 names
    labels = _gpu(no_sm, 0, pod="p", namespace="ns")
    series.append(("DCGM_FI_DEV_GPU_UTIL_RATIO", labels, _const(s, e, 90)))
    series.append(("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", labels, _const(s, e, 0.9)))
    series.append(("DCGM_FI_PROF_TENSOR_UTIL_RATIO", labels, _const(s, e, 0.1)))
    # dcgm-exporter 4.9's defaults (DCGM 4.7 names): utilization a ratio, clocks in hertz
    labels = _gpu(v49, 0, pod="p", namespace="ns")
    series.append(("DCGM_FI_DEV_GPU_UTIL_RATIO", labels, _const(s, e, 0.9)))
    series.append(("DCGM_FI_DEV_SM_CLOCK_HERTZ", labels, _const(s, e, 1.98e9)))
    series.append(("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", labels, _const(s, e, 0.9)))
    text = _om(series).replace("# EOF\n", "")
    # honorLabels false, through the trace tools (one node lacks SM activity)
    trace = traces.load_trace("h200-microbench")
    jobs = [
        traces.TraceJob(PodRef("team-a", "spin"), traces.make_gpus(1, f"{exported}-n0"), "one_sm_spin"),
        traces.TraceJob(
            PodRef("team-a", "mm"),
            traces.make_gpus(1, f"{exported}-n1"),
            "bf16_matmul",
            exclude=frozenset({Metric.SM_ACTIVE}),
        ),
    ]
    om = traces.trace_to_openmetrics(
        trace,
        jobs,
        end=datetime.fromtimestamp(e, timezone.utc),
        duration=timedelta(minutes=30),
        interval=timedelta(seconds=15),
        convention="exported_pod",
        hostname_label="hostname",
    )
    om = om.replace("{", f'{{case="{exported}",')
    prometheus.backfill(text + om)
    return {"good": good, "no_sm": no_sm, "exported": exported, "v49": v49}


def test_healthy_chain_passes(prometheus, cases, capsys):
    rc, checks = _doctor(prometheus, cases["good"], capsys)
    assert rc == 0
    assert checks["Prometheus reachable"]["status"] == "ok"
    assert checks["profiling: SM activity"]["status"] == "ok"
    assert checks["label convention"]["status"] == "ok"
    assert "2 of 3 GPUs (67%)" in checks["pod attribution"]["detail"]
    assert checks["kube-state-metrics"]["status"] == "ok"
    assert "classic names" in checks["DCGM series present"]["detail"]


def test_exporter_4_9_naming_is_named_and_its_fix_uses_its_names(prometheus, cases, capsys):
    rc, checks = _doctor(prometheus, cases["v49"], capsys)
    assert "dcgm-exporter 4.9" in checks["DCGM series present"]["detail"]
    assert "DCGM_FI_DEV_SM_CLOCK_HERTZ" in checks["DCGM series present"]["detail"]
    assert "DCGM_FI_PROF_SM_UTIL_RATIO," in checks["profiling: SM activity"]["fix"]
    assert checks["busy signal (GPU_UTIL or GR_ENGINE_ACTIVE)"]["status"] == "ok"
    assert "GPU utilization unit" not in checks


def test_missing_sm_activity_fails_with_the_csv_fix(prometheus, cases, capsys):
    rc, checks = _doctor(prometheus, cases["no_sm"], capsys)
    assert rc == 1
    sm = checks["profiling: SM activity"]
    assert sm["status"] == "fail" and sm["failed"]
    # spelled as the exporter in use spells its fields (DCGM 4.6 names here)
    assert "DCGM_FI_PROF_SM_UTIL_RATIO," in sm["fix"] and "counters CSV" in sm["fix"]
    assert "DCGM 4.6" in checks["DCGM series present"]["detail"]
    assert checks["busy signal (GPU_UTIL or GR_ENGINE_ACTIVE)"]["status"] == "ok"
    assert checks["kube-state-metrics"]["status"] == "warn"


def test_exported_pod_convention_gets_honor_labels_advice(prometheus, cases, capsys):
    rc, checks = _doctor(prometheus, cases["exported"], capsys)
    conv = checks["label convention"]
    assert conv["status"] == "warn" and "honorLabels: true" in conv["fix"]
    sm = checks["profiling: SM activity"]
    assert sm["status"] == "warn" and f"{cases['exported']}-n1" in sm["detail"]
    assert rc == 0  # present on some nodes: advice, not a failure
    assert "2 of 2 GPUs" in checks["pod attribution"]["detail"]


def test_no_dcgm_series_fails(prometheus, capsys):
    rc, checks = _doctor(prometheus, "no-such-case", capsys)
    assert rc == 1
    assert checks["DCGM series present"]["status"] == "fail"


def test_unreachable_prometheus_fails(capsys):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc = main(["doctor", "--prometheus", f"http://127.0.0.1:{port}", "--prometheus-retries", "0"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "[FAIL] Prometheus reachable" in out and f"127.0.0.1:{port}" in out


def test_text_checklist(prometheus, cases, capsys):
    rc = main(["doctor", "--prometheus", prometheus.url, "--match", f"case={cases['no_sm']}"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "[FAIL] profiling: SM activity" in out
    assert "fix: add to dcgm-exporter's counters CSV" in out
    assert out.rstrip().endswith("1 required check(s) failed: profiling: SM activity")
