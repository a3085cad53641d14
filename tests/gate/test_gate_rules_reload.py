"""Gate rules follow the policy files while the gate runs (no restart): the operator re-reads the
files every sweep interval, re-parses only changed texts, and a file that became invalid keeps
its last good rules. On the bed: ``gpu-auditor run`` admits a lineage clean, the policy file gains
a hold rule, and the next submission of the lineage is decided by it."""

from __future__ import annotations

from auditor.gate.stage import GateRules

HOLD = """apiVersion: gpu-auditor.io/v1alpha1
kind: GatePolicy
metadata: {name: hold-low-sm}
spec: {action: hold, verdicts: [low_sm_efficiency], atLeast: 2, ofLast: 5}
"""


def test_rules_change_with_the_files_and_a_broken_file_keeps_its_last_good_rules() -> None:
    files = {"gate.yaml": HOLD}
    reads: list[int] = []

    def read() -> dict[str, str]:
        reads.append(1)
        return dict(files)

    rules = GateRules(read)
    assert rules.refresh() and [r.name for r in rules.rules] == ["hold-low-sm"]
    assert not rules.refresh()  # same text: nothing parsed, nothing changed
    files["gate.yaml"] = HOLD.replace("atLeast: 2", "atLeast: 3")
    assert rules.refresh() and rules.rules[0].at_least == 3
    files["gate.yaml"] = HOLD.replace("action: hold", "action: explode")
    assert not rules.refresh() and rules.rules[0].at_least == 3  # invalid: the last good version stays
    assert any("gate.yaml" in e for e in rules.registry.errors)
    del files["gate.yaml"]
    assert rules.refresh() and rules.rules == []
    assert len(reads) == 5
