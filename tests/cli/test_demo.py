"""``gpu-auditor demo`` end to end (replay → store → table → HTML), no server."""

import json
import re
from datetime import datetime, timezone
from typing import Iterator

import pytest
from policy.policy_receivers import Receiver

from auditor.cli.demo import run_demo
from auditor.cli.main import main
from auditor.core.gate import LineageRun
from auditor.core.lineage import LineageKey
from auditor.core.violations import SKIPPED
from auditor.store.decisions import DecisionStore
from auditor.store.lineage import LineageRecorder
from auditor.store.store import Store


def test_demo(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    table = captured.out
    assert "low_sm_efficiency" in table and "VERDICT" in table
    for verdict in ("healthy", "idle", "underutilized", "memory_bound", "no_tensor_cores", "insufficient_data"):
        assert verdict in table
    assert "straggler" in table
    assert "demo:" in captured.err  # progress on stderr
    summaries = json.loads((out / "summaries.json").read_text())
    by_job = {s["job"]: s for s in summaries}
    # issue 28: the headline is the straggler (the cause), not the waiting ranks' low SM activity
    assert by_job["PyTorchJob/llm-finetune"]["verdict"] == "underutilized"
    assert by_job["PyTorchJob/llm-finetune"]["findings"][0]["evidence"]["reason"] == "straggler"
    assert by_job["PyTorchJob/llm-finetune"]["gpus"] == 4
    assert by_job["Job/legacy-ranker"]["sm_active"] is None
    # issue 15's recorded workloads
    assert by_job["PyTorchJob/llm-pretrain-naive-attn"]["verdict"] == "memory_bound"
    stalled = by_job["Job/detector-train"]
    assert stalled["verdict"] == "underutilized" and stalled["findings"][0]["evidence"]["reason"] == "input_stall"
    copies = by_job["Job/shard-loader"]
    assert copies["verdict"] == "low_sm_efficiency" and "copy_only" in [f["code"] for f in copies["findings"]]
    assert copies["pcie_rx_bytes_per_s"] > 50e9
    assert len({s["team"] for s in summaries}) == 4
    html = (out / "index.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "data:image/png;base64," in html
    assert not re.findall(r'(?:src|href)="(?!data:)', html)  # self-contained
    assert (out / "demo.sqlite").exists()
    # a second run replaces the file rather than piling up
    assert main(["demo", "--out", str(out), "--no-html"]) == 0


# --------------------------------------------------------------------------- issue 30

NOW = datetime(2026, 11, 25, 15, 0, 0, tzinfo=timezone.utc)


@pytest.fixture
def demo_store(tmp_path, monkeypatch) -> Iterator[str]:
    """The demo's store, made at a fixed ``now``, with settings that name no cluster, and the
    chart's notification variables naming local receivers that must get nothing."""
    for name in ("GPU_AUDITOR_CLUSTER", "GPU_AUDITOR_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "settings.yaml").write_text("{}\n")
    monkeypatch.setenv("GPU_AUDITOR_CONFIG", str(tmp_path / "settings.yaml"))  # not /etc/gpu-auditor's
    slack, hook = Receiver(), Receiver()
    monkeypatch.setenv("GPU_AUDITOR_SLACK_WEBHOOK_URL", slack.url)
    monkeypatch.setenv("GPU_AUDITOR_WEBHOOK_URL", hook.url)
    monkeypatch.setenv("GPU_AUDITOR_WEBHOOK_HMAC_KEY", "k" * 32)
    try:
        run_demo(tmp_path / "demo", now=NOW, html=False)
        yield f"sqlite:///{tmp_path / 'demo' / 'demo.sqlite'}"
    finally:
        slack.close()
        hook.close()
    assert slack.requests == [] and hook.requests == []  # nothing is sent


def test_the_demo_runs_a_policy_cycle_that_records_and_sends_nothing(demo_store, capsys) -> None:
    """The shipped policies, each in mode audit, two cycles: violations open, every step is a
    dry run (its actions skipped), the headline offender gets to its alert step, and nothing is
    sent though the chart's notification variables name receivers (the fixture checks)."""
    store = Store.open(demo_store)
    try:
        ledger = DecisionStore(store)
        actions = ledger.actions()
        decisions = ledger.decisions()
    finally:
        store.close()
    assert actions and {a.state for a in actions} == {SKIPPED}
    assert all(d["dry_run"] and d["mode"] == "audit" for d in decisions)
    done = {(a.job.name, a.policy, a.action) for a in actions}
    assert ("llm-finetune", "high-util-low-sm", "notify") in done  # judged GPU by GPU
    assert ("jupyter-alice", "idle-gpus", "notify") in done
    assert main(["actions", "--db", demo_store, "--since", "2026-11-01T00:00:00Z", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(actions) and {r["state"] for r in rows} == {"skipped"}


def test_ack_and_prune_default_to_the_one_cluster_of_the_store(demo_store, capsys) -> None:
    assert main(["store", "prune", "--dry-run", "--db", demo_store]) == 0
    assert capsys.readouterr().out.startswith("cluster demo, as of ")
    assert main(["ack", "llm/llm-finetune", "--until", "1d", "--by", "admin", "--db", demo_store]) == 0
    assert "acknowledged llm/llm-finetune (cluster demo) until " in capsys.readouterr().out
    # a second cluster in the store: no default, the clusters are named
    store = Store.open(demo_store)
    try:
        LineageRecorder(store).record(
            LineageKey("other", "llm", "llm-finetune"), LineageRun("Job/x", "idle", start=NOW), NOW
        )
    finally:
        store.close()
    assert main(["ack", "llm/llm-finetune", "--by", "admin", "--db", demo_store]) == 2
    assert "holds clusters demo, other: pass --cluster NAME" in capsys.readouterr().err
    assert main(["ack", "llm/llm-finetune", "--by", "admin", "--cluster", "other", "--db", demo_store]) == 0
    assert "(cluster other)" in capsys.readouterr().out
