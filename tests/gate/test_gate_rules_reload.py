"""Gate rules follow the policy files while the gate runs (no restart): the operator re-reads the
files every sweep interval, re-parses only changed texts, and a file that became invalid keeps
its last good rules. On the bed: ``gpu-auditor run`` admits a lineage clean, the policy file gains
a hold rule, and the next submission of the lineage is decided by it."""

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
from auditor.gate.stage import GateRules
from auditor.kube.client import call_json, resource_path
from auditor.store.lineage import LineageRecorder
from auditor.store.store import Store

HOLD = """apiVersion: gpu-auditor.io/v1alpha1
kind: GatePolicy
metadata: {name: hold-low-sm}
spec: {action: hold, verdicts: [low_sm_efficiency], atLeast: 2, ofLast: 5}
"""


def test_rules_change_with_the_files_and_a_broken_file_keeps_its_last_good_rules() -> None:
    files = {"gate.yaml": HOLD}
    reads: list[int] = []

    def read() -> dict[str, str]:
        reads.append(1)
        return dict(files)

    rules = GateRules(read)
    assert rules.refresh() and [r.name for r in rules.rules] == ["hold-low-sm"]
    assert not rules.refresh()  # same text: nothing parsed, nothing changed
    files["gate.yaml"] = HOLD.replace("atLeast: 2", "atLeast: 3")
    assert rules.refresh() and rules.rules[0].at_least == 3
    files["gate.yaml"] = HOLD.replace("action: hold", "action: explode")
    assert not rules.refresh() and rules.rules[0].at_least == 3  # invalid: the last good version stays
    assert any("gate.yaml" in e for e in rules.registry.errors)
    del files["gate.yaml"]
    assert rules.refresh() and rules.rules == []
    assert len(reads) == 5


@pytest.mark.testbed
@pytest.mark.skipif(not kueue_running(), reason="the bed runs without the Kueue controller")
def test_run_takes_a_new_gate_rule_without_a_restart(kube_admin, namespace, testbed, tmp_path):
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
    policies = tmp_path / "policies"
    policies.mkdir()
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "interval": "1h",
                "http": {"port": 0, "host": "127.0.0.1"},
                "policies": {"builtin": False, "dir": str(policies)},
                "leader_election": {"namespace": ns, "lease_name": "gpu-auditor"},
                "gate": {"enabled": True, "timeout": "1s", "sweep_interval": "1s"},
            }
        )
    )
    log = tmp_path / "run.log"
    exe = Path(sys.executable).with_name("gpu-auditor")

    def admitted(job: str) -> str:
        wl = workload_of(api, ns, gpu_job(api, ns, job))["metadata"]["name"]
        obj = until(
            lambda: (w := call_json(api, resource_path(KV, "workloads", ns, wl))) and is_true(w, "Admitted") and w,
            f"{job} admitted",
        )
        call_json(
            api, resource_path("batch/v1", "jobs", ns, job), method="DELETE", body={"propagationPolicy": "Background"}
        )
        return str(check_state(obj, q.check)["message"])

    with gate_queue(api, ns) as q:
        proc = subprocess.Popen(
            [str(exe), "-v", "run", "--config", str(cfg), "--kubeconfig", testbed.kubeconfig]
            + ["--prometheus", testbed.prometheus_url, "--db", db],
            env={**os.environ, "GPU_AUDITOR_LEADER_ELECTION__IDENTITY": "gate-reload-test"},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            until(lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the CQ Active", 60)
            assert "efficiency gate: 0 rule(s): none" in log.read_text()
            first = admitted("train-m2n4p")
            assert first.startswith("gpu-auditor: admitted,") and "would hold" not in first, first
            (policies / "gate.yaml").write_text(HOLD)
            until(lambda: "rules changed, now 1: hold-low-sm" in log.read_text(), "the new rule taken", 15)
            second = admitted("train-b4x2z")
            assert "would hold" in second and "(rule hold-low-sm)" in second, second
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
