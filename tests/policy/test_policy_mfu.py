"""Policies on the MFU (issue 28): conditions on ``mfu_estimate`` and ``recoverable_gpu_hours``,
the ``lineage`` condition ("below its own best run") read through the runner's port from a real
SQLite store's lineage records, the shipped ``mfu-gap`` and ``mfu-below-own-best`` policies in
the runner and in ``policy simulate``, and alerts that say the job's MFU, what it could be and what
it costs."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import pytest

from auditor.core.job_summary import JobSummary
from auditor.errors import BadInput
from auditor.policy.alerts import job_annotations, mfu_text, slack_message
from auditor.policy.backtest import simulate
from auditor.policy.evaluate import evaluate
from auditor.policy.loader import load_dir, parse_policies
from auditor.policy.runner import PolicyRunner, RunnerConfig
from auditor.store import Store
from tests.reports.reportgen import LLM_TRAINING, GenJob, store_mfu_jobs

UTC = timezone.utc
WS = datetime(2026, 11, 16, tzinfo=UTC)
NOW = WS + timedelta(days=8)
POLICIES = Path(__file__).parents[2] / "policies"

GAP = """
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: gap}
spec:
  conditions:
    - {field: mfu_estimate, op: "<", value: 0.25}
    - {field: recoverable_gpu_hours, op: ">=", value: 2}
  escalation: [{actions: [annotate]}]
"""


def test_mfu_and_recoverable_conditions() -> None:
    (p,) = parse_policies(GAP, "gap.yaml")
    low = JobSummary.example(verdict="low_mfu", mfu_estimate=0.16, mfu_reference=0.4, recoverable_gpu_hours=4.8)
    assert evaluate(p, low, now=NOW).fires
    small = JobSummary.example(verdict="low_mfu", mfu_estimate=0.16, mfu_reference=0.4, recoverable_gpu_hours=1.0)
    assert not evaluate(p, small, now=NOW).fires
    # no reference: the gap is unknown, so no judgement (never "0, below the threshold")
    none = JobSummary.example(verdict="healthy", mfu_estimate=0.16)
    ev = evaluate(p, none, now=NOW)
    assert not ev.fires and not ev.judged
    # a ratio out of range is refused where it is written
    with pytest.raises(BadInput, match="mfu_estimate"):
        parse_policies(GAP.replace("value: 0.25", "value: 25"), "gap.yaml")


def test_low_mfu_is_a_verdict_a_policy_may_name() -> None:
    doc = GAP.replace("  conditions:", "  verdicts: [low_mfu]\n  conditions:")
    (p,) = parse_policies(doc, "gap.yaml")
    assert p.spec.verdicts == ["low_mfu"]


@pytest.fixture
def lineage_store(tmp_path: Path) -> Iterator[tuple[Store, dict[str, dict]]]:
    """One lineage (``nightly``), three runs: a fused one at ~0.44 MFU, then an unfused one that
    regressed; plus a fused run of another lineage."""
    store = Store.open(f"sqlite:///{tmp_path / 'lineage.sqlite'}")
    jobs = [
        (GenJob("llm", "nightly-7f9c2", WS + timedelta(days=1), 2.0, 4, "fused"), LLM_TRAINING),
        (GenJob("llm", "nightly-k2m4p", WS + timedelta(days=2), 2.0, 4, "unfused"), LLM_TRAINING),
        (GenJob("llm", "other-q8w3z", WS + timedelta(days=2), 2.0, 4, "fused"), LLM_TRAINING),
    ]
    try:
        yield store, store_mfu_jobs(store, jobs, now=NOW)
    finally:
        store.close()


def test_below_its_own_best_run_through_the_runner_and_simulate(lineage_store: tuple[Store, dict[str, dict]]) -> None:
    store, docs = lineage_store
    (policy,) = [p for p in load_dir(POLICIES) if p.name == "mfu-below-own-best"]
    runner = PolicyRunner([policy], store, None, RunnerConfig(cluster="c1"))
    summaries = [JobSummary.from_json(d) for d in docs.values()]
    decisions = runner.run_cycle(summaries, now=NOW, act=False)
    assert [d.job for d in decisions] == ["c1/ns-llm/Job/nightly-k2m4p"]
    best = docs["nightly-7f9c2"]["mfu_estimate"]
    assert decisions[0].evidence["lineage_best_mfu"] == round(best, 4)
    assert f"x its lineage's best {best:.3f}" in decisions[0].reason
    # policy simulate reads the same history: each job against the runs that started before it
    sim = simulate(store, [policy], since=WS, until=NOW)["policies"]["mfu-below-own-best"]
    assert [h["job"] for h in sim["hits"]] == ["c1/ns-llm/Job/nightly-k2m4p"]
    # without the store's lineage records the condition never fires (no history is no grounds)
    assert PolicyRunner([policy], None, None, RunnerConfig(cluster="c1")).run_cycle(summaries, now=NOW, act=False) == []


def test_shipped_mfu_gap_policy_on_the_gap(lineage_store: tuple[Store, dict[str, dict]]) -> None:
    store, docs = lineage_store
    (policy,) = [p for p in load_dir(POLICIES) if p.name == "mfu-gap"]
    assert policy.spec.mode.value == "warn"
    sim = simulate(store, [policy], since=WS, until=NOW)["policies"]["mfu-gap"]
    hit = {h["job"] for h in sim["hits"]}
    unfused = docs["nightly-k2m4p"]
    assert hit == ({"c1/ns-llm/Job/nightly-k2m4p"} if unfused["verdict"] in ("low_mfu", "memory_bound") else set())
    assert unfused["recoverable_gpu_hours"] >= 1 and unfused["mfu_class"] == "llm-training"


def test_alerts_say_the_mfu_what_it_could_be_and_what_it_costs() -> None:
    (policy,) = [p for p in load_dir(POLICIES) if p.name == "mfu-gap"]
    s = JobSummary.example(
        verdict="low_mfu",
        gpu_util=0.99,
        sm_active=0.95,
        tensor_active=0.16,
        mfu_estimate=0.155,
        mfu_reference=0.4,
        mfu_class="llm-training",
        recoverable_gpu_hours=4.9,
        gpu_hours=8,
    )
    line = "MFU 15.5 % of a possible 40 % (class llm-training): 4.90 GPU-h recoverable"
    assert mfu_text(s) == line
    text, blocks = slack_message(policy, s, "low_mfu: recoverable_gpu_hours=4.900 >= 1")
    body = json.dumps(blocks)
    assert line in body and "Recoverable GPU-h (MFU gap)" in body and "FlashAttention" in body
    from auditor.core.action_target import ActionTarget

    ann = job_annotations(policy, ActionTarget.of_summary(s), s, "r", NOW)
    assert ann["gpu-auditor.io/mfu"] == "15.5%" and ann["gpu-auditor.io/mfu-reference"] == "40.0%"
    assert ann["gpu-auditor.io/recoverable-gpu-hours"] == "4.90"
    assert mfu_text(JobSummary.example(verdict="no_tensor_cores")) == "MFU n/a (no tensor activity)"
    lineage = JobSummary.example(
        mfu_estimate=0.2, mfu_reference=0.45, mfu_class="lineage-best", recoverable_gpu_hours=1
    )
    assert "of a possible 45 % (its lineage's best run)" in mfu_text(lineage)
