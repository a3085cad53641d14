"""A quiet start (issue 30): the installation's ``mode: audit`` decides and records every step but
writes nothing to users' objects and sends nothing; the settings turn it on and the operator says
so once. The runner is driven through the fakes of its ports (tests/policy/test_policy_runner_fast.py);
the real apiserver's side is tests/policy/test_quiet_start_testbed.py."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from test_policy_runner_fast import LADDER, NOW, FakeCluster, FakeRecord, Row, summary

from auditor.core.identity import JobKey
from auditor.core.violations import CLAIMED, QUEUED
from auditor.operator_loop.policies import PolicyStage
from auditor.policy.config import runner_config
from auditor.policy.loader import parse_policies
from auditor.policy.outbox import AlertOutbox, DrainResult
from auditor.policy.runner import PolicyRunner, RequeueSettings, RunnerConfig
from auditor.settings import Settings
from auditor.store import Store
from auditor.store.decisions import DecisionStore

#: requeue allowed for the job's namespace: only the installation's mode stands in the way
REQUEUE = RequeueSettings(enabled=True, namespaces=frozenset({"ml"}))


def audit_runner(record: FakeRecord, kube: FakeCluster, *, audit_only: bool = True) -> PolicyRunner:
    config = RunnerConfig(cluster="east", requeue=REQUEUE, audit_only=audit_only)
    return PolicyRunner(parse_policies(LADDER, "p.yaml"), kube=kube, config=config, record=record)


def test_audit_decides_each_cycle_moves_no_ladder_and_touches_nothing() -> None:
    """An enforce policy (annotate, then an Event, then a requeue) under the installation's audit:
    its first step is decided, as a dry run, every cycle; no ladder moves (a step "taken" in audit
    would let enforce skip the steps that tell the user) and no call reaches the cluster."""
    record, kube = FakeRecord(), FakeCluster()
    r = audit_runner(record, kube)
    for minute in (0, 10, 30, 31):
        (d,) = r.run_cycle([summary("a")], now=NOW + timedelta(minutes=minute), act=True)
        assert (d.step, d.actions, d.dry_run, d.results) == (0, ["annotate"], True, {})
    assert kube.calls == [] and record.violations == {} and record.rows == {} and record.decision_rows == []


def test_after_audit_enforce_starts_the_ladder_at_its_first_step() -> None:
    record, kube = FakeRecord(), FakeCluster()
    audit_runner(record, kube).run_cycle([summary("a")], now=NOW, act=True)
    (d,) = audit_runner(record, kube, audit_only=False).run_cycle(
        [summary("a")], now=NOW + timedelta(hours=1), act=True
    )
    assert (d.step, d.dry_run) == (0, False) and kube.calls == [("annotate", "Job/a")]


def test_audit_still_reactivates_a_job_requeued_before_it() -> None:
    """A job requeued under enforce is given back when its backoff is over, in audit too: that
    undoes the operator's own write."""
    record, kube = FakeRecord(), FakeCluster()
    enforce = audit_runner(record, kube, audit_only=False)
    for minute in (0, 10, 30):
        enforce.run_cycle([summary("a")], now=NOW + timedelta(minutes=minute), act=True)
    assert ("deactivate", "job-a") in kube.calls
    audit = audit_runner(record, kube)
    assert audit.run_cycle([], now=NOW + timedelta(minutes=31), act=True) == []  # released: due 20 min later
    (d,) = audit.run_cycle([], now=NOW + timedelta(minutes=51), act=True)
    assert d.actions == ["reactivate"] and kube.calls[-1] == ("reactivate", "job-a")


def test_audit_resumes_no_interrupted_step_and_enforce_does() -> None:
    """A step an acting operator claimed and never finished waits under audit (it would write to the
    job); switched to enforce, it is resumed."""
    record, kube = FakeRecord(), FakeCluster()
    audit_runner(record, kube, audit_only=False).run_cycle([summary("a")], now=NOW, act=True)
    (row,) = record.rows.values()
    record.rows[row.dedup_key] = replace(row, state=CLAIMED)
    kube.calls.clear()
    audit_runner(record, kube).run_cycle([], now=NOW + timedelta(minutes=11), act=True)
    assert kube.calls == [] and record.rows[row.dedup_key].state == CLAIMED
    (d,) = audit_runner(record, kube, audit_only=False).run_cycle([], now=NOW + timedelta(minutes=12), act=True)
    assert d.reason == "resumed after an interruption" and kube.calls == [("annotate", "Job/a")]


def test_audit_sends_no_queued_alert() -> None:
    """An alert queued before the switch to audit stays queued: nothing is sent to users."""
    record = FakeRecord()
    job = JobKey("east", "ml", "Job", "a")
    record.rows["k#notify"] = Row(1, "k#notify", 1, job, "p", "notify", QUEUED, NOW, NOW, result={"channels": {}})
    outbox = AlertOutbox(record, RunnerConfig(cluster="east", audit_only=True))
    assert outbox.waiting() and outbox.drain(NOW + timedelta(hours=1)) == DrainResult()
    assert record.rows["k#notify"].state == QUEUED


@pytest.mark.parametrize(
    ("mode", "audit_only", "said"),
    [
        ("audit", True, "mode audit: policies decide and record; nothing is written to users' objects"),
        ("enforce", False, "mode enforce: each policy acts in its own mode"),
    ],
)
def test_the_settings_mode_reaches_the_runner_and_is_logged_once(
    mode: str, audit_only: bool, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="auditor.policy.config"):
        config = runner_config(Settings(mode=mode), environ={})
    assert config.audit_only is audit_only
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mode ")]
    assert line.startswith(said)


def test_the_settings_refuse_another_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        Settings(mode="quiet")  # type: ignore[arg-type]


def test_without_a_settings_file_the_mode_is_enforce() -> None:
    """The CLI and a hand-written settings file act as before; the chart's default is audit
    (tests/chart/test_quiet_start_chart.py)."""
    assert Settings().mode == "enforce"


def test_the_operator_records_audits_would_do_decisions_once(tmp_path: Path) -> None:
    """The operator's policy stage under ``mode: audit`` (a real SQLite store): the step it would
    take is recorded once as a dry run marked ``install_mode: audit``; nothing else is written."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "ladder.yaml").write_text(LADDER)
    settings = Settings(mode="audit", cluster="east", policies={"builtin": False, "dir": str(tmp_path / "policies")})
    store, kube = Store.open(f"sqlite:///{tmp_path}/s.db"), FakeCluster()
    try:
        stage = PolicyStage(settings, store, kube)
        for minute in (0, 10, 30):
            stage.run([summary("a")], now=NOW + timedelta(minutes=minute))
        assert stage.deliver(NOW + timedelta(minutes=31), budget=1) == DrainResult()
        (row,) = DecisionStore(store).decisions(job=JobKey("east", "ml", "Job", "a"))
        assert (row["step"], row["dry_run"], row["violation_id"], row["evidence"]["install_mode"]) == (
            0,
            True,
            None,
            "audit",
        )
        assert kube.calls == []
    finally:
        store.close()
