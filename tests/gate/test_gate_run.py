"""``gpu-auditor run --config <settings> --kubeconfig --prometheus --db`` runs the gate outside a
cluster, under the operator's leader election: the leader answers the AdmissionCheck, and the
decision latency shows on its /metrics."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
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


def _get(log: Path, path: str) -> tuple[int, str]:
    """GET ``path`` on the running operator's HTTP port (0, "" before it serves)."""
    m = re.search(r"on port (\d+)", log.read_text(errors="replace"))
    if not m:
        return 0, ""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _metrics(log: Path) -> str:
    code, text = _get(log, "/metrics")
    return text if code == 200 else ""


HOLD = """apiVersion: gpu-auditor.io/v1alpha1
kind: GatePolicy
metadata: {name: hold-low-sm}
spec: {action: hold, verdicts: [low_sm_efficiency], atLeast: 2, ofLast: 5}
"""


def test_run_answers_the_check_as_leader(kube_admin, namespace, testbed, tmp_path):
    """Also: its gate rules follow the policy files without a restart (a rule added to the
    directory decides the next submission), `gpu-auditor ack` against its store releases the
    lineage for the one after, and a missing link key leaves it running."""
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
                # the chart's optional key Secret not created: the operator runs, links are off
                "gate": {
                    "enabled": True,
                    "timeout": "1s",
                    "sweep_interval": "1s",
                    "ack_link_key_file": str(tmp_path / "no-such-key"),
                },
            }
        )
    )
    log = tmp_path / "run.log"
    exe = Path(sys.executable).with_name("gpu-auditor")
    with gate_queue(api, ns) as q:
        proc = subprocess.Popen(
            [
                str(exe),
                "-v",
                "run",
                "--config",
                str(cfg),
                "--kubeconfig",
                testbed.kubeconfig,
                "--prometheus",
                testbed.prometheus_url,
                "--db",
                db,
            ],
            env={**os.environ, "GPU_AUDITOR_LEADER_ELECTION__IDENTITY": "gate-run-test"},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            until(
                lambda: is_true(cluster_queue(api, q.cluster_queue), "Active"), "the CQ Active (our check Active)", 60
            )
            lease = call_json(api, resource_path("coordination.k8s.io/v1", "leases", ns, "gpu-auditor"))
            assert lease["spec"]["holderIdentity"] == "gate-run-test"
            wl = workload_of(api, ns, gpu_job(api, ns, "train-m2n4p"))["metadata"]["name"]
            wl_obj = until(
                lambda: (w := call_json(api, resource_path(KV, "workloads", ns, wl))) and is_true(w, "Admitted") and w,
                "admitted by the running operator",
            )
            assert check_state(wl_obj, q.check)["message"].startswith("gpu-auditor: admitted, lineage")
            text = until(
                lambda: (
                    (m := _metrics(log))
                    and 'gpu_auditor_gate_decisions_total{decided="yes",state="Ready",would="admit"}' in m
                    and m
                ),
                "metrics",
            )
            assert 'gpu_auditor_gate_decision_seconds_count{state="Ready"}' in text
            code, page = _get(log, "/gate/ack?action=ack")
            assert code == 503 and "no-such-key: cannot read" in page, page
            assert "signed acknowledgement links are off: gate.ack_link_key_file" in log.read_text()

            # a gate rule added to the policy files decides the lineage's next submission
            assert "efficiency gate: 0 rule(s): none" in log.read_text()
            call_json(
                api,
                resource_path("batch/v1", "jobs", ns, "train-m2n4p"),
                method="DELETE",
                body={"propagationPolicy": "Background"},
            )
            (policies / "gate.yaml").write_text(HOLD)
            until(lambda: "rules changed, now 1: hold-low-sm" in log.read_text(), "the new rule taken", 15)
            wl2 = workload_of(api, ns, gpu_job(api, ns, "train-b4x2z"))["metadata"]["name"]
            wl2_obj = until(
                lambda: (w := call_json(api, resource_path(KV, "workloads", ns, wl2))) and is_true(w, "Admitted") and w,
                "the next submission admitted (observe)",
            )
            message = check_state(wl2_obj, q.check)["message"]
            assert "would hold" in message and "(rule hold-low-sm)" in message, message
            assert f"lineage {ns}/train flagged low_sm_efficiency in 2 of its last 5 runs" in message

            # acknowledged through the CLI, the next submission is admitted clean of the rule
            # (the one before it deleted: it holds the quota)
            call_json(
                api,
                resource_path("batch/v1", "jobs", ns, "train-b4x2z"),
                method="DELETE",
                body={"propagationPolicy": "Background"},
            )
            acked = subprocess.run(
                [str(exe), "ack", f"{ns}/train", "--by", "owner", "--db", db], capture_output=True, text=True
            )
            assert acked.returncode == 0, acked.stderr
            wl3 = workload_of(api, ns, gpu_job(api, ns, "train-k8v5t"))["metadata"]["name"]
            wl3_obj = until(
                lambda: (w := call_json(api, resource_path(KV, "workloads", ns, wl3))) and is_true(w, "Admitted") and w,
                "the acknowledged lineage admitted",
            )
            message = check_state(wl3_obj, q.check)["message"]
            assert "would hold" not in message and "acknowledged" in message and "owner" in message, message
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()


def test_the_gate_talks_through_a_client_of_its_own_with_room_for_its_threads(testbed):
    """The operator's shared client keeps 10 connections, most held by watches: the gate's
    requests would each open a new TLS connection. Its own client keeps the identity."""
    from auditor.gate.kueue import gate_client
    from auditor.kube.client import KubeConfig, api_client

    shared = api_client(KubeConfig(kubeconfig=testbed.kubeconfig, impersonate="system:serviceaccount:x:gate"))
    own = gate_client(shared, 16)
    try:
        assert own.rest_client.pool_manager.connection_pool_kw["maxsize"] == 16
        assert shared.configuration.connection_pool_maxsize != 16  # the shared client is left as it was
        review = call_json(
            own,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            method="POST",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        assert review["status"]["userInfo"]["username"] == "system:serviceaccount:x:gate"
    finally:
        own.close()
        shared.close()
