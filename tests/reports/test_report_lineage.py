"""The weekly report shows a top job's lineage history (runs by verdict, who acknowledged), from the store."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from auditor.core.lineage import LineageKey
from auditor.core.model import JobRef
from auditor.reports.formats import to_markdown
from auditor.reports.html import render_html
from auditor.reports.service import generate
from auditor.reports.weeks import IsoWeek
from auditor.store.lineage import AckLog
from auditor.store.store import Store

WS = datetime(2026, 11, 16, tzinfo=timezone.utc)  # Monday of 2026-W47
TEMPLATE = json.loads((Path(__file__).parents[1] / "golden" / "audit" / "demo.json").read_text())[0]


def save(store: Store, name: str, verdict: str, start: datetime) -> None:
    job = JobRef("c1", "ml", "Job", name, f"u-{name}", "vision")
    jid = store.upsert_job(job, start, start + timedelta(hours=2))
    doc = {
        **TEMPLATE,
        "uid": job.uid,
        "cluster": "c1",
        "namespace": "ml",
        "job": job.job,
        "team": "vision",
        "verdict": verdict,
        "start": start.isoformat(),
        "end": (start + timedelta(hours=2)).isoformat(),
        "gpu_hours": 16.0,
        "waste_gpu_hours": 15.0 if verdict != "healthy" else 1.0,
        "computed_at": (start + timedelta(hours=2)).isoformat(),
    }
    store.save_summary(jid, doc)


def test_top_jobs_carry_their_lineage_in_json_markdown_and_html(tmp_path) -> None:
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    try:
        for i, (name, verdict) in enumerate(
            [("train-b4x2z", "low_sm_efficiency"), ("train-7f9c2", "low_sm_efficiency"), ("train-x2kq9", "healthy")]
        ):
            save(store, name, verdict, WS + timedelta(days=i, hours=9))
        save(store, "eval-once", "idle", WS + timedelta(days=1))
        AckLog(store).acknowledge(LineageKey("c1", "ml", "train"), "kube:alice", None, "", WS + timedelta(days=3))
        doc = generate(store, IsoWeek(2026, 47), now=WS + timedelta(days=7))
    finally:
        store.close()
    top = {j["job"]: j for j in doc["total"]["top_jobs"]}
    assert top["Job/train-b4x2z"]["lineage"] == {
        "lineage": "ml/train",
        "runs": 3,
        "verdicts": {"low_sm_efficiency": 2, "healthy": 1},
        "acknowledged_by": "kube:alice",
        "acknowledged_until": None,
    }
    assert "lineage" not in top["Job/eval-once"]  # its lineage's only run: no history to show
    md = to_markdown(doc)
    assert "ml/Job/train-b4x2z (lineage ml/train: 3 runs, 2 low_sm_efficiency; acknowledged by kube:alice)" in md
    html = render_html(doc)
    assert (
        '<small data-k="lineage">lineage ml/train: 3 runs, 2 low_sm_efficiency; acknowledged by kube:alice</small>'
        in html
    )
