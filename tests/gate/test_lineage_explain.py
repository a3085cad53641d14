"""``explain`` shows the job's lineage and its history (runs, acknowledgements) from the store."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from auditor.cli.main import main
from auditor.core.lineage import LineageKey
from auditor.core.model import JobRef
from auditor.store.lineage import AckLog
from auditor.store.store import Store

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=timezone.utc)


#: a whole audit-JSON object (explain reads the typed summary), re-identified per run below
TEMPLATE = json.loads((Path(__file__).parents[1] / "golden" / "audit" / "demo.json").read_text())[0]


def summary(name: str, verdict: str, start: datetime) -> dict:
    return {
        **TEMPLATE,
        "uid": None,
        "cluster": "c1",
        "namespace": "ml",
        "job": f"Job/{name}",
        "team": "vision",
        "verdict": verdict,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=2)).isoformat(),
        "gpu_hours": 16.0,
        "waste_gpu_hours": 15.0,
        "findings": [{"code": "single_sm", "message": "m", "evidence": {}}] if verdict != "healthy" else [],
    }


def fill(url: str) -> None:
    store = Store.open(url)
    try:
        for i, (name, verdict) in enumerate(
            [("train-b4x2z", "low_sm_efficiency"), ("train-7f9c2", "healthy"), ("train-x2kq9", "low_sm_efficiency")]
        ):
            start = T0 + timedelta(days=i)
            jid = store.upsert_job(
                JobRef("c1", "ml", "Job", name, f"u{i}", "vision"), start, start + timedelta(hours=2)
            )
            store.save_summary(jid, summary(name, verdict, start))
        jid = store.upsert_job(JobRef("c1", "ml", "Job", "eval-once", "u9", "vision"), T0, T0 + timedelta(hours=1))
        store.save_summary(jid, summary("eval-once", "healthy", T0))
        AckLog(store).acknowledge(
            LineageKey("c1", "ml", "train"), "kube:alice", None, "fixed the loader", T0 + timedelta(days=2, hours=3)
        )
    finally:
        store.close()


def test_explain_shows_the_lineage_history(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    fill(store_url)
    capsys.readouterr()
    assert main(["explain", "ml/Job/train-7f9c2", "--db", store_url]) == 0
    out = capsys.readouterr().out
    section = out[out.index("lineage ml/train") :].splitlines()
    assert section[0] == "lineage ml/train (cluster c1): 3 run(s): 2 low_sm_efficiency, 1 healthy"
    assert section[1].startswith("  2026-11-22  Job/train-x2kq9") and "low_sm_efficiency" in section[1]
    assert section[2].startswith("  2026-11-21  Job/train-7f9c2") and section[2].endswith("16.0 GPU-h   ← this job")
    assert section[4] == "  ack by kube:alice at 2026-11-22T12:00:00Z via cli: fixed the loader"
    assert main(["explain", "ml/Job/train-7f9c2", "--db", store_url, "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["lineage"]
    assert doc["lineage"] == "ml/train" and doc["runs"] == 3 and doc["acknowledged"]["by"] == "kube:alice"
    assert [h["job"] for h in doc["history"]] == ["Job/train-x2kq9", "Job/train-7f9c2", "Job/train-b4x2z"]
    assert doc["open_findings"] == []  # the acknowledgement covers the runs before it
    # a job that is its lineage's only run has no history: nothing is added
    assert main(["explain", "ml/Job/eval-once", "--db", store_url, "--output", "json"]) == 0
    assert "lineage" not in json.loads(capsys.readouterr().out)
    assert main(["explain", "ml/Job/eval-once", "--db", store_url]) == 0
    assert "lineage " not in capsys.readouterr().out
