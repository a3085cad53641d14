"""``gpu-auditor audit --kubeconfig``: a one-shot audit that finds jobs through the Kubernetes API.

The same resolver as the operator: a pod is audited as its top-level job (here a batch Job)
with the team from its labels, instead of ``Pod/<name>`` as with ``--no-kube``.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from kubeobjects import batch_job, create_pod

from auditor import traces
from auditor.cli.main import main
from auditor.core.model import PodRef

pytestmark = pytest.mark.testbed
INTERVAL = timedelta(seconds=15)


def test_audit_through_the_kubernetes_api(testbed, kube_admin, namespace, prometheus, capsys) -> None:
    case = f"ak{uuid.uuid4().hex[:8]}"
    trace = traces.load_trace("h200-microbench")
    cycle = len(trace.steady("one_sm_spin")) * INTERVAL
    duration = cycle * math.ceil(timedelta(minutes=30) / cycle)
    end = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=1)
    job = batch_job(kube_admin, namespace, "spin", labels={"team": "kernels"})
    create_pod(
        kube_admin,
        namespace,
        "spin-0-abcde",
        gpus=1,
        owner=job,
        labels={"team": "kernels"},
        node=f"{case}-node",
        started=end - duration,
    )
    tj = traces.TraceJob(
        PodRef(namespace, "spin-0-abcde", "main"), traces.make_gpus(1, f"{case}-node"), "one_sm_spin", duration=duration
    )
    text = traces.trace_to_openmetrics(trace, [tj], end=end, duration=duration, interval=INTERVAL)
    prometheus.backfill(re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M))

    rc = main(
        [
            "audit",
            "--prometheus",
            prometheus.url,
            "--kubeconfig",
            testbed.kubeconfig,
            "--match",
            f"case={case}",
            "--start",
            (end - duration - timedelta(minutes=5)).isoformat(),
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
    (summary,) = json.loads(out.out)
    assert (summary["namespace"], summary["job"], summary["team"]) == (namespace, "Job/spin", "kernels")
    assert summary["uid"] == job["metadata"]["uid"]
    assert summary["verdict"] == "low_sm_efficiency"
