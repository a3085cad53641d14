"""The test bed's Prometheus: backfilled history is queryable as soon as backfill returns."""

from __future__ import annotations

import time
import uuid

import pytest
import requests

from auditor.errors import BadInput
from auditor.testbed import backfill as backfill_mod

pytestmark = pytest.mark.testbed


def _query_range(url: str, expr: str, start: int, end: int, step: int) -> list[dict]:
    r = requests.get(
        f"{url}/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": step}, timeout=10
    )
    r.raise_for_status()
    return r.json()["data"]["result"]


def test_backfilled_values_are_returned(prometheus):
    case = uuid.uuid4().hex
    end = int(time.time()) // 60 * 60 - 600
    start = end - 3 * 3600  # three hours back: spans more than one 2 h block
    lines = ["# TYPE DCGM_FI_PROF_SM_ACTIVE gauge"]
    for t in range(start, end + 1, 60):
        lines.append(f'DCGM_FI_PROF_SM_ACTIVE{{case="{case}",gpu="0",pod="p"}} {(t - start) / 60 % 100 / 100} {t}')
    prometheus.backfill("\n".join(lines) + "\n# EOF\n")

    result = _query_range(prometheus.url, f'DCGM_FI_PROF_SM_ACTIVE{{case="{case}"}}', start, end, 60)
    assert len(result) == 1
    values = {int(float(t)): float(v) for t, v in result[0]["values"]}
    assert len(values) == (end - start) // 60 + 1
    for t, v in values.items():
        assert v == pytest.approx((t - start) / 60 % 100 / 100)


def test_backfill_adds_a_missing_eof_and_keeps_earlier_data(prometheus):
    case = uuid.uuid4().hex
    now = int(time.time())
    prometheus.backfill(f'# TYPE probe gauge\nprobe{{case="{case}",n="1"}} 1 {now - 900}\n')
    prometheus.backfill(f'# TYPE probe gauge\nprobe{{case="{case}",n="2"}} 2 {now - 600}')
    r = requests.get(
        f"{prometheus.url}/api/v1/query",
        params={"query": f'max_over_time(probe{{case="{case}"}}[30m])', "time": now},
        timeout=10,
    )
    got = {s["metric"]["n"]: float(s["value"][1]) for s in r.json()["data"]["result"]}
    assert got == {"1": 1.0, "2": 2.0}


def test_malformed_openmetrics_is_bad_input(prometheus, tmp_path):
    with pytest.raises(BadInput, match="promtool"):
        backfill_mod.write_blocks("this is { not openmetrics\n# EOF\n", tmp_path / "data", "promtool")
