"""A snoozed job's ladder stands still (issue 30): while its owner's snooze is in force the runner
takes no step on the job (no alert again, no Event, no requeue), for any policy; when it ends the
ladder goes on from the step it had reached. The clock is injected; the runner is driven through
the fakes of its ports (tests/policy/test_policy_runner_fast.py) and, for the default wiring, a
real SQLite store. The bed's requeue is tests/policy/test_snooze_requeue_testbed.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from test_policy_runner_fast import LADDER, NOW, FakeCluster, FakeRecord, summary

from auditor.core.identity import JobKey
from auditor.core.job_snooze import JobSnooze, in_force
from auditor.core.violations import CLAIMED
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RequeueSettings, RunnerConfig
from auditor.store import Store

REQUEUE = RequeueSettings(enabled=True, namespaces=frozenset({"ml"}))
JOB_A = JobKey("east", "ml", "Job", "a")


class FakeSnoozes:
    """The store's job snoozes in memory; counts the reads (one a cycle)."""

    def __init__(self) -> None:
        self.snoozes: list[JobSnooze] = []
        self.reads = 0

    def in_force(self, now: datetime, *, cluster: str | None = None) -> dict[JobKey, JobSnooze]:
        self.reads += 1
        return in_force(self.snoozes, now)


def runner(record: FakeRecord, kube: FakeCluster, snoozes: FakeSnoozes) -> PolicyRunner:
    config = RunnerConfig(cluster="east", requeue=REQUEUE)
    return PolicyRunner(parse_policies(LADDER, "p.yaml"), kube=kube, config=config, record=record, snoozes=snoozes)


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


def test_a_snooze_stops_the_requeue_and_the_ladder_resumes_after_it() -> None:
    """annotate at 0, Event at 10; snoozed for 24 h at 12: the requeue due at 30 is not taken
    (nor anything else) while the snooze lasts, and is the first thing done once it is over."""
    record, kube, snoozes = FakeRecord(), FakeCluster(), FakeSnoozes()
    r = runner(record, kube, snoozes)
    r.run_cycle([summary("a")], now=at(0), act=True)
    r.run_cycle([summary("a")], now=at(10), act=True)
    assert kube.calls == [("annotate", "Job/a"), ("event", "Job/a")]
    until = at(12) + timedelta(hours=24)
    snoozes.snoozes.append(JobSnooze(JOB_A, "link:team:t", at(12), until, via="link"))
    for minute in (30, 31, 60, 6 * 60, 24 * 60 + 11):
        (d,) = r.run_cycle([summary("a")], now=at(minute), act=True)
        assert d.step is None and d.blocked == "snoozed until 2026-03-03T09:12:00Z by link:team:t"
        assert d.outcome() == (True, "waiting: snoozed until 2026-03-03T09:12:00Z by link:team:t")
    assert kube.calls == [("annotate", "Job/a"), ("event", "Job/a")]  # no alert again, no requeue
    (v,) = record.violations.values()
    assert v["next"] == 2  # the ladder stands where it was
    (d,) = r.run_cycle([summary("a")], now=until, act=True)
    assert (d.step, d.actions, d.blocked) == (2, ["requeue"], None)
    assert ("deactivate", "job-a") in kube.calls
    assert snoozes.reads == 8  # one read a cycle, whatever the number of jobs and policies


def test_a_snooze_before_any_step_opens_no_violation_and_other_jobs_go_on() -> None:
    record, kube, snoozes = FakeRecord(), FakeCluster(), FakeSnoozes()
    snoozes.snoozes.append(JobSnooze(JOB_A, "console:alice", at(-1), at(60), via="console"))
    r = runner(record, kube, snoozes)
    a, b = r.run_cycle([summary("a"), summary("b")], now=at(0), act=True)
    assert a.step is None and a.blocked and a.blocked.startswith("snoozed until")
    assert (b.step, b.actions) == (0, ["annotate"]) and kube.calls == [("annotate", "Job/b")]
    assert list(record.violations) == [(JobKey("east", "ml", "Job", "b"), "idle-gpus")]
    (dry,) = r.run_cycle([summary("a")], now=at(30), act=False)  # a dry run says the same
    assert dry.step is None and dry.blocked
    (d,) = r.run_cycle([summary("a")], now=at(60), act=True)
    assert (d.step, d.actions) == (0, ["annotate"])


def test_the_runner_reads_the_stores_snoozes_by_default(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    try:
        config = RunnerConfig(cluster="east")
        r = PolicyRunner(parse_policies(LADDER, "p.yaml"), store, None, config)
        store.job_snoozes().snooze(JOB_A, "os:alice", at(60), "debugging", at(0))
        (d,) = r.run_cycle([summary("a")], now=at(1), act=True)
        assert d.blocked == "snoozed until 2026-03-02T10:00:00Z by os:alice (debugging)"
        assert store.decision_log().open_violations() == []
        (d,) = r.run_cycle([summary("a")], now=at(60), act=True)
        assert d.step == 0
    finally:
        store.close()


def test_an_interrupted_step_of_a_snoozed_job_waits_for_the_snooze_to_end() -> None:
    """A requeue claimed and never finished (a crash) would be resumed by the next cycle; while the
    job's owner snoozed it, it waits, and is resumed in the first cycle after the snooze."""
    record, kube, snoozes = FakeRecord(), FakeCluster(), FakeSnoozes()
    r = runner(record, kube, snoozes)
    for minute in (0, 10):
        r.run_cycle([summary("a")], now=at(minute), act=True)
    r.run_cycle([summary("a")], now=at(30), act=True)
    (row,) = [x for x in record.rows.values() if x.action == "requeue"]
    record.rows[row.dedup_key] = replace(row, state=CLAIMED, updated_at=at(30))  # the crash
    kube.calls.clear()
    snoozes.snoozes.append(JobSnooze(JOB_A, "os:alice", at(31), at(120)))
    r.run_cycle([], now=at(60), act=True)  # stale (10 min) but snoozed
    assert kube.calls == [] and record.rows[row.dedup_key].state == CLAIMED
    r.run_cycle([], now=at(120), act=True)
    assert ("deactivate", "job-a") in kube.calls
