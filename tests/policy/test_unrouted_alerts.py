"""An alert with no destination for its team (issue 12, item 10): recorded as skipped with the
reason, one warning per team, counted on the operator's /metrics, and listed by
``gpu-auditor actions``. On SQLite and the test bed's PostgreSQL; a real local Slack receiver
for the team that has a route; ``now`` is fixed."""

from __future__ import annotations

import json
import logging
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from policy_receivers import Receiver

from auditor.cli.main import main
from auditor.core.job_summary import JobSummary
from auditor.core.model import JobRef
from auditor.notify.http import RetryPolicy
from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.policy.loader import parse_policies
from auditor.policy.runner import NO_DESTINATION, PolicyRunner, Route, RunnerConfig
from auditor.store import Store
from auditor.store.decisions import DecisionStore

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=timezone.utc)
POLICY = """
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: alert-low-sm}
spec:
  mode: warn
  verdicts: [low_sm_efficiency]
  escalation:
    - actions: [notify]
"""
FAST = RetryPolicy(attempts=2, base=0.01, cap=0.05, max_wait=1, timeout=5)


def summary(team: str, name: str) -> JobSummary:
    return JobSummary.example(
        cluster="c1",
        namespace=f"ns-{team}",
        job=f"Job/{name}",
        team=team,
        verdict="low_sm_efficiency",
        sm_active=0.04,
        gpu_util=1.0,
        coverage=1.0,
        start=(T0 - timedelta(hours=2)).isoformat(),
        end=T0.isoformat(),
    )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.testbed)])
def db(request: pytest.FixtureRequest, tmp_path) -> str:
    return f"sqlite:///{tmp_path}/s.db" if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def test_alerts_without_destination_warn_once_per_team_count_and_list(db, caplog, capsys) -> None:
    slack = Receiver()
    jobs = [summary("a", "a1"), summary("a", "a2"), summary("b", "b1"), summary("routed", "r1")]
    store = Store.open(db)
    try:
        for s in jobs:
            store.upsert_job(
                JobRef("c1", s.namespace, s.key.kind, s.key.name, None, s.team), T0 - timedelta(hours=2), T0
            )
        config = RunnerConfig(cluster="c1", routes={"routed": Route(slack_url=slack.url)}, retry=FAST)
        runner = PolicyRunner(parse_policies(POLICY, "p.yaml"), store, None, config)
        metrics = OperatorMetrics()
        with caplog.at_level(logging.WARNING, logger="auditor.policy.runner"):
            decisions = runner.run_cycle(jobs[:2], now=T0, act=True)
            decisions += runner.run_cycle(jobs, now=T0 + timedelta(minutes=5), act=True)
        metrics.count_undelivered(decisions)
        rows = DecisionStore(store).actions(states=["skipped"])
    finally:
        store.close()
        slack.close()

    # one warning per team that has no destination, however many of its alerts were lost
    warned = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "team a " in warned[0] and "team b " in warned[1]
    assert "notifications.routes.a" in warned[0]
    # the routed team's alert went out, and only that one
    assert len(slack.accepted) == 1 and b"r1" in slack.accepted[0].body

    # every lost alert is a stored, skipped action naming the team and what to configure
    assert sorted((r.job.name, r.result["team"], r.result["reason"]) for r in rows) == [
        ("a1", "a", NO_DESTINATION),
        ("a2", "a", NO_DESTINATION),
        ("b1", "b", NO_DESTINATION),
    ]
    assert all("notifications.routes." in r.result["why"] for r in rows)

    # counted on the operator's /metrics (per team: a few labels, never one per job)
    server = HealthServer("127.0.0.1", 0, metrics=metrics, healthy=lambda: (True, ""), ready=lambda: (True, "")).start()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
    finally:
        server.stop()
    assert 'gpu_auditor_policy_alerts_undelivered_total{reason="no_destination",team="a"} 2.0' in text
    assert 'gpu_auditor_policy_alerts_undelivered_total{reason="no_destination",team="b"} 1.0' in text
    assert 'team="routed"' not in text

    # listable: `gpu-auditor actions --state skipped` shows them with the reason
    capsys.readouterr()
    since = (T0 - timedelta(hours=1)).isoformat()
    assert main(["actions", "--since", since, "--state", "skipped", "--db", db, "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(x["job"] for x in listed) == ["Job/a1", "Job/a2", "Job/b1"]
    assert all(x["action"] == "notify" and x["why"].startswith("no destination for team") for x in listed)
    assert main(["actions", "--since", since, "--db", db]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 5 and all(len(line) <= 120 for line in table)  # header + 4 alerts (one done)
    assert sum("skipped" in line and "no destination" in line for line in table) == 3
