"""Kueue admission facts from real Workload documents (captured from the test bed's Kueue v0.17.0).

tests/fixtures/kueue/workloads.json holds one Workload at each step: ``admitted`` (admitted at
once, quota free), ``pending`` (a second job behind it, quota short), ``waited`` (that job
admitted once the first was deleted), ``deactivated`` / ``deactivated_later`` (our requeue's
``spec.active: false``: evicted, then quota released), ``reactivated`` / ``readmitted`` (after
``spec.active: true``: requeued and admitted again).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from auditor.core.admission import AdmissionFacts, admission_facts, merge, quantile
from auditor.errors import BadInput

DOCS = json.loads((Path(__file__).parents[1] / "fixtures" / "kueue" / "workloads.json").read_text())


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def test_admitted_at_once_waited_nothing() -> None:
    f = admission_facts(DOCS["admitted"])
    assert f.cluster_queue and f.cluster_queue.startswith("cq-")
    assert f.local_queue == "lq"
    assert f.admitted_at == f.last_admitted_at == at("2026-12-01T12:41:46Z")
    assert f.queue_wait_s == 0.0 and f.eviction_count == 0 and f.requeues == 0 and not f.pending


def test_waiting_behind_another_job() -> None:
    pending = admission_facts(DOCS["pending"])
    assert pending.pending and pending.admitted_at is None and pending.cluster_queue is None
    waited = admission_facts(DOCS["waited"])
    assert waited.created == at("2026-12-01T12:41:48Z")
    assert waited.admitted_at == at("2026-12-01T12:41:51Z")
    assert waited.queue_wait_s == 3.0 == waited.last_wait_s
    assert not waited.pending


def test_deactivated_is_an_eviction_but_not_yet_a_requeue() -> None:
    f = admission_facts(DOCS["deactivated_later"])
    assert f.evictions == {"Deactivated": 1}
    assert f.requeues == 0  # Requeued False (Deactivated): held until spec.active is true again
    assert f.last_eviction_reason == "Deactivated" and f.last_evicted_at == at("2026-12-01T12:41:53Z")
    assert f.pending and f.cluster_queue is None  # status.admission cleared
    assert f.admitted_at is None  # the first admission is no longer in the Workload


def test_readmitted_after_requeue() -> None:
    f = admission_facts(DOCS["readmitted"])
    assert f.evictions == {"Deactivated": 1} and f.requeues == 1
    assert f.last_admitted_at == at("2026-12-01T12:41:56Z") and f.last_wait_s == 0.0
    assert f.last_eviction_reason == "Deactivated"  # Evicted is False now: from schedulingStats


def test_merge_keeps_the_first_admission_and_the_admitting_queue() -> None:
    facts: AdmissionFacts | None = None
    for step in ("waited", "deactivated", "deactivated_later", "reactivated", "readmitted"):
        facts = merge(facts, admission_facts(DOCS[step]))
        if step == "deactivated_later":
            assert facts.cluster_queue and facts.pending
            assert facts.last_evicted_at == at("2026-12-01T12:41:53Z")
    assert facts is not None
    assert facts.admitted_at == at("2026-12-01T12:41:51Z") and facts.queue_wait_s == 3.0
    assert facts.last_admitted_at == at("2026-12-01T12:41:56Z") and facts.last_wait_s == 0.0
    assert facts.eviction_count == 1 and facts.requeues == 1 and not facts.pending
    assert facts.last_evicted_at == at("2026-12-01T12:41:53Z")


def test_merge_of_another_workload_starts_afresh() -> None:
    old = admission_facts(DOCS["admitted"])
    new = admission_facts(DOCS["waited"])
    assert merge(old, new) == new


def test_json_of_the_facts() -> None:
    doc = admission_facts(DOCS["waited"]).to_json()
    assert doc["admitted_at"] == "2026-12-01T12:41:51Z" and doc["queue_wait_s"] == 3.0
    assert doc["eviction_count"] == 0 and doc["evictions"] == {}


def test_a_bad_time_is_named() -> None:
    doc = json.loads(json.dumps(DOCS["waited"]))
    doc["status"]["conditions"][0]["lastTransitionTime"] = "yesterday"
    with pytest.raises(BadInput, match=r"Workload .*/job-second-.* status.conditions\[0\].lastTransitionTime"):
        admission_facts(doc)


def test_underlying_cause_is_part_of_the_reason() -> None:
    doc = json.loads(json.dumps(DOCS["readmitted"]))
    doc["status"]["schedulingStats"]["evictions"].append(
        {"reason": "Preempted", "underlyingCause": "InCohortReclamation", "count": 2}
    )
    f = admission_facts(doc)
    assert f.evictions == {"Deactivated": 1, "Preempted/InCohortReclamation": 2} and f.requeues == 3


def test_quantile() -> None:
    assert quantile([], 0.5) is None
    assert quantile([5.0], 0.9) == 5.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([10.0, 0.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0], 0.9) == pytest.approx(90.0)
