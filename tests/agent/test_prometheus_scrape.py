"""Issue 8's CI Done-when: a REAL Prometheus scrapes the agent, and the audit reads the verdicts back.

The GPU layer replays the real H200 microbench trace (recorded at 1 Hz with NVML + GPM, the agent's
own GPM source) per GPU; pod attribution comes from a real gRPC server generated from the kubelet's
pod-resources proto; a private Debian Prometheus scrapes ``/metrics`` every second; then
``gpu-auditor audit --no-kube`` reads the window back and must give each workload the verdict the
traces README gives it, with means matching the trace's steady state.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone

import pytest

from auditor.agent.podresources import PodResourcesClient
from auditor.agent.recorded import RecordedSampler, trace_rows
from auditor.agent.sampler import Device
from auditor.agent.server import Agent
from auditor.cli.main import main
from auditor.core.metrics import Metric
from auditor.traces import fake_uuid, load_trace

pytestmark = pytest.mark.testbed

NODE = "h200-node-7"
#: GPU index → (phase replayed, pod holding it or None, expected verdict)
WORKLOADS = {
    0: ("one_sm_spin", "one-sm-spin", "low_sm_efficiency"),
    1: ("bf16_matmul", "bf16-matmul", "healthy"),
    2: ("memcpy_only", "memcpy-only", "memory_bound"),
    3: ("idle", "idle-notebook", "idle"),
    4: ("bf16_matmul", None, None),  # busy but held by no pod: exported without pod labels, no job
}
BUCKET = 10
SPAN = 70  # seconds of audited window (the audit needs a 1 min span per job)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_real_prometheus_scrapes_the_agent_and_the_audit_gets_the_verdicts(
    kubelet, scraping_prometheus, tmp_path, capsys
):
    trace = load_trace("h200-microbench")
    devices = [Device(i, fake_uuid(NODE, i), "NVIDIA H200", f"00000000:{0x19 + i:02X}:00.0") for i in WORKLOADS]
    sampler = RecordedSampler(devices, {d.key: trace_rows(trace, WORKLOADS[d.index][0]) for d in devices})
    kubelet.set_pods(
        *[("bench", pod, "main", "nvidia.com/gpu", [devices[i].uuid]) for i, (_, pod, _) in WORKLOADS.items() if pod]
    )
    agent = Agent(
        sampler, node_name=NODE, interval=1.0, pod_resources=PodResourcesClient(kubelet.socket_path), refresh=2.0
    )
    agent.start()
    try:
        host, port = agent.serve("127.0.0.1", 0)
        url = scraping_prometheus(f"{host}:{port}")
        t0 = time.time()
        start = math.ceil((t0 + 3) / BUCKET) * BUCKET
        end = start + SPAN
        time.sleep(max(0.0, end + 2 - time.time()))

        # what Prometheus stored: the agent's series, with the source label; the pod-less GPU has no pod label
        q = urllib.parse.quote("count by (pod, source) (DCGM_FI_PROF_SM_ACTIVE)")
        got = {
            (r["metric"].get("pod"), r["metric"].get("source"))
            for r in _get(f"{url}/api/v1/query?query={q}")["data"]["result"]
        }
        assert got == {(pod, "gpu-auditor-agent") for _, pod, _ in WORKLOADS.values()}
        up = _get(f"{url}/api/v1/query?query=up")["data"]["result"]
        assert [r["value"][1] for r in up] == ["1"]

        iso = lambda t: datetime.fromtimestamp(t, timezone.utc).isoformat()  # noqa: E731
        rc = main(
            [
                "audit",
                "--prometheus",
                url,
                "--no-kube",
                "--match",
                "source=gpu-auditor-agent",
                "--start",
                iso(start),
                "--end",
                iso(end),
                "--bucket",
                f"{BUCKET}s",
                "--db",
                f"sqlite:///{tmp_path}/audit.db",
                "--output",
                "json",
            ]
        )
        out = capsys.readouterr()
        assert rc == 0, out.err
        summaries = {s["job"]: s for s in json.loads(out.out)}
    finally:
        agent.stop()

    expected = {f"Pod/{pod}": (phase, verdict) for phase, pod, verdict in WORKLOADS.values() if pod}
    assert set(summaries) == set(expected)
    wrong = {}
    for job, (phase, verdict) in expected.items():
        s = summaries[job]
        if s["verdict"] != verdict:
            wrong[job] = (s["verdict"], [f["code"] for f in s["findings"]])
        means = trace.steady_means(phase)
        assert s["namespace"] == "bench"
        assert s["coverage"] >= 0.9, (job, s["coverage"])
        assert s["gpu_util"] == pytest.approx(means[Metric.GPU_UTIL], abs=0.03), job
        for key, metric in (
            ("sm_active", Metric.SM_ACTIVE),
            ("tensor_active", Metric.TENSOR_ACTIVE),
            ("dram_active", Metric.DRAM_ACTIVE),
        ):
            assert s[key] == pytest.approx(means[metric], abs=0.03), (job, key, s[key], means[metric])
    assert not wrong, wrong
    assert summaries["Pod/one-sm-spin"]["gpu_util"] >= 0.95 and summaries["Pod/one-sm-spin"]["sm_active"] <= 0.02
