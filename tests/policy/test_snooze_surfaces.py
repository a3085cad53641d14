"""``explain`` and ``status`` say who snoozed a job's escalation and until when (issue 30), in text
and JSON, read from the store's job snoozes; a job never snoozed prints nothing new."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fake_clock import FakeClock

from auditor import compose
from auditor.cli.main import main
from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary
from auditor.core.model import JobRef
from auditor.store import Store

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
JOB = JobKey("c1", "ml", "Job", "train")


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/s.db"
    store = Store.open(url)
    try:
        job_id = store.upsert_job(JobRef("c1", "ml", "Job", "train", "uid-1", "vision"), NOW - timedelta(hours=2), NOW)
        doc = JobSummary.example(cluster="c1", namespace="ml", job="Job/train", team="vision", verdict="idle")
        store.save_summary(job_id, doc.to_json())
        log = store.job_snoozes()
        log.snooze(JOB, "os:alice", NOW - timedelta(hours=20), "old", NOW - timedelta(days=2), via="cli")
        log.snooze(JOB, "link:team:vision", NOW + timedelta(hours=23), "", NOW - timedelta(hours=1), via="link")
    finally:
        store.close()
    monkeypatch.setattr(compose, "clock", lambda: FakeClock(NOW))
    return url


def test_explain_and_status_show_the_snooze(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["explain", "ml/Job/train", "--db", db])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Escalation snoozes (the policy ladder takes no step while one is in force):" in out
    assert (
        "snoozed until 2026-12-01T11:00:00Z by link:team:vision, made 2026-11-30T11:00:00Z via link (in force)" in out
    )
    assert "by os:alice (old), made 2026-11-28T12:00:00Z via cli (over)" in out
    main(["explain", "ml/Job/train", "--db", db, "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert [s["by"] for s in doc["escalation_snoozes"]] == ["os:alice", "link:team:vision"]
    main(["status", "--db", db, "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert [(s["job"], s["until"]) for s in doc["escalations_snoozed"]] == [("ml/Job/train", "2026-12-01T11:00:00Z")]
    main(["status", "--db", db])
    assert "escalation snoozed: ml/Job/train until 2026-12-01T11:00:00Z by link:team:vision" in capsys.readouterr().out


def test_ack_snoozes_a_jobs_escalation_from_the_cli(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ack", "ml/Job/train", "--snooze", "--until", "48h", "--by", "bob", "--db", db]) == 0
    assert (
        "escalation of ml/Job/train (cluster c1) snoozed until 2026-12-02T12:00:00Z by bob" in capsys.readouterr().out
    )
    main(["status", "--db", db, "-o", "json"])
    [s] = json.loads(capsys.readouterr().out)["escalations_snoozed"]
    assert (s["by"], s["until"], s["via"]) == ("bob", "2026-12-02T12:00:00Z", "cli")  # the longest in force
    assert main(["ack", "ml/Job/train", "--until", "2h", "--db", db]) == 2  # a job without --snooze
    assert "pass --snooze --until T" in capsys.readouterr().err
    assert main(["ack", "ml/Job/other", "--snooze", "--until", "2h", "--db", db]) == 2
    assert "no audited job ml/Job/other in cluster c1" in capsys.readouterr().err
