"""The PrometheusRule's recording rules and alerts, checked and unit-tested by the real promtool.

`promtool test rules` evaluates the rendered rules over synthetic dcgm-exporter series: the
5-minute sum and count come out exact, the honorLabels=false form records the same
series as the honorLabels=true form, and the alerts fire on a low-SM pod but not on a healthy one
or on one whose SM activity reads exactly 0 (suspect telemetry).

The synthetic scrape interval is 19 s, not 15 s: Prometheus 2.x range selectors are closed on the
left, so a sample sitting exactly on a 5-minute boundary would be counted in two windows
(Prometheus 3 made ranges left-open). Real scrape timestamps carry a per-target offset and land on
a rule group's boundary only by coincidence; with 19 s no test sample does before 95 minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import yaml
from chartlib import FULL_VALUES, Chart, find

pytestmark = pytest.mark.testbed

GPU = 'container="c", modelName="NVIDIA H200", Hostname="node-1"'


def rule_groups(chart: Chart, convention: str, scrape: str = "15s") -> dict:
    objs = chart.render(
        sets=[
            "prometheusRule.enabled=true",
            f"prometheusRule.labelConvention={convention}",
            f"prometheusRule.scrapeInterval={scrape}",
        ]
    )
    (rule,) = find(objs, "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def series(convention: str, metric: str, ns: str, pod: str, uuid: str) -> str:
    if convention == "pod":
        return f'{metric}{{namespace="{ns}", pod="{pod}", UUID="{uuid}", {GPU}}}'
    # honorLabels false: the workload's labels are exported_*, pod/namespace name the exporter.
    return (
        f'{metric}{{exported_namespace="{ns}", exported_pod="{pod}", exported_container="c", '
        f'namespace="gpu-operator", pod="dcgm-exporter-x1", container="exporter", UUID="{uuid}", '
        f'modelName="NVIDIA H200", Hostname="node-1"}}'
    )


def test_promtool_check_rules(chart: Chart, testbed, tmp_path: Path):
    for conv in ("pod", "exported_pod"):
        f = tmp_path / f"rules-{conv}.yaml"
        f.write_text(yaml.safe_dump(rule_groups(chart, conv)))
        res = chart.run([str(testbed.promtool), "check", "rules", str(f)])
        assert "SUCCESS" in res.out, res.out + res.err


@pytest.mark.parametrize("convention", ["pod", "exported_pod"])
def test_promtool_unit_tests(chart: Chart, testbed, tmp_path: Path, convention: str):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(chart, convention, "19s")))
    n = "x380"  # 2 hours of 19 s samples
    pods = {  # pod: (GPU_UTIL %, SM_ACTIVE)
        "lowsm": ("100", "0.25"),
        "healthy": ("100", "0.75"),
        "silentzero": ("100", "0"),
        "idle": ("0", "0"),
    }
    inputs = []
    for i, (pod, (util, sm)) in enumerate(pods.items()):
        uuid = f"GPU-{i}"
        inputs.append(
            {"series": series(convention, "DCGM_FI_DEV_GPU_UTIL", "team-a", pod, uuid), "values": f"{util}+0{n}"}
        )
        inputs.append(
            {"series": series(convention, "DCGM_FI_PROF_SM_ACTIVE", "team-a", pod, uuid), "values": f"{sm}+0{n}"}
        )
    # A GPU whose exporter has no profiling counters: GPU_UTIL only.
    inputs.append(
        {"series": series(convention, "DCGM_FI_DEV_GPU_UTIL", "team-b", "noprof", "GPU-9"), "values": f"90+0{n}"}
    )
    # dcgm-exporter 4.9's names (GPU_UTIL a 0–1 ratio, clocks in Hz): read like the classic ones.
    for name, v in (
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", "1"),
        ("DCGM_FI_PROF_SM_UTIL_RATIO", "0.25"),
        ("DCGM_FI_DEV_SM_CLOCK_HERTZ", "1980000000"),
    ):
        inputs.append({"series": series(convention, name, "team-d", "lowsm49", "GPU-7"), "values": f"{v}+0{n}"})
    # DCGM 4.6 names without a 4.9-only one: GPU_UTIL_RATIO may be a percent (4.6) or a ratio
    # (4.9), so it is not recorded; the profiling ratios are.
    for name, v in (("DCGM_FI_DEV_GPU_UTIL_RATIO", "80"), ("DCGM_FI_PROF_SM_UTIL_RATIO", "0.5")):
        inputs.append({"series": series(convention, name, "team-d", "ratio46", "GPU-6"), "values": f"{v}+0{n}"})
    # A garbage GPU_UTIL reading (DCGM #199) is clamped to 100 % before summing.
    inputs.append(
        {
            "series": series(convention, "DCGM_FI_DEV_GPU_UTIL", "team-c", "garbage", "GPU-8"),
            "values": "4294967295 " + " ".join(["50"] * 40),
        }
    )
    rec = 'namespace="team-a", pod="lowsm", container="c", UUID="GPU-0", modelName="NVIDIA H200"'
    rec49 = 'namespace="team-d", pod="lowsm49", container="c", UUID="GPU-7", modelName="NVIDIA H200"'
    rec46 = 'namespace="team-d", pod="ratio46", container="c", UUID="GPU-6", modelName="NVIDIA H200"'
    tests = {
        "rule_files": ["rules.yaml"],
        # promtool evaluates every group at evaluation_interval (it ignores a group's own
        # interval), so this must be the recording group's 5m or windows overlap.
        "evaluation_interval": "5m",
        "tests": [
            {
                "interval": "19s",
                "input_series": inputs,
                "promql_expr_test": [
                    # (5m, 10m] holds 16 samples (19 s apart) of 0.25: sum 4, count 16.
                    {
                        "expr": 'pod_gpu:dcgm_sm_active:count5m{pod="lowsm"}',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": f"pod_gpu:dcgm_sm_active:count5m{{{rec}}}", "value": 16}],
                    },
                    {
                        "expr": 'pod_gpu:dcgm_sm_active:sum5m{pod="lowsm"}',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": f"pod_gpu:dcgm_sm_active:sum5m{{{rec}}}", "value": 4}],
                    },
                    # GPU_UTIL (100 %) recorded as a ratio: mean 1.
                    {
                        "expr": 'pod_gpu:dcgm_gpu_util:sum5m{pod="lowsm"} / pod_gpu:dcgm_gpu_util:count5m',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": f"{{{rec}}}", "value": 1}],
                    },
                    # 4.9 names: the same sums and counts as the classic names give.
                    {
                        "expr": 'pod_gpu:dcgm_sm_active:sum5m{pod="lowsm49"} / pod_gpu:dcgm_sm_active:count5m',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": f"{{{rec49}}}", "value": 0.25}],
                    },
                    {
                        "expr": 'pod_gpu:dcgm_gpu_util:sum5m{pod="lowsm49"} / pod_gpu:dcgm_gpu_util:count5m',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": f"{{{rec49}}}", "value": 1}],
                    },
                    # 4.6 names alone: SM activity recorded, GPU_UTIL_RATIO (unit unknown) not.
                    {
                        "expr": 'pod_gpu:dcgm_sm_active:count5m{pod="ratio46"}',
                        "eval_time": "10m",
                        "exp_samples": [{"labels": f"pod_gpu:dcgm_sm_active:count5m{{{rec46}}}", "value": 16}],
                    },
                    {"expr": 'pod_gpu:dcgm_gpu_util:count5m{pod="ratio46"}', "eval_time": "10m", "exp_samples": []},
                    # Long-window mean from sum and count: exact.
                    {
                        "expr": (
                            'sum_over_time(pod_gpu:dcgm_sm_active:sum5m{pod="healthy"}[1h])'
                            ' / sum_over_time(pod_gpu:dcgm_sm_active:count5m{pod="healthy"}[1h])'
                        ),
                        "eval_time": "90m",
                        "exp_samples": [
                            {
                                "labels": '{namespace="team-a", pod="healthy", container="c", UUID="GPU-1", modelName="NVIDIA H200"}',
                                "value": 0.75,
                            }
                        ],
                    },
                    # Garbage clamped: first 5 minutes (the reading at 0 in (−5m, 0]) = 1.0.
                    {
                        "expr": 'pod_gpu:dcgm_gpu_util:sum5m{pod="garbage"}',
                        "eval_time": "0m",
                        "exp_samples": [
                            {
                                "labels": 'pod_gpu:dcgm_gpu_util:sum5m{namespace="team-c", pod="garbage", container="c", '
                                'UUID="GPU-8", modelName="NVIDIA H200"}',
                                "value": 1,
                            }
                        ],
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "70m",
                        "alertname": "GpuAuditorLowSmEfficiency",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "namespace": ns, "pod": pod},
                                "exp_annotations": {
                                    "summary": f"GPU busy but SMs mostly idle: {ns}/{pod}",
                                    "description": "1 GPU(s) of this pod averaged GPU utilization above 0.8 but SM activity below 0.3 over 1h: "
                                    "few thread blocks, a kernel on one SM, or collective waits. `gpu-auditor explain` shows the job's numbers.",
                                },
                            }
                            for ns, pod in (("team-a", "lowsm"), ("team-d", "lowsm49"))
                        ],
                    },
                    # Not yet: fewer than 80 % of the window's samples (coverage guard).
                    {"eval_time": "40m", "alertname": "GpuAuditorLowSmEfficiency", "exp_alerts": []},
                    {
                        "eval_time": "100m",
                        "alertname": "GpuAuditorIdleGpu",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "namespace": "team-a", "pod": "idle"},
                                "exp_annotations": {
                                    "summary": "GPUs allocated but idle: team-a/idle",
                                    "description": "1 GPU(s) of this pod averaged GPU utilization below 0.05 over 1h.",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "40m",
                        "alertname": "GpuAuditorProfilingMetricsMissing",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "UUID": "GPU-9", "modelName": "NVIDIA H200"},
                                "exp_annotations": {
                                    "summary": "No DCGM SM activity for GPU GPU-9",
                                    "description": "dcgm-exporter reports this GPU but not DCGM_FI_PROF_SM_ACTIVE, so its jobs cannot be judged "
                                    "(verdict insufficient_data). Enable the profiling counters (dcgmCounters in the gpu-auditor chart).",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    res = chart.run([str(testbed.promtool), "test", "rules", str(tmp_path / "tests.yaml")], check=False)
    assert res.rc == 0, res.out + res.err


def _grafana_to_promql(expr: str) -> str:
    return expr.replace("$__range", "1h").replace('=~"$namespace"', '=~".*"')


def test_dashboard_and_alert_queries_run_on_real_prometheus(chart: Chart, testbed):
    """Every dashboard panel query (Grafana variables filled in) and alert expression is valid PromQL."""
    objs = chart.render(values=[FULL_VALUES])
    (cm,) = find(objs, "ConfigMap", "ga-gpu-auditor-dashboard")
    dash = json.loads(cm["data"]["gpu-auditor-efficiency.json"])
    exprs = [_grafana_to_promql(t["expr"]) for p in dash["panels"] for t in p["targets"]]
    (rule,) = find(objs, "PrometheusRule")
    exprs += [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert len(exprs) > 20
    for e in exprs:
        r = requests.get(f"{testbed.prometheus_url}/api/v1/query", params={"query": e}, timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "success", (e, r.text)
    assert dash["uid"] == "gpu-auditor-efficiency"
    assert {p["type"] for p in dash["panels"]} == {"stat", "timeseries", "table"}
