"""The recorded-rule path on 5-minute downsampled data: a real Prometheus holding only one sample
per 5 minutes of each recorded series (what Thanos' 5 m downsampling, or Mimir/VictoriaMetrics
reading it, leaves of the chart's ``pod_gpu:dcgm_*:{sum,count}5m``), and the chart's own alert
expression and long-window mean evaluated on it.

The recorded series carry a sum and a count, never a mean, so a mean over any window is exact at
any resolution that keeps one point per 5-minute window, scrape gaps included.
"""

from __future__ import annotations

import time
import uuid

import pytest
import requests
from chartlib import Chart, find

pytestmark = pytest.mark.testbed

LABELS = 'container="c",UUID="{uuid}",modelName="NVIDIA H200"'


def _alert_expr(chart: Chart) -> str:
    objs = chart.render(sets=["prometheusRule.enabled=true"])
    (rule,) = find(objs, "PrometheusRule")
    (expr,) = [
        r["expr"] for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "GpuAuditorLowSmEfficiency"
    ]
    return expr


def test_alert_and_mean_on_5m_downsampled_recorded_series(chart: Chart, prometheus) -> None:
    ns = f"ds-{uuid.uuid4().hex[:8]}"
    at = int(time.time()) // 300 * 300 - 3600  # an hour ago, on a 5-minute boundary
    # pod: (GPU_UTIL ratio, SM_ACTIVE) per raw 15 s sample; 20 raw samples per 5-minute window
    pods = {"lowsm": (1.0, 0.25), "healthy": (1.0, 0.75)}
    lines: dict[str, list[str]] = {}
    for i, (pod, (util, sm)) in enumerate(pods.items()):
        labels = f'namespace="{ns}",pod="{pod}",' + LABELS.format(uuid=f"GPU-{ns}-{i}")
        for t in range(at - 7200 + 300, at + 1, 300):  # one point per 5 minutes, 2 h of them
            n = 8 if t == at - 1800 else 20  # one window with a scrape gap: 8 samples, not 20
            for name, mean in (("gpu_util", util), ("sm_active", sm)):
                lines.setdefault(f"pod_gpu:dcgm_{name}:sum5m", []).append(
                    f"pod_gpu:dcgm_{name}:sum5m{{{labels}}} {mean * n} {t}"
                )
                lines.setdefault(f"pod_gpu:dcgm_{name}:count5m", []).append(
                    f"pod_gpu:dcgm_{name}:count5m{{{labels}}} {n} {t}"
                )
    text = "".join(f"# TYPE {name} gauge\n" + "\n".join(rows) + "\n" for name, rows in lines.items()) + "# EOF\n"
    prometheus.backfill(text)

    def query(expr: str) -> list[dict]:
        r = requests.get(f"{prometheus.url}/api/v1/query", params={"query": expr, "time": at}, timeout=30)
        assert r.status_code == 200, r.text
        return [s for s in r.json()["data"]["result"] if s["metric"].get("namespace") == ns]

    # the resolution Prometheus holds: one sample per 5 minutes
    (points,) = query(f'count_over_time(pod_gpu:dcgm_sm_active:sum5m{{namespace="{ns}",pod="lowsm"}}[1h])')
    assert float(points["value"][1]) in (12, 13)  # 12 windows (13 where both ends are in the range)

    mean = query(
        f'sum_over_time(pod_gpu:dcgm_sm_active:sum5m{{namespace="{ns}"}}[1h])'
        f' / sum_over_time(pod_gpu:dcgm_sm_active:count5m{{namespace="{ns}"}}[1h])'
    )
    assert {s["metric"]["pod"]: float(s["value"][1]) for s in mean} == {
        "lowsm": pytest.approx(0.25),
        "healthy": pytest.approx(0.75),
    }

    firing = query(_alert_expr(chart))
    assert [s["metric"]["pod"] for s in firing] == ["lowsm"]
