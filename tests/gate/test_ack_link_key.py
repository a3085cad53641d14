"""The signed-link key is optional: a missing or short key file (the chart's Secret not created)
turns links off with a clear reason (the log, ``/gate/ack`` answering 503, ``doctor``) instead of
stopping the operator or the alerts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from auditor.cli.main import main
from auditor.operator_loop.ack_endpoint import without_key
from auditor.policy.config import link_issuer
from auditor.settings import Settings

BASE = "https://auditor.example.com"


def test_alerts_go_out_without_a_link_when_the_key_file_is_missing(tmp_path: Path, caplog) -> None:
    gate = {"ack_link_key_file": str(tmp_path / "missing"), "ack_link_base_url": BASE}
    with caplog.at_level(logging.ERROR, logger="auditor.policy.config"):
        assert link_issuer(Settings(gate=gate)) is None
    assert "alerts carry no acknowledgement link: gate.ack_link_key_file" in caplog.text
    assert "cannot read" in caplog.text


def test_the_endpoint_without_a_key_answers_503_with_why() -> None:
    code, kind, body = without_key("gate.ack_link_key_file /k: cannot read (No such file or directory)")("GET", "", b"")
    page = body.decode()
    assert code == 503 and kind.startswith("text/html")
    assert "cannot read (No such file or directory)" in page and "gpu-auditor ack NAMESPACE/LINEAGE" in page


@pytest.mark.parametrize(
    ("key", "status", "says"),
    [
        (None, "warn", "cannot read"),
        (b"short", "warn", "at least 16 bytes"),
        (b"a-key-of-sixteen-bytes-or-more\n", "ok", f"alerts link to {BASE}/gate/ack"),
    ],
)
def test_doctor_reports_the_key(prometheus, tmp_path: Path, capsys, key: bytes | None, status: str, says: str) -> None:
    f = tmp_path / "key"
    if key is not None:
        f.write_bytes(key)
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(yaml.safe_dump({"gate": {"ack_link_key_file": str(f), "ack_link_base_url": BASE}}))
    main(["doctor", "--prometheus", prometheus.url, "--config", str(cfg), "--output", "json"])
    (check,) = [c for c in json.loads(capsys.readouterr().out) if c["name"] == "gate: acknowledgement-link key"]
    assert check["status"] == status and says in check["detail"], check
    assert not check["failed"]
    if status == "warn":
        assert "gate.ackLinks.keySecret" in check["fix"] and "restart" in check["fix"]
