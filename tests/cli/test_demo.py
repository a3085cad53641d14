"""``gpu-auditor demo`` end to end (replay → store → table → HTML), no server."""

import json
import re

from auditor.cli.main import main


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
