"""A quiet start on the real apiserver (issue 30): the operator's policy stage under ``mode: audit``
leaves a violating job, its pod and its Events as they were and sends no alert, for every cycle
of its ladder's span; switched to ``enforce`` the same job gets the first step (annotation and
Event) and then its alert. The helpers and the enforce policy are test_policy_testbed's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from kubernetes import client as k8s
from policy_receivers import Receiver
from test_policy_testbed import POLICY, T0, _annotations, _events, _job, _store_job, _summary

from auditor.actions import KubeActions
from auditor.core.identity import JobKey
from auditor.operator_loop.policies import PolicyStage
from auditor.settings import Settings
from auditor.store import Store
from auditor.store.decisions import DecisionStore

pytestmark = pytest.mark.testbed

SLACK_ENV = "GPU_AUDITOR_TEST_QUIET_SLACK_URL"


@pytest.fixture
def slack():
    receiver = Receiver()
    yield receiver
    receiver.close()


def test_audit_writes_nothing_then_enforce_acts(kube_admin, namespace, tmp_path, slack, monkeypatch) -> None:
    monkeypatch.setenv(SLACK_ENV, slack.url)
    ns = namespace
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "low-sm.yaml").write_text(POLICY)
    bad = _job(kube_admin, ns, "bad")
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    _store_job(store, ns, "bad", bad["uid"], bad["pod"], 0.97, 0.1)
    s = _summary(ns, "bad", bad["pod"], bad["uid"], "low_sm_efficiency", 0.97, 0.1)

    def stage(mode: str) -> PolicyStage:
        settings = Settings(
            mode=mode,
            policies={"builtin": False, "dir": str(tmp_path / "policies")},
            notifications={"slack": {"webhook_url_env": SLACK_ENV}},
            features={"requeue": True},
            requeue={"namespaces": [ns]},
        )
        return PolicyStage(settings, store, KubeActions(kube_admin, "test"))

    try:
        quiet = stage("audit")
        for minute in range(6):  # past every step's cooldown: enforce would have requeued by now
            now = T0 + timedelta(minutes=minute)
            assert [d.dry_run for d in quiet.run([s], now=now) if d.step is not None] == [True]
            quiet.deliver(now, budget=5)
        assert not any(k.startswith("gpu-auditor.io/") for k in _annotations(kube_admin, ns, "bad"))
        pod = k8s.CoreV1Api(kube_admin).read_namespaced_pod(bad["pod"], ns)
        assert not any(k.startswith("gpu-auditor.io/") for k in pod.metadata.annotations or {})
        assert _events(kube_admin, ns, "bad") == [] and slack.requests == []
        job = JobKey("default", ns, "Job", "bad")
        (would,) = DecisionStore(store).decisions(job=job)
        assert (would["step"], would["dry_run"], would["evidence"]["install_mode"]) == (0, True, "audit")

        loud = stage("enforce")
        for minute in (10, 12):
            now = T0 + timedelta(minutes=minute)
            loud.run([s], now=now)
            loud.deliver(now, budget=5)
        assert _annotations(kube_admin, ns, "bad")["gpu-auditor.io/policy"] == "low-sm"
        assert [e.reason for e in _events(kube_admin, ns, "bad")] == ["GpuPolicyViolation"]
        assert len(slack.accepted) == 1  # step 1, after the job was told by step 0
        assert [d["step"] for d in DecisionStore(store).decisions(job=job) if not d["dry_run"]] == [0, 1]
    finally:
        store.close()
