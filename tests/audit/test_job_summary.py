"""The typed spine: every audit-JSON document the golden files hold reads into a
:class:`JobSummary` and writes back unchanged; job identities have one text form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.core.identity import JobKey, split_job
from auditor.core.job_summary import JobSummary, SummaryFormatError, numeric_fields, policy_fields

GOLDEN = Path(__file__).parents[1] / "golden" / "audit"


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.json")))
def test_golden_documents_round_trip(name: str) -> None:
    docs = json.loads((GOLDEN / name).read_text())
    assert docs
    for doc in docs:
        s = JobSummary.from_json(doc)
        assert s.to_json() == doc
        assert list(s.to_json()) == list(doc)  # the key order too
        assert json.dumps(s.to_json(), indent=2) == json.dumps(doc, indent=2)


def test_lifecycle_and_foreign_fields_survive() -> None:
    doc = json.loads((GOLDEN / "demo.json").read_text())[0]
    doc = {**doc, "final": True, "ended": "2026-11-25T14:00:00Z", "policy_decisions": [{"policy": "p"}]}
    s = JobSummary.from_json(doc)
    assert s.final is True and s.ended is not None and s.extra == {"policy_decisions": [{"policy": "p"}]}
    assert s.to_json() == doc


def test_bad_documents_name_the_field() -> None:
    doc = json.loads((GOLDEN / "demo.json").read_text())[0]
    with pytest.raises(SummaryFormatError, match=r"summary\.verdict: unknown verdict 'great'"):
        JobSummary.from_json({**doc, "verdict": "great"})
    with pytest.raises(SummaryFormatError, match=r"summary\.sm_active: expected a number"):
        JobSummary.from_json({**doc, "sm_active": "0.5"})
    with pytest.raises(SummaryFormatError, match=r"per_gpu\[0\]\.start"):
        JobSummary.from_json({**doc, "per_gpu": [{**doc["per_gpu"][0], "start": "yesterday"}]})
    with pytest.raises(SummaryFormatError, match=r"summary\.job: .*Kind/name"):
        JobSummary.from_json({**doc, "job": "nameonly"})


def test_job_key_has_one_text_form() -> None:
    k = JobKey("prod/eu", "ml", "PyTorchJob", "bert")
    assert str(k) == "prod/eu/ml/PyTorchJob/bert" and k.job == "PyTorchJob/bert"
    assert JobKey.parse(str(k)) == k  # a cluster name may hold a slash; the rest never does
    assert JobKey.parse("ml/Job/x", cluster="c") == JobKey("c", "ml", "Job", "x")
    assert JobKey.of("c", "ml", "Job/x") == JobKey("c", "ml", "Job", "x")
    assert split_job("Pod/p-0") == ("Pod", "p-0")
    for bad in ("ml/Job/x", "c//Job/x", "c/ml/Job/"):
        with pytest.raises(ValueError, match="CLUSTER/NAMESPACE/KIND/NAME"):
            JobKey.parse(bad)
    with pytest.raises(ValueError, match="NAMESPACE/KIND/NAME"):
        JobKey.parse("c/ml/Job/x", cluster="c")


def test_numeric_fields_are_the_documents_numbers() -> None:
    doc = json.loads((GOLDEN / "demo.json").read_text())[0]
    names = numeric_fields()
    assert {"gpu_util", "sm_active", "coverage", "waste_gpu_hours", "gpus", "gpu_hours"} <= set(names)
    assert all(doc[n] is None or isinstance(doc[n], (int, float)) for n in names)


def test_policy_fields_come_from_the_type() -> None:
    """A policy condition may test exactly the numeric fields declared with a range on
    JobSummary: no hand-kept copy to forget when a field is added."""
    from auditor.policy.schema import SUMMARY_FIELDS

    assert dict(SUMMARY_FIELDS) == policy_fields()
    assert set(policy_fields()) <= set(numeric_fields())
    assert policy_fields()["sm_active"].unit == "ratio" and policy_fields()["power_w"].high == 5_000.0


def test_job_key_of_a_document() -> None:
    assert JobKey.of_document({"namespace": "ml", "job": "Job/x"}) == JobKey("default", "ml", "Job", "x")
    assert str(JobKey.of_document({"cluster": "c", "namespace": "ml", "job": "Job/x"})) == "c/ml/Job/x"
    with pytest.raises(ValueError, match="without a job identity"):
        JobKey.of_document({"cluster": "c", "job": "Job/x"})


def test_store_columns_name_fields_of_the_type() -> None:
    """Each column the store copies out of a summary names a field JobSummary writes (a rename
    in the type fails here, not silently as NULL columns), with the column's JSON type."""
    from auditor.store.summaries import SUMMARY_FIELDS, summary_columns

    doc = json.loads((GOLDEN / "demo.json").read_text())[0]
    s = JobSummary.from_json(doc)
    for column, (path, kind) in SUMMARY_FIELDS.items():
        v: object = s.to_json()
        for key in path:
            assert isinstance(v, dict) and key in v, (column, path)
            v = v[key]
        assert v is None or isinstance(v, {"string": str, "number": (int, float), "integer": int}[kind]), column
    assert summary_columns(s.to_json()) == summary_columns(doc)
