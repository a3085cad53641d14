"""Two clusters sharing one PostgreSQL store (issue 12, item 11), against the test bed.

Each cluster's operator resumes only its own interrupted actions: a step claimed by cluster
``east`` whose process died before the side effect ran is finished by ``east``'s next cycle,
never by ``west``'s, which would carry it out against its own API server (here both "clusters"
talk to the one test-bed apiserver, so a wrong resume shows as an annotation ``west`` wrote).
Times are fixed; nothing depends on the wall clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import yaml
from kubernetes import client as k8s

from auditor.actions import KubeActions
from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RunnerConfig
from auditor.store import Store
from auditor.store.decisions import CLAIMED, DONE, DecisionStore

pytestmark = pytest.mark.testbed

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
#: one step (annotate) on low SM activity: the smallest ladder with a Kubernetes side effect
POLICY = yaml.safe_dump(
    {
        "apiVersion": "gpu-auditor.io/v1alpha1",
        "kind": "GpuPolicy",
        "metadata": {"name": "low-sm"},
        "spec": {
            "mode": "enforce",
            "verdicts": ["low_sm_efficiency"],
            "conditions": [{"field": "sm_active", "op": "<=", "value": 0.3}],
            "escalation": [{"actions": ["annotate"]}],
        },
    }
)


class Crash(BaseException):
    """The process dying between claiming a step and carrying it out."""


class CrashingActions(KubeActions):
    def annotate(self, summary, annotations):  # type: ignore[override]
        raise Crash()


def _job(kube_admin, ns: str, name: str) -> str:
    job = k8s.BatchV1Api(kube_admin).create_namespaced_job(
        ns,
        k8s.V1Job(
            metadata=k8s.V1ObjectMeta(name=name),
            spec=k8s.V1JobSpec(
                template=k8s.V1PodTemplateSpec(
                    spec=k8s.V1PodSpec(restart_policy="Never", containers=[k8s.V1Container(name="c", image="busybox")])
                )
            ),
        ),
    )
    return job.metadata.uid


def _summary(cluster: str, ns: str, name: str, uid: str) -> JobSummary:
    return JobSummary.example(
        **{
            "cluster": cluster,
            "namespace": ns,
            "job": f"Job/{name}",
            "uid": uid,
            "team": "ml",
            "pods": [],
            "verdict": "low_sm_efficiency",
            "gpu_util": 0.97,
            "sm_active": 0.1,
            "coverage": 0.99,
            "gpu_hours": 1.0,
            "waste_gpu_hours": 0.9,
            "gpu_model": "NVIDIA H200",
            "gpus": 1,
        }
    )


def _annotations(kube_admin, ns: str, name: str) -> dict:
    return k8s.BatchV1Api(kube_admin).read_namespaced_job(name, ns).metadata.annotations or {}


def test_an_interrupted_action_is_resumed_only_by_its_own_cluster(kube_admin, namespace, postgres_url) -> None:
    ns = namespace
    uid = _job(kube_admin, ns, "bad")
    policies = parse_policies(POLICY, "p.yaml")
    store = Store.open(postgres_url)
    try:
        east = PolicyRunner(policies, store, CrashingActions(kube_admin), RunnerConfig(cluster="east"))
        with pytest.raises(Crash):
            east.run_cycle([_summary("east", ns, "bad", uid)], now=T0, act=True)
        repo = DecisionStore(store)
        job = JobKey("east", ns, "Job", "bad")
        assert [(a.action, a.state) for a in repo.actions(job=job)] == [("annotate", CLAIMED)]

        later = T0 + timedelta(minutes=11)  # past stale_claim_after (10 min): a resume is due
        west = PolicyRunner(policies, store, KubeActions(kube_admin), RunnerConfig(cluster="west"))
        assert west.run_cycle([], now=later, act=True) == []
        assert "gpu-auditor.io/verdict" not in _annotations(kube_admin, ns, "bad")
        assert [(a.action, a.state) for a in repo.actions(job=job)] == [("annotate", CLAIMED)]

        east = PolicyRunner(policies, store, KubeActions(kube_admin), RunnerConfig(cluster="east"))
        resumed = east.run_cycle([], now=later, act=True)
        assert [(d.job, d.reason) for d in resumed] == [(f"east/{ns}/Job/bad", "resumed after an interruption")]
        assert _annotations(kube_admin, ns, "bad")["gpu-auditor.io/verdict"] == "low_sm_efficiency"
        assert [(a.action, a.state) for a in repo.actions(job=job)] == [("annotate", DONE)]
    finally:
        store.close()
