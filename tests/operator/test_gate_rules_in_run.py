"""The operator's gate decides with the GatePolicy rules of its policy files (issue 16 item 2), on
the real Kueue: a lineage flagged in its stored history is admitted in observe mode with a
"would hold" message naming the rule, and released once acknowledged with ``gpu-auditor ack``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from gate_objects import check_state, cluster_queue, gate_queue, gpu_job, is_true, until, workload_of
from kueue_objects import KV, kueue_running

from auditor.core.gate import LineageRun
from auditor.core.lineage import LineageKey
from auditor.kube.client import call_json, resource_path
from auditor.store.lineage import LineageRecorder
from auditor.store.store import Store

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller"),
]
RULE = """apiVersion: gpu-auditor.io/v1alpha1
kind: GatePolicy
metadata: {name: hold-low-sm}
spec: {action: hold, verdicts: [low_sm_efficiency], atLeast: 2, ofLast: 5}
"""


def test_run_decides_with_the_gate_rules_of_its_policy_files(kube_admin, namespace, testbed, tmp_path):
    api, ns = kube_admin, namespace
    db = f"sqlite:///{tmp_path}/s.db"
    now = datetime.now(timezone.utc)  # the operator decides at its own clock: history is laid out before it
    store = Store.open(db)
    try:
        for i in range(2):
            run = LineageRun(f"Job/train-{i}", "low_sm_efficiency", start=now - timedelta(hours=4 - i))
            LineageRecorder(store).record(LineageKey("default", ns, "train"), run, now)
    finally:
        store.close()
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "gate.yaml").write_text(RULE)
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "interval": "1h",
                "http": {"port": 0, "host": "127.0.0.1"},
                "policies": {"builtin": False, "dir": str(tmp_path / "policies")},
                "leader_election": {"namespace": ns, "lease_name": "gpu-auditor"},
                "gate": {"enabled": True, "timeout": "1s", "sweep_interval": "1s"},
            }
        )
    )
    log = tmp_path / "run.log"
    exe = Path(sys.executable).with_name("gpu-auditor")
    with gate_queue(api, ns) as q:
        proc = subprocess.Popen(
            [str(exe), "-v", "run", "--config", str(cfg), "--kubeconfig", testbed.kubeconfig]
            + ["--prometheus", testbed.prometheus_url, "--db", db],
            env={**os.environ, "GPU_AUDITOR_LEADER_ELECTION__IDENTITY": "gate-rules-test"},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the CQ Active", 60)
            wl = workload_of(api, ns, gpu_job(api, ns, "train-m2n4p"))["metadata"]["name"]
            wl_obj = until(
                lambda: (w := call_json(api, resource_path(KV, "workloads", ns, wl))) and is_true(w, "Admitted") and w,
                "admitted in observe mode",
            )
            message = check_state(wl_obj, q.check)["message"]
            assert "would hold" in message and "(rule hold-low-sm)" in message, message
            assert f"lineage {ns}/train flagged low_sm_efficiency in 2 of its last 5 runs" in message
            assert "efficiency gate: 1 rule(s): hold-low-sm" in log.read_text()
            # acknowledged, the next submission is admitted clean of the rule (the first one gone: it holds the quota)
            call_json(
                api,
                resource_path("batch/v1", "jobs", ns, "train-m2n4p"),
                method="DELETE",
                body={"propagationPolicy": "Background"},
            )
            r = subprocess.run(
                [str(exe), "ack", f"{ns}/train", "--by", "owner", "--db", db], capture_output=True, text=True
            )
            assert r.returncode == 0, r.stderr
            wl2 = workload_of(api, ns, gpu_job(api, ns, "train-b4x2z"))["metadata"]["name"]
            wl2_obj = until(
                lambda: (w := call_json(api, resource_path(KV, "workloads", ns, wl2))) and is_true(w, "Admitted") and w,
                "the acknowledged lineage admitted",
            )
            message = check_state(wl2_obj, q.check)["message"]
            assert "would hold" not in message and "acknowledged" in message and "owner" in message, message
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
