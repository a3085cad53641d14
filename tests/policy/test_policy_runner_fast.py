"""The policy runner's own logic behind fakes of its ports, no servers: the escalation ladder,
the requeue rate limit and per-job cap, requeue scoping (namespace/queue) and the reactivation
after the backoff. The fakes are ours (``EscalationRecord``, ``ClusterActions``); the real
store and the real Kubernetes/Kueue paths are proven in tests/policy against the test bed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

import pytest

from auditor.core.action_target import ActionTarget
from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary, SummaryFormatError
from auditor.core.violations import CLAIMED, DONE, FAILED, SKIPPED, WAITING, ViolationState
from auditor.policy.evaluate import JobFacts
from auditor.policy.loader import parse_policies
from auditor.policy.record import EscalationRecord
from auditor.policy.runner import PolicyRunner, RequeueSettings, RunnerConfig
from auditor.ports import ClusterActions

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)

LADDER = """apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: idle-gpus}
spec:
  mode: enforce
  verdicts: [idle]
  escalation:
    - actions: [annotate]
    - actions: [event]
      after: 10m
      cooldown: 5m
    - actions: [requeue]
      after: 30m
      cooldown: 5m
  requeue: {backoff: 20m, maxPerJob: 1}
"""


def summary(name: str, *, namespace: str = "ml", verdict: str = "idle", queue: str | None = None) -> JobSummary:
    return JobSummary.example(
        cluster="east", namespace=namespace, job=f"Job/{name}", team="t", verdict=verdict, queue=queue
    )


@dataclass
class Row:
    """An action row as the store's ActionRow has it (the fields the runner reads)."""

    id: int
    dedup_key: str
    decision_id: int
    job: JobKey
    policy: str
    action: str
    state: str
    created_at: datetime
    updated_at: datetime
    due_at: datetime | None = None
    result: dict = field(default_factory=dict)
    error: str | None = None
    attempts: int = 0


class FakeRecord:
    """The escalation record in memory, with the store's semantics the runner relies on: one
    open violation per job and policy, a step claimed once (its dedup key and the ladder's
    position), compare-and-set on an action's state."""

    def __init__(self) -> None:
        self.violations: dict[tuple[JobKey, str], dict] = {}
        self.episodes: dict[tuple[JobKey, str], int] = {}
        self.decision_rows: list[dict] = []
        self.rows: dict[str, Row] = {}

    def open_violation(
        self, job: JobKey, policy: str, now: datetime, evidence: dict, uid: str | None = None
    ) -> ViolationState:
        v = self.violations.get((job, policy))
        if v is None:
            episode = self.episodes.get((job, policy), 0) + 1
            self.episodes[(job, policy)] = episode
            v = self.violations[(job, policy)] = {
                "id": len(self.episodes) * 100 + episode,
                "episode": episode,
                "opened_at": now,
                "next": 0,
                "last": None,
            }
        return self._state(v)

    @staticmethod
    def _state(v: dict) -> ViolationState:
        return ViolationState(v["id"], v["episode"], v["opened_at"], v["next"], v["last"])

    def open_violations(
        self, job: JobKey | None = None, policy: str | None = None
    ) -> list[tuple[JobKey, str, ViolationState]]:
        return [
            (j, p, self._state(v))
            for (j, p), v in self.violations.items()
            if (job is None or j == job) and (policy is None or p == policy)
        ]

    def close_violation(self, job: JobKey, policy: str, now: datetime) -> bool:
        return self.violations.pop((job, policy), None) is not None

    def claim_step(
        self,
        job: JobKey,
        policy: str,
        violation: ViolationState,
        step: int,
        *,
        dedup_key: str,
        mode: str,
        action_names: list[str],
        action_keys: list[str],
        now: datetime,
        dry_run: bool,
        verdict: str,
        reason: str,
        evidence: dict,
    ) -> int | None:
        v = self.violations.get((job, policy))
        if v is None or v["next"] != step or any(d["dedup_key"] == dedup_key for d in self.decision_rows):
            return None
        v["next"], v["last"] = step + 1, now
        did = len(self.decision_rows) + 1
        self.decision_rows.append(
            {
                "id": did,
                "dedup_key": dedup_key,
                "step": step,
                "policy": policy,
                "job": job,
                "reason": reason,
                "evidence": evidence,
                "dry_run": dry_run,
            }
        )
        for name, key in zip(action_names, action_keys):
            self.rows[key] = Row(
                len(self.rows) + 1, key, did, job, policy, name, SKIPPED if dry_run else CLAIMED, now, now
            )
        return did

    def finish_action(
        self,
        key: str,
        state: str,
        now: datetime,
        *,
        result: dict | None = None,
        error: str | None = None,
        due_at: datetime | None = None,
    ) -> None:
        r = self.rows[key]
        self.rows[key] = replace(
            r, state=state, updated_at=now, result=result or {}, error=error, due_at=due_at, attempts=r.attempts + 1
        )

    def take_action(self, key: str, from_state: str, to_state: str, now: datetime) -> bool:
        r = self.rows[key]
        if r.state != from_state:
            return False
        self.rows[key] = replace(r, state=to_state, updated_at=now)
        return True

    def actions_in(self, states: Iterable[str], *, cluster: str | None = None, action: str | None = None) -> list[Any]:
        states = set(states)
        return [
            r
            for r in self.rows.values()
            if r.state in states
            and (cluster is None or r.job.cluster == cluster)
            and (action is None or r.action == action)
        ]

    def count_actions(
        self,
        action: str,
        *,
        since: datetime,
        cluster: str | None = None,
        states: Iterable[str] = (CLAIMED, DONE, WAITING),
    ) -> int:
        return len([r for r in self.actions_in(states, cluster=cluster, action=action) if r.created_at >= since])

    def count_job_actions(self, job: JobKey, action: str, states: Iterable[str] = (CLAIMED, DONE, WAITING)) -> int:
        return len([r for r in self.actions_in(states, action=action) if r.job == job])

    def decisions(
        self, *, since: datetime | None = None, until: datetime | None = None, job: JobKey | None = None
    ) -> list[dict]:
        return [d for d in self.decision_rows if job is None or d["job"] == job]

    def action_rows(self, keys: Iterable[str]) -> dict[str, Any]:
        return {k: self.rows[k] for k in keys if k in self.rows}

    def stale_claims(self, now: datetime, older_than: timedelta, *, cluster: str) -> list[Any]:
        return [r for r in self.actions_in([CLAIMED], cluster=cluster) if r.updated_at < now - older_than]


class FakeCluster:
    """The cluster actions: every call recorded; Workloads release their quota at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.annotated: list[tuple[ActionTarget, dict]] = []
        self.quota_held = False

    def facts(self, target: ActionTarget) -> JobFacts:
        return JobFacts(known=True)

    def annotate(self, target: ActionTarget, annotations: Mapping[str, Any]) -> dict:
        self.calls.append(("annotate", target.job))
        self.annotated.append((target, dict(annotations)))
        return {"annotated": [target.job], "missing": []}

    def event(
        self,
        target: ActionTarget,
        *,
        key: str,
        reason: str,
        note: str,
        action: str,
        now: datetime,
        type_: str = "Warning",
    ) -> dict:
        self.calls.append(("event", target.job))
        return {"event": key, "created": True}

    def requeue_target(self, target: ActionTarget) -> dict:
        return {
            "type": "workload",
            "namespace": target.namespace,
            "name": f"job-{target.key.name}",
            "priority": 0,
            "priority_boost": 0,
            "reserved": True,
        }

    def deactivate(self, target: dict, *, lower_priority_by: int = 0) -> dict:
        self.calls.append(("deactivate", target["name"]))
        return {**target, "active": False}

    def holds_quota(self, target: Mapping[str, Any]) -> bool | None:
        return self.quota_held

    def reactivate(self, target: dict) -> dict:
        self.calls.append(("reactivate", target["name"]))
        return {**target, "active": True}


def runner(record: FakeRecord, kube: FakeCluster, requeue: RequeueSettings | None = None) -> PolicyRunner:
    port_record: EscalationRecord = record
    port_kube: ClusterActions = kube
    return PolicyRunner(
        parse_policies(LADDER, "p.yaml"),
        kube=port_kube,
        config=RunnerConfig(cluster="east", requeue=requeue or RequeueSettings()),
        record=port_record,
    )


def steps(decisions: list) -> list[tuple[str, int | None]]:
    return [(d.job.rpartition("/")[2], d.step) for d in decisions]


def test_the_ladder_is_climbed_in_order_once_per_step_and_restarts_after_the_violation_closes() -> None:
    record, kube = FakeRecord(), FakeCluster()
    r = runner(record, kube)
    assert steps(r.run_cycle([summary("a")], now=NOW, act=True)) == [("a", 0)]
    # a replayed cycle, and one inside the cooldown/after of the next step, do nothing
    assert steps(r.run_cycle([summary("a")], now=NOW, act=True)) == [("a", None)]
    assert steps(r.run_cycle([summary("a")], now=NOW + timedelta(minutes=9), act=True)) == [("a", None)]
    assert steps(r.run_cycle([summary("a")], now=NOW + timedelta(minutes=10), act=True)) == [("a", 1)]
    assert kube.calls == [("annotate", "Job/a"), ("event", "Job/a")]
    # a judged cycle where the policy does not fire closes the violation; the next one starts at step 0
    assert r.run_cycle([summary("a", verdict="healthy")], now=NOW + timedelta(minutes=11), act=True) == []
    assert record.violations == {}
    assert steps(r.run_cycle([summary("a")], now=NOW + timedelta(minutes=12), act=True)) == [("a", 0)]
    assert {d["dedup_key"].rpartition("#")[0].rpartition("#")[2] for d in record.decision_rows} == {"v1", "v2"}


def test_insufficient_data_neither_fires_nor_closes() -> None:
    record, kube = FakeRecord(), FakeCluster()
    r = runner(record, kube)
    r.run_cycle([summary("a")], now=NOW, act=True)
    assert r.run_cycle([summary("a", verdict="insufficient_data")], now=NOW + timedelta(minutes=1), act=True) == []
    assert len(record.violations) == 1


def test_without_act_nothing_is_written_or_done() -> None:
    record, kube = FakeRecord(), FakeCluster()
    (d,) = runner(record, kube).run_cycle([summary("a")], now=NOW, act=False)
    assert (d.step, d.dry_run, d.actions) == (0, True, ["annotate"])
    assert record.violations == {} and record.rows == {} and kube.calls == []


def _to_requeue_step(r: PolicyRunner, jobs: list[dict]) -> datetime:
    """Climb the ladder to its requeue step for ``jobs``; the time that step is due."""
    r.run_cycle(jobs, now=NOW, act=True)
    r.run_cycle(jobs, now=NOW + timedelta(minutes=10), act=True)
    return NOW + timedelta(minutes=30)


def test_requeue_rate_limit_defers_without_claiming_and_the_step_runs_when_the_hour_allows() -> None:
    record, kube = FakeRecord(), FakeCluster()
    r = runner(record, kube, RequeueSettings(enabled=True, namespaces=frozenset({"ml"}), max_per_hour=1))
    jobs = [summary("a"), summary("b")]
    due = _to_requeue_step(r, jobs)
    first = {d.job.rpartition("/")[2]: d for d in r.run_cycle(jobs, now=due, act=True)}
    assert first["a"].results["requeue"]["state"] == WAITING
    assert first["b"].blocked == "rate limit: 1 requeues per hour in the cluster"
    # not claimed: b's ladder still stands at its requeue step
    assert record.open_violations(JobKey.of_document(summary("b").to_json()))[0][2].next_step == 2
    later = {d.job.rpartition("/")[2]: d for d in r.run_cycle(jobs, now=due + timedelta(minutes=61), act=True)}
    assert later["b"].results["requeue"]["state"] == WAITING
    assert [c for c in kube.calls if c[0] == "deactivate"] == [("deactivate", "job-a"), ("deactivate", "job-b")]


def test_requeue_is_scoped_to_the_listed_namespaces_and_queues() -> None:
    record, kube = FakeRecord(), FakeCluster()
    r = runner(record, kube, RequeueSettings(enabled=True, namespaces=frozenset({"ml"}), queues=frozenset({"batch"})))
    jobs = [summary("in-ns"), summary("other", namespace="web"), summary("queued", namespace="web", queue="batch")]
    due = _to_requeue_step(r, jobs)
    out = {d.job.rpartition("/")[2]: d for d in r.run_cycle(jobs, now=due, act=True)}
    assert out["in-ns"].results["requeue"]["state"] == WAITING
    assert out["queued"].results["requeue"]["state"] == WAITING
    assert out["other"].results["requeue"] == {
        "state": SKIPPED,
        "why": "requeue is not enabled for this namespace or queue",
    }
    assert ("deactivate", "job-other") not in kube.calls


def test_requeue_is_off_by_default_and_capped_per_job() -> None:
    record, kube = FakeRecord(), FakeCluster()
    r = runner(record, kube)
    due = _to_requeue_step(r, [summary("a")])
    (d,) = r.run_cycle([summary("a")], now=due, act=True)
    assert d.results["requeue"] == {"state": SKIPPED, "why": "requeue is disabled (settings)"}
    record2, kube2 = FakeRecord(), FakeCluster()
    r2 = runner(record2, kube2, RequeueSettings(enabled=True, namespaces=frozenset({"ml"}), max_per_hour=10))
    due = _to_requeue_step(r2, [summary("a")])
    r2.run_cycle([summary("a")], now=due, act=True)
    # the violation closes and opens again: its new ladder's requeue meets the per-job cap
    r2.run_cycle([summary("a", verdict="healthy")], now=due + timedelta(minutes=1), act=True)
    due2 = _to_requeue_step_at(r2, [summary("a")], due + timedelta(minutes=2))
    (d2,) = [d for d in r2.run_cycle([summary("a")], now=due2, act=True) if d.step is not None]
    assert d2.results["requeue"] == {"state": SKIPPED, "why": "requeue cap per job reached"}
    assert [c for c in kube2.calls if c[0] == "deactivate"] == [("deactivate", "job-a")]


def _to_requeue_step_at(r: PolicyRunner, jobs: list[dict], start: datetime) -> datetime:
    r.run_cycle(jobs, now=start, act=True)
    r.run_cycle(jobs, now=start + timedelta(minutes=10), act=True)
    return start + timedelta(minutes=30)


def test_reactivation_waits_for_the_quota_release_plus_the_backoff_and_happens_once() -> None:
    record, kube = FakeRecord(), FakeCluster()
    r = runner(record, kube, RequeueSettings(enabled=True, namespaces=frozenset({"ml"})))
    due = _to_requeue_step(r, [summary("a")])
    kube.quota_held = True
    (d,) = r.run_cycle([summary("a")], now=due, act=True)
    assert d.results["requeue"]["state"] == WAITING
    # the Workload still holds its quota: the backoff has not started
    assert r.run_cycle([], now=due + timedelta(minutes=25), act=True) == []
    kube.quota_held = False
    released = due + timedelta(minutes=26)
    assert r.run_cycle([], now=released, act=True) == []  # released now: due 20 min later
    assert r.run_cycle([], now=released + timedelta(minutes=19), act=True) == []
    (d,) = r.run_cycle([], now=released + timedelta(minutes=20), act=True)
    assert d.actions == ["reactivate"] and d.results["reactivate"]["state"] == DONE
    assert r.run_cycle([], now=released + timedelta(minutes=21), act=True) == []
    assert kube.calls.count(("reactivate", "job-a")) == 1


def _interrupt(record: FakeRecord) -> Row:
    """The cycle's one action row put back to claimed: a crash before its result was recorded."""
    (row,) = record.rows.values()
    record.rows[row.dedup_key] = replace(row, state=CLAIMED)
    return row


def test_an_interrupted_annotate_resumes_from_the_stored_job_ref_without_figures() -> None:
    record, kube = FakeRecord(), FakeCluster()
    r = runner(record, kube)
    s = JobSummary.example(
        cluster="east",
        namespace="ml",
        job="Job/a",
        team="t",
        verdict="idle",
        pods=["a-0"],
        gpu_util=0.5,
        waste_gpu_hours=3.0,
        uid="u-1",
    )
    r.run_cycle([s], now=NOW, act=True)
    first, first_ann = kube.annotated[0]
    assert first_ann["gpu-auditor.io/gpu-util"] == "50.0%"
    assert first_ann["gpu-auditor.io/waste-gpu-hours"] == "3.00"
    row = _interrupt(record)
    (d,) = r.run_cycle([], now=NOW + timedelta(minutes=11), act=True)
    assert (d.job, d.verdict, d.reason) == ("east/ml/Job/a", "idle", "resumed after an interruption")
    target, ann = kube.annotated[1]
    # the stored job_ref gives back the same target: the pods are annotated again
    assert target == first == ActionTarget.of_summary(s)
    # the figures are not stored with the decision: written as n/a, not made up
    assert (ann["gpu-auditor.io/verdict"], ann["gpu-auditor.io/gpu-util"], ann["gpu-auditor.io/waste-gpu-hours"]) == (
        "idle",
        "n/a",
        "n/a",
    )
    assert record.rows[row.dedup_key].state == DONE


def test_an_interrupted_step_whose_job_ref_has_no_identity_fails_instead_of_stopping_the_cycle() -> None:
    record, kube = FakeRecord(), FakeCluster()
    r = runner(record, kube)
    r.run_cycle([summary("a")], now=NOW, act=True)
    row = _interrupt(record)
    record.decision_rows[0]["evidence"] = {"job_ref": {"namespace": "ml"}}
    assert r.run_cycle([], now=NOW + timedelta(minutes=11), act=True) == []
    failed = record.rows[row.dedup_key]
    assert failed.state == FAILED and "job_ref unusable" in (failed.error or "")
    assert kube.calls == [("annotate", "Job/a")]


def test_action_target_round_trips_through_the_stored_job_ref() -> None:
    s = JobSummary.example(cluster="east", namespace="ml", job="Job/a", team="t", queue="q", pods=["a-0", "a-1"])
    t = ActionTarget.of_summary(s)
    assert t.to_ref() == {
        "cluster": "east",
        "namespace": "ml",
        "job": "Job/a",
        "uid": None,
        "team": "t",
        "queue": "q",
        "pods": ["a-0", "a-1"],
        "verdict": "healthy",
    }
    assert ActionTarget.of_ref(t.to_ref()) == t
    with pytest.raises(SummaryFormatError, match="pods"):
        ActionTarget.of_ref({**t.to_ref(), "pods": "a-0"})
