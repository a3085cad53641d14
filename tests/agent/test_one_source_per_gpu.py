"""A GPU exported by both the node agent and dcgm-exporter is audited once, from the agent.

Both series sets go through the real Prometheus; the exporter's replay a different phase than the
agent's, so the verdict and means say which one the audit used, and GPU-hours/coverage say it
counted the GPU once.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from auditor import traces
from auditor.cli.main import main
from auditor.core.model import GpuId, PodRef

pytestmark = pytest.mark.testbed

INTERVAL = timedelta(seconds=15)
DURATION = timedelta(minutes=30)


def _with_labels(text: str, extra: str) -> str:
    return re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf"\1{{{extra},", text, flags=re.M)


def test_agent_series_win_over_dcgm_exporter_for_the_same_gpu(prometheus, capsys) -> None:
    case = uuid.uuid4().hex[:10]
    trace = traces.load_trace("h200-microbench")
    end = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=5)
    gpu = (GpuId(uuid=f"GPU-{case}", hostname="node-1", index="0", model="NVIDIA H200"),)
    pod = PodRef("team-x", f"trainer-{case}", "main")

    def series(phase: str) -> str:
        job = traces.TraceJob(pod=pod, gpus=gpu, phase=phase)
        return traces.trace_to_openmetrics(trace, [job], end=end, duration=DURATION, interval=INTERVAL)

    exporter = _with_labels(series("one_sm_spin"), f'case="{case}"')
    agent = _with_labels(series("bf16_matmul"), f'case="{case}",source="gpu-auditor-agent"')
    body = lambda text: text.replace("# EOF\n", "").rstrip("\n")  # noqa: E731
    prometheus.backfill(body(exporter) + "\n" + body(agent) + "\n# EOF\n")

    rc = main(
        [
            "audit",
            "--prometheus",
            prometheus.url,
            "--no-kube",
            "--match",
            f"case={case}",
            "--start",
            (end - DURATION - timedelta(minutes=5)).isoformat(),
            "--end",
            end.isoformat(),
            "--db",
            "sqlite://",
            "--output",
            "json",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    (job,) = json.loads(out.out)
    assert job["verdict"] == "healthy"  # the agent's bf16 matmul, not the exporter's one-SM spin
    assert job["tensor_active"] > 0.9
    assert job["gpus"] == 1
    assert job["gpu_hours"] == pytest.approx(DURATION / timedelta(hours=1), rel=0.05)
    assert job["coverage"] <= 1.0
    assert "node agent serves the same GPU" in out.err
