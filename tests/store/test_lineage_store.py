"""Lineages in the store (migration 0009): runs, acknowledgements, snoozes, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from revisions import assert_tables_match_migrations

from auditor.core.gate import AckKind, GateAction, GateMode, GateRule, LineageRun, decide
from auditor.core.lineage import LineageKey
from auditor.core.model import JobRef
from auditor.errors import BadInput
from auditor.store.lineage import TABLES, AckLog, LineageHistoryReader, LineageRecorder, LinkAlreadyUsed, run_of
from auditor.store.store import Store

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
KEY = LineageKey("c1", "ml", "train")


@pytest.fixture
def store(store_url: str):
    s = Store.open(store_url)
    yield s
    s.close()


def test_lineage_tables_match_migration(store_url: str) -> None:
    Store.open(store_url).close()
    assert_tables_match_migrations(store_url, TABLES)


def _summary(name: str, verdict: str, day: int, **kw: object) -> tuple[JobRef, dict]:
    job = JobRef("c1", "ml", "Job", name, uid=f"uid-{name}", team="vision")
    start = T0 + timedelta(days=day)
    doc = {
        "verdict": verdict,
        "start": start.isoformat().replace("+00:00", "Z"),
        "end": (start + timedelta(hours=3)).isoformat().replace("+00:00", "Z"),
        "gpu_hours": 24.0,
        "waste_gpu_hours": 20.0,
        "findings": [{"code": "low_sm_activity", "message": "m", "evidence": {}}],
        "final": True,
        **kw,
    }
    return job, doc


def test_runs_are_recorded_once_per_job_and_read_back_oldest_first(store: Store) -> None:
    rec, reader = LineageRecorder(store), LineageHistoryReader(store)
    assert reader.history(KEY, T0).runs == ()
    for i, name in enumerate(["train-7f9c2", "train-b4x2z", "train-x2kq9"]):
        job, doc = _summary(name, "low_sm_efficiency", i)
        rec.record(KEY, run_of(job, doc), T0 + timedelta(days=i), team="vision")
    # a later cycle rewrites the first job's verdict: still one run for it
    job, doc = _summary("train-7f9c2", "healthy", 0)
    rec.record(KEY, run_of(job, doc), T0 + timedelta(days=3), team="vision")
    h = reader.history(KEY, T0 + timedelta(days=3))
    assert [(r.job, r.verdict) for r in h.runs] == [
        ("Job/train-7f9c2", "healthy"),
        ("Job/train-b4x2z", "low_sm_efficiency"),
        ("Job/train-x2kq9", "low_sm_efficiency"),
    ]
    r = h.runs[1]
    assert r.uid == "uid-train-b4x2z" and r.findings == ("low_sm_activity",) and r.final
    assert r.start == T0 + timedelta(days=1) and r.start.tzinfo is not None and r.gpu_hours == 24.0
    assert h.team == "vision"
    # a re-created Job of the same name (new uid) is a new run
    again = JobRef("c1", "ml", "Job", "train-x2kq9", uid="uid-other")
    rec.record(KEY, run_of(again, _summary("x", "idle", 4)[1]), T0 + timedelta(days=4))
    assert len(reader.history(KEY, T0).runs) == 4
    assert reader.lineage_of_job("ml", "Job", "train-b4x2z", "c1") == KEY
    assert reader.lineage_of_job("ml", "Job", "unknown") is None
    [listed] = reader.lineages(cluster="c1")
    assert listed.key == KEY and listed.runs == 4 and listed.team == "vision"
    assert listed.last_seen == T0 + timedelta(days=4)


def test_history_keeps_the_newest_runs(store: Store) -> None:
    rec = LineageRecorder(store)
    for i in range(8):
        job, doc = _summary(f"train-{i}", "healthy", i)
        rec.record(KEY, run_of(job, doc), T0)
    h = LineageHistoryReader(store, max_runs=5).history(KEY, T0)
    assert [r.job for r in h.runs] == [f"Job/train-{i}" for i in range(3, 8)]


def test_acknowledgements_are_recorded_with_who_when_until_why(store: Store) -> None:
    log, reader = AckLog(store), LineageHistoryReader(store)
    rec = LineageRecorder(store)
    for i in range(3):
        job, doc = _summary(f"train-{i}", "low_sm_efficiency", i)
        rec.record(KEY, run_of(job, doc), T0 + timedelta(days=i))
    rule = GateRule("hold", GateAction.HOLD, verdicts=frozenset({"low_sm_efficiency"}), at_least=3, of_last=5)
    now = T0 + timedelta(days=4)
    assert decide(reader.history(KEY, now), [rule], GateMode.ENFORCE, now).action is GateAction.HOLD
    ack = log.acknowledge(KEY, "alice", now + timedelta(days=7), "fixed the loader", now)
    assert ack.at == now and ack.via == "cli"
    d = decide(reader.history(KEY, now), [rule], GateMode.ENFORCE, now)
    assert d.action is GateAction.ADMIT and d.acknowledged_by == "alice"
    assert d.acknowledged_until == now + timedelta(days=7)
    [stored] = log.acks(KEY)
    assert (stored.by, stored.reason, stored.until, stored.kind) == (
        "alice",
        "fixed the loader",
        now + timedelta(days=7),
        AckKind.ACK,
    )
    snooze = log.snooze(KEY, "admin", now + timedelta(hours=2), "demo day", now + timedelta(minutes=1), via="api")
    assert snooze.kind is AckKind.SNOOZE
    assert [(k, a.by) for k, a in log.since(now - timedelta(seconds=1))] == [(KEY, "alice"), (KEY, "admin")]
    assert [a.by for _, a in log.since(now)] == ["admin"]


def test_ack_of_an_unknown_lineage_creates_it(store: Store) -> None:
    other = LineageKey("c1", "ml", "never-ran")
    AckLog(store).acknowledge(other, "bob", None, "", T0)
    assert [a.by for a in LineageHistoryReader(store).history(other, T0).acks] == ["bob"]


@pytest.mark.parametrize(
    ("by", "until", "kind", "message"),
    [
        ("", None, AckKind.ACK, "who made it"),
        ("bob", T0 - timedelta(seconds=1), AckKind.ACK, "is not after now"),
        ("bob", None, AckKind.SNOOZE, "needs an end"),
    ],
)
def test_bad_acknowledgements_are_refused(store: Store, by: str, until, kind: AckKind, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        AckLog(store).acknowledge(KEY, by, until, "", T0, kind=kind)
    assert AckLog(store).acks(KEY) == []


def test_a_link_acknowledges_once_even_when_used_twice_at_once(store: Store) -> None:
    log = AckLog(store)
    results: list[str] = []

    def use() -> None:
        try:
            log.acknowledge(KEY, "carol", None, "link", T0, via="link", link_id="nonce-1")
            results.append("ok")
        except LinkAlreadyUsed:
            results.append("used")

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok", "used", "used", "used"]
    assert log.link_used("nonce-1") and not log.link_used("nonce-2")
    assert [a.via for a in log.acks(KEY)] == ["link"]


def test_run_of_reads_the_audit_json() -> None:
    job = JobRef("c1", "ml", "Job", "t")
    r = run_of(job, {"verdict": "idle", "start": "2026-11-30T09:00:00Z", "end": None, "findings": ["x", {}]})
    assert r == LineageRun(job="Job/t", verdict="idle", start=T0, end=None, uid=None, findings=(), final=False)


def test_saving_a_summary_records_the_run_of_its_lineage(store: Store) -> None:
    reader = LineageHistoryReader(store)
    for name, kube in [("train-7f9c2", {}), ("train-29012345", {"lineage": None}), ("x-1", {"lineage": "train"})]:
        job = JobRef("c1", "ml", "Job", name, uid=f"u-{name}", team="vision")
        job_id = store.upsert_job(job, T0, T0 + timedelta(hours=1))
        _, doc = _summary(name, "low_sm_efficiency", 0, kube=kube, computed_at="2026-11-30T10:00:00Z")
        store.save_summary(job_id, doc)
        store.save_summary(job_id, {**doc, "verdict": "idle"})  # the next cycle's verdict replaces it
    h = reader.history(KEY, T0)
    assert sorted(r.job for r in h.runs) == ["Job/train-29012345", "Job/train-7f9c2", "Job/x-1"]
    assert {r.verdict for r in h.runs} == {"idle"} and h.team == "vision"
    assert reader.lineage_of_job("ml", "Job", "x-1", "c1") == KEY
    # a summary the store refuses records no run either
    job_id = store.upsert_job(JobRef("c1", "ml", "Job", "bad-7f9c2"), T0, T0)
    with pytest.raises(Exception, match="no verdict"):
        store.save_summary(job_id, {"verdict": ""})
    assert reader.history(LineageKey("c1", "ml", "bad"), T0).runs == ()
