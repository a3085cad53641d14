"""Escalation after a failed alert (issue 20, "escalation after a failed notify"): a job is never
stopped while its owner was not told; the failed alert is sent again until it arrives, once.

The policy runner on a real SQLite store, its alerts to a real local receiver behind the fault
proxy; the cluster is a recording fake of our ClusterActions port (the requeue itself is tested
on the bed's Kueue in tests/policy/test_kueue_requeue.py). ``now`` is injected.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

import pytest
from faultproxy import Fault

from auditor.core.action_target import ActionTarget
from auditor.core.job_summary import JobSummary
from auditor.errors import RetryableError
from auditor.notify.http import RetryPolicy
from auditor.policy.evaluate import JobFacts
from auditor.policy.loader import parse_policies
from auditor.policy.outbox import AlertOutbox
from auditor.policy.runner import PolicyRunner, RequeueSettings, Route, RunnerConfig
from auditor.store import Store

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
FAST = RetryPolicy(attempts=2, base=0.01, cap=0.02, max_wait=1, timeout=0.3, deadline=2.0)


def ladder(first: str = "[notify]", second: str | None = "[requeue]") -> str:
    text = f"""apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {{name: idle-gpus}}
spec:
  mode: enforce
  verdicts: [idle]
  escalation:
    - actions: {first}
"""
    if second:
        text += f"""    - actions: {second}
      after: 10m
"""
    return text + "  requeue: {backoff: 20m, maxPerJob: 1}\n"


class Cluster:
    """Records every call; what a stopped job is, is all the test asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.events_fail = False

    def facts(self, target: ActionTarget) -> JobFacts:
        return JobFacts(known=True)

    def annotate(self, target: ActionTarget, annotations: Mapping[str, Any]) -> dict:
        self.calls.append("annotate")
        return {"annotated": [target.job], "missing": []}

    def event(self, target: ActionTarget, *, key: str, reason: str, note: str, action: str, now: datetime) -> dict:
        if self.events_fail:
            raise RetryableError("creating the Event: HTTP 503 from the API server")
        self.calls.append("event")
        return {"event": key, "created": True}

    def requeue_target(self, target: ActionTarget) -> dict:
        return {"type": "workload", "namespace": target.namespace, "name": target.key.name, "reserved": False}

    def deactivate(self, target: dict, *, lower_priority_by: int = 0) -> dict:
        self.calls.append("deactivate")
        return {**target, "active": False}

    def holds_quota(self, target: Mapping[str, Any]) -> bool | None:
        return False

    def reactivate(self, target: dict) -> dict:
        self.calls.append("reactivate")
        return {**target, "active": True}


def job() -> JobSummary:
    return JobSummary.example(cluster="east", namespace="ml", job="Job/train", team="t", verdict="idle")


@pytest.fixture
def store(tmp_path) -> Any:
    s = Store.open(f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def make(store: Any, url: str, policy: str, **config: Any) -> tuple[PolicyRunner, Cluster]:
    cluster = Cluster()
    cfg = RunnerConfig(
        cluster="east",
        routes={"t": Route(slack_url=url)},
        requeue=RequeueSettings(enabled=True, namespaces=frozenset({"ml"})),
        retry=FAST,
        **config,
    )
    return PolicyRunner(parse_policies(policy, "p.yaml"), store, cluster, cfg), cluster


def test_a_failed_alert_holds_the_requeue_and_is_sent_again_until_it_arrives(store, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.status_code(500))
    runner, cluster = make(store, proxy.url, ladder())
    (d,) = runner.run_cycle([job()], now=T0, act=True)
    assert d.results["notify"]["state"] == "failed"

    (d,) = runner.run_cycle([job()], now=T0 + timedelta(minutes=15), act=True)
    assert "deactivate" not in cluster.calls, "the job was stopped although its owner was never told"
    assert d.blocked and "alert of step 0" in d.blocked, d.blocked
    assert receiver.requests == []

    proxy.always(None)  # the receiver is back
    runner.run_cycle([job()], now=T0 + timedelta(minutes=20), act=True)
    assert len(receiver.accepted) == 1
    assert cluster.calls.count("deactivate") == 1, "told at last: the ladder goes on"
    runner.run_cycle([job()], now=T0 + timedelta(minutes=40), act=True)
    assert len(receiver.requests) == 1 and cluster.calls.count("deactivate") == 1, "nothing twice"


def test_a_queued_alert_holds_the_ladder_until_the_queue_delivered_it(store, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.status_code(503))
    runner, cluster = make(store, proxy.url, ladder(), queue_alerts=True)
    outbox = AlertOutbox(runner.record, runner.config)
    (d,) = runner.run_cycle([job()], now=T0, act=True)
    assert d.results["notify"]["state"] == "queued"
    assert outbox.drain(T0).retrying and receiver.requests == []

    (d,) = runner.run_cycle([job()], now=T0 + timedelta(minutes=15), act=True)
    assert d.blocked == "waiting: the alert of step 0 is not delivered yet"
    assert "deactivate" not in cluster.calls

    proxy.always(None)
    assert outbox.drain(T0 + timedelta(minutes=16)).sent
    runner.run_cycle([job()], now=T0 + timedelta(minutes=17), act=True)
    assert cluster.calls.count("deactivate") == 1 and len(receiver.accepted) == 1


def test_an_alert_slack_did_not_confirm_is_not_resent_and_stops_nothing(store, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.slow(0.6))
    runner, cluster = make(store, proxy.url, ladder())
    (d,) = runner.run_cycle([job()], now=T0, act=True)
    assert d.results["notify"]["state"] == "failed" and d.results["notify"]["slack"]["unconfirmed"]
    (d,) = runner.run_cycle([job()], now=T0 + timedelta(minutes=15), act=True)
    assert d.blocked and "may not have arrived" in d.blocked
    assert "deactivate" not in cluster.calls
    assert len(receiver.requests) == 1, "an unconfirmed Slack message is not posted again"


def test_a_failed_event_is_tried_again_before_the_job_is_stopped(store, fault_proxy, receiver) -> None:
    runner, cluster = make(store, receiver.url, ladder("[event]"))
    cluster.events_fail = True
    (d,) = runner.run_cycle([job()], now=T0, act=True)
    assert d.results["event"]["state"] == "failed"
    (d,) = runner.run_cycle([job()], now=T0 + timedelta(minutes=15), act=True)
    assert d.blocked and "Event of step 0 failed again" in d.blocked and "deactivate" not in cluster.calls
    cluster.events_fail = False
    runner.run_cycle([job()], now=T0 + timedelta(minutes=20), act=True)
    assert cluster.calls[:2] == ["event", "deactivate"], "the Event first, then the stop (and its own notes)"


def test_a_later_step_that_stops_nothing_waits_for_the_alert_too(store, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.status_code(500))
    runner, cluster = make(store, proxy.url, ladder("[notify]", "[annotate]"))
    runner.run_cycle([job()], now=T0, act=True)
    (d,) = runner.run_cycle([job()], now=T0 + timedelta(minutes=15), act=True)
    assert d.blocked and "annotate" not in cluster.calls
