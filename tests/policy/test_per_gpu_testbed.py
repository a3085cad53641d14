"""A policy judged GPU by GPU (``gpus``, issue 30) against the test bed's real apiserver: the
opt-out annotation of a job whose own verdict is not the policy's, but one of its GPUs' is, is
read and honoured (the runner asks Kubernetes for a job's facts when a GPU's verdict may fire,
not only the job's), and a job without it is annotated."""

from __future__ import annotations

from datetime import timedelta

import pytest
from test_policy_testbed import T0, _annotations, _events, _job

from auditor.actions import KubeActions
from auditor.core.job_summary import JobSummary
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RunnerConfig
from auditor.store import Store

pytestmark = pytest.mark.testbed

POLICY = """
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: spinning-ranks}
spec:
  mode: warn
  verdicts: [low_sm_efficiency]
  conditions:
    - {field: gpu_util, op: ">=", value: 0.8}
    - {field: sm_active, op: "<=", value: 0.3}
  gpus: {share: 0.5}
  escalation:
    - actions: [annotate, event]
"""


def _gpu(ns: str, pod: str, index: int, verdict: str, util: float, sm: float) -> dict:
    return {
        "pod": pod,
        "namespace": ns,
        "gpu": str(index),
        "uuid": f"GPU-{pod}-{index}",
        "hostname": "node-a",
        "gpu_model": "NVIDIA H200",
        "fraction": 1.0,
        "start": (T0 - timedelta(hours=2)).isoformat(),
        "end": T0.isoformat(),
        "gpu_hours": 2.0,
        "coverage": 1.0,
        "gpu_util": util,
        "sm_active": sm,
        "shared_with_pods": 0,
        "verdict": verdict,
    }


def _straggler_job(ns: str, name: str, uid: str, pod: str) -> JobSummary:
    """Two GPUs: one spinning in a collective (100 % util, 3 % SM), one starved rank at 12 %: the
    job averages 56 % utilization and is ``underutilized``."""
    return JobSummary.example(
        cluster="default",
        namespace=ns,
        job=f"Job/{name}",
        uid=uid,
        team="ml",
        gpus=2,
        pods=[pod],
        verdict="underutilized",
        gpu_util=0.56,
        sm_active=0.05,
        coverage=1.0,
        gpu_hours=4.0,
        per_gpu=[
            _gpu(ns, pod, 0, "low_sm_efficiency", 1.0, 0.03),
            _gpu(ns, pod, 1, "underutilized", 0.12, 0.07),
        ],
    )


def test_a_gpu_verdict_reads_the_jobs_opt_out(kube_admin, namespace, tmp_path) -> None:
    ns = namespace
    exempt = _job(kube_admin, ns, "exempt", annotations={"gpu-auditor.io/exempt": "true"})
    plain = _job(kube_admin, ns, "plain")
    jobs = [
        _straggler_job(ns, "exempt", exempt["uid"], exempt["pod"]),
        _straggler_job(ns, "plain", plain["uid"], plain["pod"]),
    ]
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    try:
        runner = PolicyRunner(parse_policies(POLICY, "p.yaml"), store, KubeActions(kube_admin), RunnerConfig())
        decisions = runner.run_cycle(jobs, now=T0, act=True)
    finally:
        store.close()
    assert [d.job for d in decisions] == [f"default/{ns}/Job/plain"]
    assert decisions[0].reason.startswith("underutilized: 1 of 2 GPUs (50% of its GPU-hours) meet it")
    assert _annotations(kube_admin, ns, "plain")["gpu-auditor.io/verdict"] == "underutilized"
    assert "gpu-auditor.io/verdict" not in _annotations(kube_admin, ns, "exempt")
    assert _events(kube_admin, ns, "exempt") == []
