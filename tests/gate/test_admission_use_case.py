"""The admission use-case with the real core ``decide`` and an in-memory history port: what the
check says (Ready / Rejected and the message) in observe and enforce, and within its deadline
when the store hangs or fails (fail-open by default, fail-closed on request)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from auditor.core.gate import GateAction, GateMode, GateRule, LineageHistory, LineageRun, decide
from auditor.core.lineage import LineageKey
from auditor.errors import BadInput, StoreError
from auditor.gate.admission import READY, REJECTED, AdmissionGate, GateSettings

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
KEY = LineageKey("default", "ml", "train")
CLEAN = LineageKey("default", "ml", "clean")
HOLD = GateRule("hold-low-sm", GateAction.HOLD, verdicts=frozenset({"low_sm_efficiency"}), at_least=3, of_last=5)
PROBATION = GateRule("probation", GateAction.DEPRIORITIZE, verdicts=frozenset({"idle"}), within=timedelta(days=7))


def _runs(*verdicts: str) -> tuple[LineageRun, ...]:
    return tuple(
        LineageRun(job=f"Job/train-{i}", verdict=v, start=NOW - timedelta(days=len(verdicts) - i))
        for i, v in enumerate(verdicts)
    )


class Histories:
    """The history port, in memory; ``block`` makes reads hang until set, ``fail`` makes them raise."""

    def __init__(self, **by_lineage: tuple[LineageRun, ...]) -> None:
        self.runs = by_lineage
        self.block: threading.Event | None = None
        self.fail: Exception | None = None

    def history(self, key: LineageKey, now: datetime) -> LineageHistory:
        if self.block is not None:
            self.block.wait(30)
        if self.fail is not None:
            raise self.fail
        return LineageHistory(key, self.runs.get(key.lineage, ()))


def _decide(history, rules, mode, now):
    return decide(history, rules, GateMode(mode), now)


def _gate(store: Histories, **settings) -> AdmissionGate:
    return AdmissionGate(store, _decide, [HOLD, PROBATION], GateSettings(**settings))


FLAGGED = _runs("low_sm_efficiency", "low_sm_efficiency", "healthy", "low_sm_efficiency")


def test_a_clean_lineage_is_ready():
    v = _gate(Histories(train=FLAGGED)).verdict(CLEAN, NOW)
    assert (v.state, v.failure, v.hold) == (READY, None, False)
    assert "no gate rule fires" in v.message


def test_observe_admits_and_says_it_would_hold():
    v = _gate(Histories(train=FLAGGED)).verdict(KEY, NOW)
    assert (v.state, v.would, v.hold) == (READY, "hold", False)
    assert v.message.startswith("gpu-auditor (observe mode): admitted; enforce would hold")
    assert "gpu-auditor ack ml/train" in v.message and "Job/train-0 low_sm_efficiency" in v.message


def test_enforce_rejects_and_names_the_acknowledgement():
    v = _gate(Histories(train=FLAGGED), mode="enforce").verdict(KEY, NOW)
    assert (v.state, v.hold) == (REJECTED, True)
    assert v.message.startswith("gpu-auditor: held, hold until acknowledged: lineage ml/train flagged")
    assert v.message.endswith("acknowledge with `gpu-auditor ack ml/train` and the job is re-admitted")


def test_enforce_probation_is_admitted_deprioritized():
    v = _gate(Histories(train=_runs("idle")), mode="enforce").verdict(KEY, NOW)
    assert (v.state, v.probation, v.hold) == (READY, True, False)
    assert v.message.startswith("gpu-auditor: admitted at probation priority")


def test_a_hung_store_admits_within_the_deadline_fail_open():
    store = Histories(train=FLAGGED)
    store.block = threading.Event()
    try:
        v = _gate(store, mode="enforce", timeout=0.2).verdict(KEY, NOW)
    finally:
        store.block.set()
    assert (v.state, v.decision) == (READY, None)
    assert 0.2 <= v.seconds < 1.0
    assert (
        v.message
        == "gpu-auditor: admitted without a decision, no decision within 0.2 s (the store did not answer) (fail-open)"
    )


def test_a_failing_store_rejects_when_fail_closed():
    store = Histories(train=FLAGGED)
    store.fail = StoreError("read the history of lineage ml/train: connection refused", retryable=True)
    v = _gate(store, mode="enforce", fail_closed=True).verdict(KEY, NOW)
    assert (v.state, v.decision, v.hold) == (REJECTED, None, False)
    assert "the store could not be read: read the history of lineage ml/train: connection refused" in v.message
    assert "fail-closed" in v.message


def test_bad_settings_name_the_key():
    with pytest.raises(BadInput, match="gate.mode: 'strict'"):
        GateSettings(mode="strict")
    with pytest.raises(BadInput, match="gate.timeout"):
        GateSettings(timeout=0)
