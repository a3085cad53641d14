"""Alerts and weekly reports off the cycle's critical path (issue 20, "slow receivers"): a hung
receiver never delays the policy run, the queue is persisted and bounded, every alert arrives
once, a retried one keeps its idempotency key, and an alert's retries end at its deadline.

The policy runner and the queue (:class:`~auditor.policy.outbox.AlertOutbox`) on a real SQLite
store; real local receivers behind the fault proxy; ``now`` is injected; timeouts are short.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from faultproxy import Fault

from auditor.core.job_summary import JobSummary
from auditor.notify import SlackNotifier
from auditor.notify.http import RetryPolicy
from auditor.policy.loader import parse_policies
from auditor.policy.outbox import AlertOutbox
from auditor.policy.runner import PolicyRunner, Route, RunnerConfig
from auditor.reports import Destinations, IsoWeek, ReportOptions, build_trigger, send_due_reports
from auditor.store import Store
from auditor.store.reports import ReportStore

sys.path.insert(0, str(Path(__file__).parent.parent / "reports"))
from reportgen import GenJob, store_jobs

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
SHORT = RetryPolicy(attempts=3, base=0.01, cap=0.02, max_wait=1, timeout=0.4, deadline=1.0)
POLICY = """apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: idle-gpus}
spec:
  mode: warn
  verdicts: [idle]
  escalation:
    - actions: [notify]
"""


def jobs(n: int) -> list[JobSummary]:
    return [
        JobSummary.example(cluster="east", namespace="ml", job=f"Job/train-{i}", team="t", verdict="idle")
        for i in range(n)
    ]


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/s.db"


def queue(store: Any, route: Route, **config: Any) -> tuple[PolicyRunner, AlertOutbox]:
    cfg = RunnerConfig(cluster="east", routes={"t": route}, retry=SHORT, queue_alerts=True, **config)
    runner = PolicyRunner(parse_policies(POLICY, "p.yaml"), store, None, cfg)
    return runner, AlertOutbox(runner.record, cfg)


def test_a_hung_receiver_delays_neither_the_cycle_nor_the_other_alerts(db, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.hang(10))
    store = Store.open(db)
    try:
        runner, outbox = queue(store, Route(webhook_url=proxy.url, webhook_secret="k"))
        t = time.monotonic()
        decisions = runner.run_cycle(jobs(10), now=T0, act=True)
        took = time.monotonic() - t
        assert {d.results["notify"]["state"] for d in decisions} == {"queued"}
        assert took < 3.0, f"the policy run took {took:.1f} s with a hung receiver (inline: 10 x 1 s)"

        t = time.monotonic()
        first = outbox.drain(T0, budget=5)
        took = time.monotonic() - t
        assert len(first.retrying) == 10 and took < 1.5, (first, took)  # one timeout, not ten
        assert len(proxy.requests) == 1
    finally:
        store.close()

    proxy.always(None)  # the receiver answers again; the operator restarted meanwhile
    store = Store.open(db)
    try:
        _, outbox = queue(store, Route(webhook_url=proxy.url, webhook_secret="k"))
        done = outbox.drain(T0 + timedelta(minutes=1))
        assert len(done.sent) == 10 and not done.failed
        assert outbox.drain(T0 + timedelta(minutes=2)).tried == 0
    finally:
        store.close()
    keys = [r.headers["Idempotency-Key"] for r in receiver.accepted]
    assert len(keys) == 10 and len(set(keys)) == 10, "every alert once, none lost"


def test_a_hung_slack_costs_one_alert_it_may_have_got_and_the_rest_go_out_once(db, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.slow(0.8))
    store = Store.open(db)
    try:
        runner, outbox = queue(store, Route(slack_url=proxy.url))
        runner.run_cycle(jobs(3), now=T0, act=True)
        first = outbox.drain(T0)
        assert len(first.failed) == 1 and len(first.retrying) == 2  # no answer: not resent; the rest wait
        proxy.always(None)
        assert len(outbox.drain(T0 + timedelta(seconds=30)).sent) == 2
        (row,) = runner.record.actions_in(["failed"], action="notify")  # type: ignore[union-attr]
        assert row.result["slack"]["unconfirmed"] and "may have arrived; not resent" in row.error
    finally:
        store.close()
    time.sleep(0.9)
    texts = [r.json()["text"] for r in receiver.requests]
    assert len(texts) == 3 and len(set(texts)) == 3, "each alert reached Slack exactly once"


def test_alerts_sent_within_a_command_cost_one_deadline_per_hung_receiver(db, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.hang(10))
    store = Store.open(db)
    try:
        cfg = RunnerConfig(cluster="east", routes={"t": Route(webhook_url=proxy.url, webhook_secret="k")}, retry=SHORT)
        runner = PolicyRunner(parse_policies(POLICY, "p.yaml"), store, None, cfg)  # audit --act: no queue
        t = time.monotonic()
        decisions = runner.run_cycle(jobs(5), now=T0, act=True)
        took = time.monotonic() - t
    finally:
        store.close()
    assert took < 2.5, f"{took:.1f} s for 5 alerts to one hung receiver (deadline 1 s)"
    errors = [d.results["notify"]["error"] for d in decisions]
    assert all(d.results["notify"]["state"] == "failed" for d in decisions) and len(proxy.requests) <= 3
    assert errors[1:] == ["webhook: not sent: this receiver gave no answer earlier in this cycle"] * 4


def test_the_queue_is_bounded_and_says_so(db, receiver) -> None:
    store = Store.open(db)
    try:
        runner, _ = queue(store, Route(slack_url=receiver.url), queue_limit=3)
        states = [d.results["notify"] for d in runner.run_cycle(jobs(5), now=T0, act=True)]
        assert [s["state"] for s in states] == ["queued"] * 3 + ["failed"] * 2
        assert states[-1]["error"] == "slack: the delivery queue is full (3 alerts waiting)"
    finally:
        store.close()


def test_retries_end_at_the_alerts_deadline(db, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).always(Fault.status_code(503))
    store = Store.open(db)
    try:
        runner, outbox = queue(store, Route(slack_url=proxy.url), queue_deadline=timedelta(minutes=10))
        runner.run_cycle(jobs(1), now=T0, act=True)
        assert outbox.drain(T0).retrying and outbox.drain(T0 + timedelta(minutes=5)).retrying
        last = outbox.drain(T0 + timedelta(minutes=11))
        assert len(last.failed) == 1
        (row,) = runner.record.actions_in(["failed"], action="notify")  # type: ignore[union-attr]
        assert "gave up after 3 attempt(s) by its deadline" in row.error
        assert outbox.drain(T0 + timedelta(minutes=12)).tried == 0
    finally:
        store.close()


def test_a_webhook_retried_by_the_queue_keeps_its_idempotency_key(db, fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).script(Fault.slow(0.8))
    store = Store.open(db)
    try:
        runner, outbox = queue(store, Route(webhook_url=proxy.url, webhook_secret="k"))
        runner.run_cycle(jobs(1), now=T0, act=True)
        assert outbox.drain(T0).retrying
        time.sleep(0.5)
        assert outbox.drain(T0 + timedelta(minutes=1)).sent
    finally:
        store.close()
    keys = [r.headers["Idempotency-Key"] for r in receiver.requests]
    assert len(keys) == 2 and len(set(keys)) == 1, "the receiver sees one key twice and keeps one"


def test_a_weekly_report_to_a_slow_slack_goes_out_once(tmp_path, fault_proxy, receiver) -> None:
    week = IsoWeek(2026, 43)
    fire = datetime(2026, 10, 26, 8, 0, tzinfo=timezone.utc)
    proxy = fault_proxy(receiver.url).always(Fault.slow(0.8))
    store = Store.open(f"sqlite:///{tmp_path}/r.db")
    try:
        start, _ = week.bounds(timezone.utc)
        store_jobs(store, [GenJob("vision", "train", start + timedelta(days=1), 10, 1, "healthy")], now=fire)
        dest = Destinations(admin_slack=SlackNotifier(proxy.url, retry=SHORT))
        kw: dict = {"trigger": build_trigger("mon 08:00"), "destinations": dest, "options": ReportOptions()}
        t = time.monotonic()
        first = send_due_reports(store, fire, **kw)
        assert time.monotonic() - t < 3 and first.failed
        again = send_due_reports(store, fire + timedelta(hours=1), **kw)
        assert not again.sent and not again.failed
        (row,) = ReportStore(store).deliveries()
        assert row["status"] == "unconfirmed" and "may have arrived; not resent" in row["error"]
    finally:
        store.close()
    time.sleep(0.9)
    assert len(receiver.requests) == 1, "Slack got the report once"
