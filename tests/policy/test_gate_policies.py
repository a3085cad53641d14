"""Gate rules are policies: ``kind: GatePolicy`` documents, validated with file:line, simulated over history."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from auditor.core.gate import GateAction, GateMode, LineageHistory, LineageRun, decide
from auditor.core.lineage import LineageKey
from auditor.policy.backtest import simulate_gate
from auditor.policy.loader import PolicyError, PolicyRegistry, load_all, parse_gate_policies, parse_policies

_CLI = str(Path(sys.executable).with_name("gpu-auditor"))
ROOT = Path(__file__).parents[2]
#: a whole audit-JSON object (the backtest reads typed summaries), re-identified per run
TEMPLATE = json.loads((ROOT / "tests" / "golden" / "audit" / "demo.json").read_text())[0]

G = """apiVersion: gpu-auditor.io/v1alpha1
kind: GatePolicy
metadata: {name: hold-low-sm}
spec:
  action: hold
  verdicts: [low_sm_efficiency]
  atLeast: 3
  ofLast: 5
  selector: {namespaces: [ml-*]}
"""
P = """apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: tell}
spec:
  verdicts: [idle]
  escalation: [{actions: [annotate]}]
"""


def test_a_gate_policy_becomes_the_cores_rule() -> None:
    (g,) = parse_gate_policies(G, "g.yaml")
    rule = g.rule()
    assert (rule.name, rule.action, rule.verdicts, rule.at_least, rule.of_last, rule.namespaces) == (
        "hold-low-sm",
        GateAction.HOLD,
        frozenset({"low_sm_efficiency"}),
        3,
        5,
        ("ml-*",),
    )
    assert g.describe() == "gate: hold when flagged low_sm_efficiency in 3 of its last 5 runs"


def test_both_kinds_live_in_one_file_and_each_parser_takes_its_own() -> None:
    text = P + "---\n" + G
    assert [p.name for p in parse_policies(text, "x.yaml")] == ["tell"]
    assert [p.name for p in parse_gate_policies(text, "x.yaml")] == ["hold-low-sm"]
    reg = PolicyRegistry()
    assert reg.update({"x.yaml": text}) == []
    assert [p.name for p in reg.policies] == ["tell"] and [p.name for p in reg.gate_policies] == ["hold-low-sm"]


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (("  atLeast: 3", "  atLeast: 6"), "g.yaml:4: spec: atLeast 6 can never be reached in ofLast 5 runs"),
        (("  action: hold", "  action: block"), "g.yaml:5: spec.action: Input should be 'hold' or 'deprioritize'"),
        (("[low_sm_efficiency]", "[low_sm]"), "g.yaml:6: spec.verdicts: unknown verdict 'low_sm'"),
        (("[low_sm_efficiency]", "[healthy]"), "healthy never flags"),
        (("  verdicts: [low_sm_efficiency]\n", ""), "g.yaml:4: spec: a gate rule needs verdicts or findings"),
        (("  action: hold\n", ""), "g.yaml:4: spec.action: required: what the gate rule does to a re-submission"),
        (("  ofLast: 5", "  ofLast: 5\n  priorityClass: low"), "priorityClass is for action deprioritize"),
        (("  ofLast: 5", "  ofLast: 5\n  within: -1d"), "g.yaml:9: spec.within"),
        (("  ofLast: 5", "  ofLast: 5\n  colour: red"), "g.yaml:9: spec.colour: unknown field"),
        (("  ofLast: 5", "  ofLast: 5\n  findings: [Bad-Code]"), "is not a finding code"),
    ],
)
def test_bad_gate_rules_are_refused_with_file_and_line(edit: tuple[str, str], error: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_gate_policies(G.replace(*edit), "g.yaml")
    assert any(error in p for p in exc.value.problems), exc.value.problems


def test_names_are_unique_across_kinds() -> None:
    with pytest.raises(PolicyError, match="already defined"):
        load_all({"a.yaml": P, "b.yaml": G.replace("hold-low-sm", "tell")})


def test_shipped_gate_rules_are_the_documented_examples() -> None:
    from auditor.policy.loader import load_gate_files, read_dir

    rules = {g.name: g.rule() for g in load_gate_files(read_dir(ROOT / "policies"))}
    hold, probation = rules["hold-repeated-low-sm"], rules["probation-after-idle"]
    assert (hold.action, hold.at_least, hold.of_last, hold.within) == (GateAction.HOLD, 3, 5, timedelta(days=30))
    assert (probation.action, probation.within) == (GateAction.DEPRIORITIZE, timedelta(days=7))


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def test_simulate_gate_counts_what_enforce_would_have_held() -> None:
    (g,) = parse_gate_policies(G, "g.yaml")
    key = LineageKey("c1", "ml-a", "train")
    runs = tuple(LineageRun(f"Job/train-{i}", "low_sm_efficiency", start=NOW - timedelta(days=6 - i)) for i in range(5))
    other = LineageHistory(LineageKey("c1", "web", "train"), runs)  # outside the rule's namespaces
    res = simulate_gate([LineageHistory(key, runs), other], [g], since=NOW - timedelta(days=3), until=NOW)
    rule = res["rules"]["hold-low-sm"]
    assert res["lineages"] == 2 and res["submissions"] == 4  # the runs of days -3 and -2, of both lineages
    assert [h["job"] for h in rule["hits"]] == ["Job/train-3", "Job/train-4"]
    assert rule["hits"][0]["lineage"] == "c1/ml-a/train" and len(rule["hits"][0]["evidence"]) == 3
    assert rule["per_day"] == {"2026-11-27": 1, "2026-11-28": 1}
    # the same history decided now holds in enforce and says "would" in observe
    assert decide(LineageHistory(key, runs), [g.rule()], GateMode.OBSERVE, NOW).would is GateAction.HOLD


def test_cli_validate_lists_gate_rules_and_simulate_replays_the_store(tmp_path: Path) -> None:
    from auditor.core.model import JobRef
    from auditor.store import Store

    d = tmp_path / "p"
    d.mkdir()
    (d / "gate.yaml").write_text(G)
    r = subprocess.run([_CLI, "policy", "validate", str(d)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ok  hold-low-sm  (gate: hold when flagged low_sm_efficiency" in r.stdout
    assert r.stdout.strip().endswith("0 policies and 1 gate rule valid")
    (d / "gate.yaml").write_text(G.replace("atLeast: 3", "atLeast: 9"))
    r = subprocess.run([_CLI, "policy", "validate", str(d)], capture_output=True, text=True)
    assert r.returncode == 2 and f"{d / 'gate.yaml'}:4: spec: atLeast 9" in r.stderr
    (d / "gate.yaml").write_text(G)

    # the CLI decides as of its own clock: the history is laid out relative to it
    now = datetime.now(timezone.utc)
    db = f"sqlite:///{tmp_path}/s.db"
    store = Store.open(db)
    for i in range(4):
        start = now - timedelta(hours=10 - 2 * i)
        job = JobRef("default", "ml-a", "Job", f"train-{'bcdfg'[i]}x2kq", uid=f"u{i}", team="t")
        jid = store.upsert_job(job, start, start + timedelta(hours=1))
        store.save_summary(
            jid,
            {
                **TEMPLATE,
                "cluster": "default",
                "namespace": "ml-a",
                "job": job.job,
                "uid": job.uid,
                "team": "t",
                "verdict": "low_sm_efficiency",
                "start": start.isoformat(),
                "end": (start + timedelta(hours=1)).isoformat(),
            },
        )
    store.close()
    r = subprocess.run(
        [_CLI, "policy", "simulate", "--since", "1d", "--db", db, "--policies", str(d), "--output", "json"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    gate = json.loads(r.stdout)["gate"]
    assert gate["submissions"] == 4 and [h["job"] for h in gate["rules"]["hold-low-sm"]["hits"]] == ["Job/train-fx2kq"]
    r = subprocess.run(
        [_CLI, "policy", "simulate", "--since", "1d", "--db", db, "--policies", str(d)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "hold-low-sm (flagged low_sm_efficiency in 3 of its last 5 runs): 1 submission(s) held" in r.stdout
    assert "default/ml-a/train Job/train-fx2kq" in r.stdout
