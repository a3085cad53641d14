"""The gate's decision: tables of lineage histories and rules → admit / deprioritize / hold."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from auditor.core.gate import (
    AckKind,
    Acknowledgement,
    GateAction,
    GateMode,
    GateRule,
    LineageHistory,
    LineageRun,
    decide,
    replay,
)
from auditor.core.lineage import LineageKey

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
KEY = LineageKey("default", "ml", "train")
HOLD_3_OF_5 = GateRule("hold-low-sm", GateAction.HOLD, verdicts=frozenset({"low_sm_efficiency"}), at_least=3, of_last=5)
PROBATION_7D = GateRule(
    "probation",
    GateAction.DEPRIORITIZE,
    verdicts=frozenset({"idle", "low_sm_efficiency"}),
    within=timedelta(days=7),
    priority_class="gpu-probation",
)


def runs(*verdicts: str, days_ago: int = 10, findings: tuple[str, ...] = ()) -> tuple[LineageRun, ...]:
    """One run per verdict, a day apart, the last ``days_ago`` days before NOW."""
    n = len(verdicts)
    return tuple(
        LineageRun(
            job=f"Job/train-{i:05d}",
            verdict=v,
            start=NOW - timedelta(days=days_ago + n - 1 - i),
            end=NOW - timedelta(days=days_ago + n - 1 - i) + timedelta(hours=2),
            findings=findings,
        )
        for i, v in enumerate(verdicts)
    )


def history(*rs: LineageRun, acks: tuple[Acknowledgement, ...] = ()) -> LineageHistory:
    return LineageHistory(KEY, rs, acks, team="research")


LOW, OK = "low_sm_efficiency", "healthy"


@pytest.mark.parametrize(
    ("verdicts", "action"),
    [
        ((), GateAction.ADMIT),  # a first submission
        ((LOW, LOW), GateAction.ADMIT),  # two of five is not three
        ((LOW, OK, LOW, OK, LOW), GateAction.HOLD),  # three of the last five
        ((LOW, LOW, LOW, OK, OK, OK), GateAction.ADMIT),  # the three fell out of the last five
        ((LOW, LOW, OK, OK, OK, LOW), GateAction.ADMIT),  # last five hold two
        ((OK, LOW, LOW, LOW), GateAction.HOLD),
        ((LOW, "insufficient_data", LOW, "insufficient_data", LOW), GateAction.HOLD),  # no judgement: not a run
        ((LOW, "idle", LOW), GateAction.ADMIT),  # idle is not the flagged verdict
    ],
)
def test_hold_three_of_the_last_five(verdicts: tuple[str, ...], action: GateAction) -> None:
    d = decide(history(*runs(*verdicts)), [HOLD_3_OF_5], GateMode.ENFORCE, NOW)
    assert d.action is action and d.would is action
    assert (d.rule == "hold-low-sm") == (action is GateAction.HOLD)


def test_hold_says_why_with_evidence_and_how_to_release() -> None:
    d = decide(history(*runs(LOW, LOW, LOW)), [HOLD_3_OF_5], GateMode.ENFORCE, NOW, ack_hint="gpu-auditor ack ml/train")
    assert d.action is GateAction.HOLD
    assert d.reason == (
        "hold until acknowledged: lineage ml/train flagged low_sm_efficiency in 3 of its last 5 runs "
        "(rule hold-low-sm); to release: gpu-auditor ack ml/train"
    )
    assert d.evidence == [
        "Job/train-00000 low_sm_efficiency (2026-11-18)",
        "Job/train-00001 low_sm_efficiency (2026-11-19)",
        "Job/train-00002 low_sm_efficiency (2026-11-20)",
    ]
    assert d.until is None and d.acknowledged_until is None


def test_observe_admits_and_says_what_enforce_would_do() -> None:
    d = decide(history(*runs(LOW, LOW, LOW)), [HOLD_3_OF_5], GateMode.OBSERVE, NOW)
    assert d.action is GateAction.ADMIT and d.would is GateAction.HOLD
    assert d.reason.startswith("would hold until acknowledged: lineage ml/train")
    assert d.rule == "hold-low-sm" and len(d.evidence) == 3 and d.mode is GateMode.OBSERVE


def test_probation_for_seven_days_after_a_wasteful_run() -> None:
    wasteful_3_days_ago = runs(OK, "idle", days_ago=3)
    d = decide(history(*wasteful_3_days_ago), [PROBATION_7D], GateMode.ENFORCE, NOW)
    assert d.action is GateAction.DEPRIORITIZE and d.priority_class == "gpu-probation"
    assert d.until == wasteful_3_days_ago[1].start + timedelta(days=7)
    assert d.reason.startswith("deprioritize until 2026-12-04T12:00:00Z: lineage ml/train flagged idle/low_sm")
    # eight days later the run left the window
    later = decide(history(*wasteful_3_days_ago), [PROBATION_7D], GateMode.ENFORCE, NOW + timedelta(days=5))
    assert later.action is GateAction.ADMIT


def test_hold_wins_over_probation_whatever_the_order() -> None:
    h = history(*runs(LOW, LOW, LOW, days_ago=1))
    assert decide(h, [PROBATION_7D, HOLD_3_OF_5], GateMode.ENFORCE, NOW).rule == "hold-low-sm"


def test_acknowledgement_covers_the_runs_before_it_and_later_runs_count_again() -> None:
    rs = runs(LOW, LOW, LOW)
    ack = Acknowledgement(by="alice", at=NOW - timedelta(days=1), reason="fixed the data loader")
    d = decide(history(*rs, acks=(ack,)), [HOLD_3_OF_5], GateMode.ENFORCE, NOW)
    assert d.action is GateAction.ADMIT and d.rule is None
    assert d.reason == "acknowledged by alice: fixed the data loader" and d.acknowledged_by == "alice"
    assert len(d.evidence) == 3  # what the acknowledgement let through
    # three new flagged runs after the acknowledgement hold it again
    again = rs + tuple(LineageRun(f"Job/train-new{i}", LOW, start=NOW - timedelta(hours=10 - i)) for i in range(3))
    assert decide(history(*again, acks=(ack,)), [HOLD_3_OF_5], GateMode.ENFORCE, NOW).action is GateAction.HOLD


def test_an_expired_acknowledgement_no_longer_covers() -> None:
    ack = Acknowledgement(by="alice", at=NOW - timedelta(days=2), until=NOW - timedelta(hours=1))
    d = decide(history(*runs(LOW, LOW, LOW), acks=(ack,)), [HOLD_3_OF_5], GateMode.ENFORCE, NOW)
    assert d.action is GateAction.HOLD
    live = Acknowledgement(by="alice", at=NOW - timedelta(days=2), until=NOW + timedelta(days=1))
    d = decide(history(*runs(LOW, LOW, LOW), acks=(live,)), [HOLD_3_OF_5], GateMode.ENFORCE, NOW)
    assert d.action is GateAction.ADMIT and d.acknowledged_until == NOW + timedelta(days=1)


def test_an_acknowledgement_made_later_does_not_count_yet() -> None:
    ack = Acknowledgement(by="alice", at=NOW + timedelta(hours=1))
    assert decide(history(*runs(LOW, LOW, LOW), acks=(ack,)), [HOLD_3_OF_5], GateMode.ENFORCE, NOW).action is (
        GateAction.HOLD
    )


def test_snooze_admits_everything_until_it_ends() -> None:
    snooze = Acknowledgement(
        by="admin", at=NOW - timedelta(hours=1), until=NOW + timedelta(hours=5), kind=AckKind.SNOOZE, reason="demo"
    )
    d = decide(history(*runs(LOW, LOW, LOW, days_ago=0), acks=(snooze,)), [HOLD_3_OF_5], GateMode.ENFORCE, NOW)
    assert d.action is GateAction.ADMIT and d.reason == "snoozed by admin until 2026-11-30T17:00:00Z: demo"
    assert d.acknowledged_until == NOW + timedelta(hours=5)


def test_findings_flag_a_run_too() -> None:
    rule = GateRule("hold-one-sm", GateAction.HOLD, findings=frozenset({"single_sm_kernels"}), at_least=2)
    d = decide(history(*runs(OK, OK, findings=("single_sm_kernels",))), [rule], GateMode.ENFORCE, NOW)
    assert d.action is GateAction.HOLD


def test_selectors_scope_a_rule() -> None:
    scoped = GateRule("x", GateAction.HOLD, verdicts=frozenset({LOW}), namespaces=("prod-*",))
    assert decide(history(*runs(LOW)), [scoped], GateMode.ENFORCE, NOW).action is GateAction.ADMIT
    by_team = GateRule("x", GateAction.HOLD, verdicts=frozenset({LOW}), teams=("research",))
    assert decide(history(*runs(LOW)), [by_team], GateMode.ENFORCE, NOW).action is GateAction.HOLD
    excluded = GateRule("x", GateAction.HOLD, verdicts=frozenset({LOW}), exclude_namespaces=("ml",))
    assert decide(history(*runs(LOW)), [excluded], GateMode.ENFORCE, NOW).action is GateAction.ADMIT


def test_runs_after_now_do_not_count() -> None:
    future = tuple(LineageRun(f"Job/t{i}", LOW, start=NOW + timedelta(hours=i + 1)) for i in range(3))
    assert decide(history(*future), [HOLD_3_OF_5], GateMode.ENFORCE, NOW).action is GateAction.ADMIT


@pytest.mark.parametrize(
    "kw",
    [
        {"action": GateAction.ADMIT, "verdicts": frozenset({LOW})},
        {"action": GateAction.HOLD},
        {"action": GateAction.HOLD, "verdicts": frozenset({LOW}), "at_least": 4, "of_last": 3},
        {"action": GateAction.HOLD, "verdicts": frozenset({LOW}), "at_least": 0},
    ],
)
def test_rules_refuse_nonsense(kw: dict) -> None:
    with pytest.raises(ValueError):
        GateRule("bad", **kw)


def test_replay_decides_each_submission_on_the_runs_before_it() -> None:
    rs = runs(LOW, LOW, LOW, OK, LOW)
    out = replay(history(*rs), [HOLD_3_OF_5])
    assert [r.decision.action for r in out] == [
        GateAction.ADMIT,
        GateAction.ADMIT,
        GateAction.ADMIT,
        GateAction.HOLD,  # the 4th submission came after three flagged runs
        GateAction.HOLD,
    ]
    ack = Acknowledgement(by="bob", at=rs[3].start - timedelta(minutes=1))
    out = replay(history(*rs, acks=(ack,)), [HOLD_3_OF_5])
    assert [r.decision.action for r in out][3:] == [GateAction.ADMIT, GateAction.ADMIT]
    assert replay(history(*rs), [HOLD_3_OF_5], since=rs[4].start)[0].run == rs[4]


def test_decision_to_json() -> None:
    d = decide(history(*runs(LOW, LOW, LOW)), [HOLD_3_OF_5], GateMode.OBSERVE, NOW)
    j = d.to_json()
    assert j["action"] == "admit" and j["would"] == "hold" and j["rule"] == "hold-low-sm" and j["mode"] == "observe"


def test_mode_may_be_given_as_its_value() -> None:
    h = history(*runs(LOW, LOW, LOW))
    assert decide(h, [HOLD_3_OF_5], "enforce", NOW).action is GateAction.HOLD
    assert decide(h, [HOLD_3_OF_5], "observe", NOW).action is GateAction.ADMIT
    with pytest.raises(ValueError):
        decide(h, [HOLD_3_OF_5], "enforcing", NOW)
