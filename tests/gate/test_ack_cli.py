"""``gpu-auditor ack``: recorded in the store (SQLite, PostgreSQL) with who, until and why."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from auditor.cli.ack import parse_until
from auditor.core.gate import AckKind, LineageRun
from auditor.core.lineage import LineageKey
from auditor.errors import BadInput
from auditor.store.lineage import AckLog, LineageRecorder
from auditor.store.store import Store

CLI = str(Path(sys.executable).with_name("gpu-auditor"))
KEY = LineageKey("default", "ml", "train")
GATE = """apiVersion: gpu-auditor.io/v1alpha1
kind: GatePolicy
metadata: {name: hold-low-sm}
spec: {action: hold, verdicts: [low_sm_efficiency], atLeast: 2}
"""


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "ack", *args], capture_output=True, text=True, cwd=cwd)


def flagged_store(url: str, now: datetime) -> None:
    store = Store.open(url)
    try:
        rec = LineageRecorder(store)
        for i in range(2):
            rec.record(KEY, LineageRun(f"Job/train-{i}", "low_sm_efficiency", start=now - timedelta(hours=5 - i)), now)
    finally:
        store.close()


def test_ack_records_who_until_why_and_the_gate_releases(store_url: str, tmp_path: Path) -> None:
    now = datetime.now(timezone.utc)  # the CLI acknowledges at its own clock; the runs are laid out before it
    flagged_store(store_url, now)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "gate.yaml").write_text(GATE)
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(f"policies: {{builtin: false, dir: {tmp_path / 'policies'}}}\ngate: {{mode: enforce}}\n")
    r = run("ml/train", "--until", "7d", "--reason", "fixed the loader", "--db", store_url, "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "acknowledged ml/train (cluster default) until " in r.stdout
    assert f"as os:{getpass.getuser()}: fixed the loader" in r.stdout
    assert "the gate now: admit — acknowledged by os:" in r.stdout
    store = Store.open(store_url)
    try:
        [a] = AckLog(store).acks(KEY)
    finally:
        store.close()
    assert a.by == f"os:{getpass.getuser()}" and a.reason == "fixed the loader" and a.via == "cli"
    assert a.until is not None and timedelta(days=7) - timedelta(minutes=5) < a.until - a.at <= timedelta(days=7)
    r = run("ml/train", "--snooze", "--until", "now+2h", "--by", "admin", "--db", store_url, "--output", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["kind"], doc["by"], doc["lineage"]) == ("snooze", "admin", "ml/train")
    store = Store.open(store_url)
    try:
        assert [x.kind for x in AckLog(store).acks(KEY)] == [AckKind.ACK, AckKind.SNOOZE]
    finally:
        store.close()


def test_bad_input_exits_2_and_records_nothing(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from auditor.cli.main import main

    flagged_store(store_url, datetime.now(timezone.utc))
    for args, message in [
        (("ml/trian",), "no lineage ml/trian in cluster default"),
        (("ml/trian",), "(known: train)"),
        (("train",), "NAMESPACE/LINEAGE: 'train' is not NAMESPACE/LINEAGE"),
        (("ml/train", "--until", "now-1h"), "is not in the future"),
        (("ml/train", "--until", "tomorrow"), "--until: cannot read time 'tomorrow'"),
        (("ml/train", "--snooze"), "--snooze needs --until"),
        (("ml/train", "--cluster", "other"), "no lineage ml/train in cluster other"),
    ]:
        assert main(["ack", *args, "--db", store_url]) == 2, args
        err = capsys.readouterr().err
        assert message in err, (args, err)
    store = Store.open(store_url)
    try:
        assert AckLog(store).acks(KEY) == []
    finally:
        store.close()


@pytest.mark.testbed
def test_ack_with_a_kubeconfig_records_the_kubernetes_user(testbed, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    flagged_store(url, datetime.now(timezone.utc))
    r = run("ml/train", "--kubeconfig", testbed.kubeconfig, "--db", url, "--output", "json")
    assert r.returncode == 0, r.stderr
    by = json.loads(r.stdout)["by"]
    # the name the apiserver authenticated (the bed's admin certificate), not the OS account
    assert by == "kube:admin" != f"kube:{getpass.getuser()}"


def test_parse_until() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
    assert parse_until(None, now) is None
    assert parse_until("7d", now) == now + timedelta(days=7)
    assert parse_until("1h30m", now) == now + timedelta(minutes=90)
    assert parse_until("now+2h", now) == now + timedelta(hours=2)
    # whole seconds, printed and stored at one precision (issue 30), whatever now's fraction
    assert parse_until("2d", now.replace(microsecond=472_000)) == now + timedelta(days=2)
    assert parse_until("2026-12-01T00:00:00Z", now) == datetime(2026, 12, 1, tzinfo=timezone.utc)
    with pytest.raises(BadInput):
        parse_until("2026-12-01", now)
