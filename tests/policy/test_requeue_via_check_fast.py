"""The ladder's choice between the gate's check and ``spec.active`` for a requeue, behind fakes of
its ports (the real paths on Kueue: tests/policy/test_ladder_requeue_via_check.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from test_policy_runner_fast import LADDER, FakeCluster, FakeRecord, _to_requeue_step, summary

from auditor.core.violations import DONE, WAITING
from auditor.errors import PermanentError
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RequeueSettings, RunnerConfig
from auditor.ports import CheckRequeue


class FakeCheck:
    """The gate's requeue port: answers ``answer`` (or raises it) and records what it was asked."""

    def __init__(self, answer: dict | Exception) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, int]] = []

    def requeue(
        self, workload: Mapping[str, Any], message: str, *, backoff_s: int, lower_priority_by: int, now: datetime
    ) -> dict:
        self.asked.append((str(workload["name"]), message, backoff_s))
        if isinstance(self.answer, Exception):
            raise self.answer
        return dict(self.answer)


def _requeue(check: FakeCheck) -> tuple[dict, FakeRecord, FakeCluster]:
    record, kube = FakeRecord(), FakeCluster()
    port: CheckRequeue = check
    r = PolicyRunner(
        parse_policies(LADDER, "p.yaml"),
        kube=kube,
        config=RunnerConfig(cluster="east", requeue=RequeueSettings(enabled=True, namespaces=frozenset({"ml"}))),
        record=record,
        check_requeue=port,
    )
    due = _to_requeue_step(r, [summary("a")])
    (d,) = r.run_cycle([summary("a")], now=due, act=True)
    return d.results["requeue"], record, kube


def test_a_requeue_the_check_took_is_done_and_never_deactivated() -> None:
    check = FakeCheck({"used": True, "checks": ["gpu-efficiency"], "cluster_queue": "gpu", "pending_workloads": 2})
    result, record, kube = _requeue(check)
    assert check.asked == [("job-a", "gpu-auditor: requeued by policy idle-gpus: idle: verdict is idle", 1200)]
    assert result["state"] == DONE and result["path"] == "admission-check" and result["pending_workloads"] == 2
    (row,) = [r for r in record.rows.values() if r.action == "requeue"]
    assert row.state == DONE and row.due_at is None
    assert ("deactivate", "job-a") not in kube.calls


def test_the_check_declining_or_failing_leaves_the_spec_active_path_saying_why() -> None:
    result, _, kube = _requeue(FakeCheck({"used": False, "why": "no Workload waits in ClusterQueue gpu"}))
    assert result["state"] == WAITING and result["path"] == "spec.active"
    assert result["admission_check_not_used"] == "no Workload waits in ClusterQueue gpu"
    assert ("deactivate", "job-a") in kube.calls

    result, _, kube = _requeue(FakeCheck(PermanentError("write the check state: HTTP 403 Forbidden")))
    assert result["state"] == WAITING and result["path"] == "spec.active"
    assert result["admission_check_not_used"].startswith("the admission check's Retry failed: write the check")
    assert ("deactivate", "job-a") in kube.calls
