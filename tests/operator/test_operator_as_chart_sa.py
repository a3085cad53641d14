"""The chart's RBAC, proven by the operator itself (issues 5 and 7).

The real chart is installed with helm into the test bed's apiserver (requeue enabled); then one
``gpu-auditor run --once`` cycle runs impersonating the ServiceAccount the chart created, with
nothing but the RBAC the chart rendered. The cycle discovers a Kueue-managed GPU Job whose
history is a real one-SM spin, and an enforce policy acts on it: annotate, a Warning Event, a
Slack alert (a real local HTTP receiver) and a requeue through the Workload's ``spec.active``.
Nothing may be Forbidden.
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from kubeobjects import batch_job, create, create_pod
from kueue_objects import job_workload
from policy.policy_receivers import Receiver  # tests/ is on sys.path (its conftest.py)

from auditor import traces
from auditor.cli.main import main
from auditor.core.model import PodRef
from auditor.kube.client import call_json, resource_path

pytestmark = pytest.mark.testbed

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-auditor"
INTERVAL = timedelta(seconds=15)
KV = "kueue.x-k8s.io/v1beta2"

POLICY = """\
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata:
  name: requeue-low-sm
spec:
  mode: enforce
  verdicts: [low_sm_efficiency]
  conditions:
    - {field: gpu_util, op: ">=", value: 0.8}
    - {field: sm_active, op: "<=", value: 0.3}
  escalation:
    - actions: [annotate, event, notify]
    - actions: [requeue]
      after: 0s
  requeue:
    backoff: 15m
    maxPerJob: 1
"""


def _helm(testbed, *args: str) -> str:
    out = subprocess.run(
        [testbed.helm, *args],
        env={"KUBECONFIG": testbed.kubeconfig, "HOME": "/tmp"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_one_cycle_as_the_charts_service_account(
    testbed, kube_admin, namespace, prometheus, postgres_url, tmp_path, capsys, caplog, monkeypatch
) -> None:
    api = kube_admin
    release, work_ns = namespace, f"{namespace}-w"
    case = f"sa{uuid.uuid4().hex[:8]}"
    _helm(testbed, "install", release, str(CHART), "-n", namespace, "--set", "requeue.enabled=true")
    slack = Receiver()
    try:
        create(api, "v1", "namespaces", None, {"metadata": {"name": work_ns}})
        create(
            api,
            KV,
            "localqueues",
            work_ns,
            {
                "apiVersion": KV,
                "kind": "LocalQueue",
                "metadata": {"name": "lq"},
                "spec": {"clusterQueue": f"cq-{case}"},
            },
        )
        job = batch_job(api, work_ns, "train", labels={"kueue.x-k8s.io/queue-name": "lq"})
        job_workload(api, work_ns, job)  # Kueue's own Workload of the queued Job

        trace = traces.load_trace("h200-microbench")
        cycle = len(trace.steady("one_sm_spin")) * INTERVAL
        duration = cycle * math.ceil(timedelta(minutes=60) / cycle)
        # A running job: its samples go on past both cycles (each reads only what is new).
        end = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=2)
        create_pod(api, work_ns, "train-0-abcde", gpus=1, owner=job, node=f"{case}-node", started=end - duration)
        tj = traces.TraceJob(
            PodRef(work_ns, "train-0-abcde", "main"),
            traces.make_gpus(1, f"{case}-node"),
            "one_sm_spin",
            duration=duration,
        )
        text = traces.trace_to_openmetrics(trace, [tj], end=end, duration=duration, interval=INTERVAL)
        prometheus.backfill(re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M))

        policies = tmp_path / "policies"
        policies.mkdir()
        (policies / "requeue.yaml").write_text(POLICY)
        monkeypatch.setenv("GPU_AUDITOR_SLACK_WEBHOOK_URL", slack.url)
        sa = f"{release}-gpu-auditor"
        cfg = tmp_path / "settings.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "cluster": "test",
                    "kubernetes": {
                        "kubeconfig": testbed.kubeconfig,
                        "impersonate": f"system:serviceaccount:{namespace}:{sa}",
                    },
                    "prometheus": {"url": prometheus.url, "matchers": {"case": case}, "label_convention": "pod"},
                    "store": {"url": postgres_url},
                    "leader_election": {
                        "namespace": namespace,
                        "lease_name": sa,
                        "lease_duration": "6s",
                        "renew_deadline": "4s",
                        "retry_period": "1s",
                    },
                    "features": {"annotate": True, "events": True, "kueue": True, "requeue": True},
                    "requeue": {"namespaces": [work_ns]},
                    "policies": {"builtin": False, "dir": str(policies)},
                    "notifications": {"slack": {"webhook_url_env": "GPU_AUDITOR_SLACK_WEBHOOK_URL"}},
                    "http": {"port": 0},
                }
            )
        )

        caplog.set_level(logging.INFO)
        logs = ""
        for _ in range(2):  # step 1 tells the user; the next cycle requeues
            rc = main(["run", "--once", "--output", "json", "--config", str(cfg)])
            out = capsys.readouterr()
            assert rc == 0, out.err
            (summary,) = [s for s in json.loads(out.out) if s["namespace"] == work_ns]
            assert (summary["job"], summary["verdict"]) == ("Job/train", "low_sm_efficiency")
            logs += out.err
        logs += caplog.text
        assert "Forbidden" not in logs and " 403" not in logs and "policy file" not in logs, logs[-3000:]

        got = call_json(api, resource_path("batch/v1", "jobs", work_ns, "train"))
        assert got["metadata"]["annotations"]["gpu-auditor.io/verdict"] == "low_sm_efficiency"
        events = call_json(api, resource_path("events.k8s.io/v1", "events", work_ns))["items"]
        assert any(e["type"] == "Warning" and e["regarding"]["name"] == "train" for e in events), events
        # The one Slack message is the policy's alert. The weekly report that is due (the last
        # complete week before the latest Monday 08:00) holds none of this job's data, whatever
        # the day and hour, and a week without data sends nothing (issue 12, item 7).
        assert len(slack.accepted) == 1
        wl = job_workload(api, work_ns, job)
        assert wl["spec"]["active"] is False
        lease = call_json(api, resource_path("coordination.k8s.io/v1", "leases", namespace, sa))
        assert not lease["spec"].get("holderIdentity")  # released at the end of --once
    finally:
        slack.close()
        _helm(testbed, "uninstall", release, "-n", namespace)
        call_json(api, resource_path("v1", "namespaces", None, work_ns), method="DELETE")
