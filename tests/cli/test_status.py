"""``gpu-auditor status`` and ``version``: from a store alone, with the project's exit codes."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fake_clock import FakeClock

from auditor import compose
from auditor.cli.main import main
from auditor.core.job_summary import JobSummary
from auditor.core.lineage import LineageKey
from auditor.core.model import JobRef, Window
from auditor.policy.loader import parse_policies
from auditor.policy.runner import PolicyRunner, RunnerConfig
from auditor.store import Store
from auditor.store.lineage import AckLog

T0 = datetime(2026, 11, 24, 10, 0, tzinfo=timezone.utc)
POLICY = """
apiVersion: gpu-auditor.io/v1alpha1
kind: GpuPolicy
metadata: {name: alert-low-sm}
spec:
  mode: warn
  verdicts: [low_sm_efficiency]
  escalation:
    - actions: [notify]
"""


def _job(team: str, name: str, verdict: str) -> JobSummary:
    return JobSummary.example(
        cluster="c1", namespace=f"ns-{team}", job=f"Job/{name}", team=team, verdict=verdict, sm_active=0.04,
        gpu_util=1.0, coverage=1.0, gpus=2, gpu_hours=4.0, waste_gpu_hours=3.84,
        start=(T0 - timedelta(hours=2)).isoformat(), end=T0.isoformat(),
    )  # fmt: skip


@pytest.fixture
def db(tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(compose, "clock", lambda: FakeClock(T0 + timedelta(minutes=10)))
    url = f"sqlite:///{tmp_path}/s.db"
    jobs = [_job("a", "a1", "low_sm_efficiency"), _job("a", "a2", "healthy"), _job("b", "b1", "low_sm_efficiency")]
    store = Store.open(url)
    try:
        for s in jobs:
            jid = store.upsert_job(JobRef("c1", s.namespace, s.key.kind, s.key.name, None, s.team), s.start, s.end)
            store.save_summary(jid, s.to_json())
        PolicyRunner(parse_policies(POLICY, "p.yaml"), store, None, RunnerConfig(cluster="c1")).run_cycle(
            jobs, now=T0, act=True
        )  # no destination for either team: two alerts recorded as skipped
        AckLog(store).acknowledge(LineageKey("c1", "ns-a", "a1"), "alice", T0 + timedelta(days=1), "known", T0)
        store.record_run(Window(T0 - timedelta(minutes=5), T0), T0, T0 + timedelta(seconds=3), jobs=3, queries=9,
                         status="ok", detail={"cluster": "c1"})  # fmt: skip
    finally:
        store.close()
    return url


def test_status_says_what_the_operator_did(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--db", db, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["last_cycle"]["status"] == "ok" and doc["last_cycle"]["seconds"] == 3.0
    assert doc["flagged_now"] == 2
    # waste: the flagged job's idle SMs; the healthy one's are headroom (docs/figures.md)
    assert doc["teams"]["a"] == {
        "jobs": 2, "flagged": 1, "gpu_hours": 8.0, "waste_gpu_hours": 3.84, "headroom_gpu_hours": 3.84,
        "efficiency": 0.04, "verdicts": {"healthy": 1, "low_sm_efficiency": 1},
    }  # fmt: skip
    assert sum(v["count"] for v in doc["open_violations"]) == 2
    # the alerts that went nowhere (gpu_auditor_policy_alerts_undelivered_total's cases), with why
    assert sorted(u["namespace"] for u in doc["undelivered_alerts"]) == ["ns-a", "ns-b"]
    assert all(u["why"].startswith("no destination for team") for u in doc["undelivered_alerts"])
    assert doc["acknowledgements_in_force"] == {"ack": 1}

    assert main(["status", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "jobs flagged now: 2" in out and "alerts not delivered: 2" in out
    assert all(len(line) <= 120 for line in out.splitlines())


def test_status_exits_1_when_the_last_cycle_failed(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store.open(db)
    try:
        store.record_run(Window(T0, T0 + timedelta(minutes=5)), T0 + timedelta(minutes=5), T0 + timedelta(minutes=6),
                         jobs=0, queries=0, status="failed", detail={"error": "SourceUnavailable: down"})  # fmt: skip
    finally:
        store.close()
    assert main(["status", "--db", db]) == 1
    assert "the last cycle failed: SourceUnavailable: down" in capsys.readouterr().err


def test_status_bad_since_is_exit_2(db: str) -> None:
    assert main(["status", "--db", db, "--since", "soon"]) == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from auditor import __version__

    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith(f"gpu-auditor {__version__}\n")
    assert main(["version", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu-auditor"] == __version__


def test_no_library_log_noise_below_vv(db: str, caplog: pytest.LogCaptureFixture) -> None:
    """Opening a store runs alembic (it logs its migration context at INFO): at -v only our own
    lines show, at -vv everything."""
    caplog.set_level(logging.DEBUG)
    assert main(["-v", "status", "--db", db]) == 0
    assert not [r.name for r in caplog.records if r.name.split(".")[0] in ("alembic", "urllib3", "kubernetes")]
    caplog.clear()
    assert main(["-vv", "status", "--db", db]) == 0
    assert any(r.name.startswith("alembic") for r in caplog.records)


def test_actions_since_in_yaml(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    since = (T0 - timedelta(minutes=1)).isoformat()
    assert main(["actions", "--since", since, "--db", db, "-o", "yaml"]) == 0
    rows = yaml.safe_load(capsys.readouterr().out)
    assert sorted(r["job"] for r in rows) == ["Job/a1", "Job/b1"] and {r["state"] for r in rows} == {"skipped"}
    assert main(["actions", "--since", (T0 + timedelta(minutes=1)).isoformat(), "--db", db, "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == []


def test_status_lists_the_lineages_the_gate_holds(db: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """The gate's rules (the shipped hold rule) over the store's lineage histories: a lineage
    flagged 3 times is held; the same history acknowledged is not."""
    import shutil

    from gate_objects import record_runs

    policies = tmp_path / "policies"
    policies.mkdir()
    shutil.copy(Path(__file__).parents[2] / "policies/gate/hold-repeated-low-sm.yaml", policies)
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(f"policies: {{builtin: false, dir: {policies}}}\ngate: {{mode: enforce}}\n")
    store = Store.open(db)
    try:
        for lineage in ("train", "fixed"):
            record_runs(store, LineageKey("c1", "ns-a", lineage), ["low_sm_efficiency"] * 3, T0)
        AckLog(store).acknowledge(LineageKey("c1", "ns-a", "fixed"), "bob", None, "fixed the loader", T0)
    finally:
        store.close()
    assert main(["status", "--db", db, "--config", str(cfg), "-o", "json"]) == 0
    gate = json.loads(capsys.readouterr().out)["gate"]
    assert gate["mode"] == "enforce" and gate["rules"] == 1
    assert [h["lineage"] for h in gate["held"]] == ["ns-a/train"] and gate["held"][0]["rule"] == "hold-repeated-low-sm"
    assert main(["status", "--db", db, "--config", str(cfg)]) == 0
    assert "lineages held: 1" in capsys.readouterr().out
