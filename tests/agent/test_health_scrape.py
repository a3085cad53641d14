"""The health series through a real Prometheus (issue 33, part 3): the agent serves a bitmask and an
Xid code per scrape (OR and last, never a mean), Prometheus stores them, and the audit's reading of
the stored samples finds the GPU sick for the right reasons, the power cap alone for none."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone

import pytest

from auditor.agent.recorded import RecordedSampler
from auditor.agent.sampler import Device
from auditor.agent.server import Agent
from auditor.core.gpu_health import evaluate_gpu, samples_from_series
from auditor.core.metrics import HEALTH_BY_NAME
from auditor.traces import fake_uuid

NODE = "h200-node-7"


def _rows(sick: bool) -> list[dict[str, float]]:
    """60 ticks at the power cap (0x4, as the recorded H200 under bf16); the sick GPU also reads
    HW slowdown (0x8) for ticks 20-29 and Xid 79 from tick 30."""
    rows = []
    for i in range(60):
        mask = 0x4 | (0x8 if sick and 20 <= i < 30 else 0)
        rows.append(
            {
                "DCGM_FI_DEV_GPU_UTIL": 100.0,
                "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float(mask),
                "DCGM_FI_DEV_XID_ERRORS": 79.0 if sick and i >= 30 else 0.0,
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
                "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
            }
        )
    return rows


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.testbed
def test_prometheus_holds_what_the_evaluation_needs(scraping_prometheus):
    devs = [Device(i, fake_uuid(NODE, i), "NVIDIA H200", f"00000000:1{i}:00.0") for i in range(2)]
    agent = Agent(
        RecordedSampler(devs, {devs[0].key: _rows(False), devs[1].key: _rows(True)}),
        node_name=NODE,
        interval=1.0,
    )
    agent.start()
    try:
        url = scraping_prometheus("%s:%d" % agent.serve("127.0.0.1", 0), interval="5s")
        time.sleep(52)  # past tick 30 and two scrapes more; before the rows loop at tick 60
        end = time.time()
        per_gpu: dict[str, dict[str, list[tuple[datetime, float]]]] = {}
        for name in sorted(n for n in HEALTH_BY_NAME if n.startswith("DCGM_FI_DEV_")):
            q = urllib.parse.quote(f'{name}{{Hostname="{NODE}"}}[2m]')
            for r in _get(f"{url}/api/v1/query?query={q}&time={end}")["data"]["result"]:
                series = per_gpu.setdefault(r["metric"]["gpu"], {})
                series[name] = [(datetime.fromtimestamp(float(t), timezone.utc), float(v)) for t, v in r["values"]]
    finally:
        agent.stop()
    assert set(per_gpu) == {"0", "1"}
    healthy = evaluate_gpu("gpu 0", samples_from_series(per_gpu["0"]))
    assert healthy.healthy, healthy.evidence
    assert healthy.evidence["sw_power_cap_share"] == 1.0
    sick_samples = samples_from_series(per_gpu["1"])
    assert len(sick_samples) >= 8
    sick = evaluate_gpu("gpu 1", sick_samples)
    assert sick.reasons == ("xid", "hw_slowdown"), sick.evidence
    # the scrapes that held HW slowdown kept the power-cap bit too (OR), none read a mean such as 6.0
    assert {s.clock_events for s in sick_samples} <= {0x4, 0xC}
    assert {s.xid for s in sick_samples} <= {0, 79}
