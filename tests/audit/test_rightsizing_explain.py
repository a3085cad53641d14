"""``explain`` shows right-sizing advice (issue 32, part 3) for a job a slice would hold, priced
at the settings' price per GPU-hour, in text and JSON; a job no slice holds shows nothing new."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mfu_replay import END, replay

from auditor.cli.main import main
from auditor.core.model import JobRef
from auditor.store import Store


@pytest.fixture
def db(tmp_path: Path) -> tuple[str, str]:
    docs = replay("h200-workloads", {"tiny_kernels_launch_bound": (None, "Job"), "bf16_matmul": (None, "Job")})
    url = f"sqlite:///{tmp_path}/s.db"
    store = Store.open(url)
    try:
        for doc in docs.values():
            ref = JobRef("c", "bench", "Job", doc["job"].split("/", 1)[1], None, "bench")
            store.save_summary(store.upsert_job(ref, END.replace(hour=10), END), doc)
    finally:
        store.close()
    config = tmp_path / "settings.yaml"
    config.write_text("reports:\n  prices:\n    NVIDIA H200: 4.0\n  currency: EUR\n")
    return url, str(config)


def test_explain_shows_the_advice_of_a_job_that_fits(db, capsys):
    url, config = db
    assert main(["explain", "bench/Job/tiny-kernels-launch-bound", "--db", url, "--config", config]) == 0
    out = capsys.readouterr().out
    assert "right-sizing: [right_size]" in out and "MIG 1g.18gb" in out and "EUR" in out
    main(["explain", "bench/Job/tiny-kernels-launch-bound", "--db", url, "--config", config, "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    ev = doc["right_size"]["evidence"]
    assert ev["mig_profile"] == "1g.18gb" and ev["cost_freed"] == pytest.approx(ev["gpu_hours_freed"] * 4.0, abs=0.01)


def test_explain_says_nothing_of_a_job_no_slice_holds(db, capsys):
    url, config = db
    assert main(["explain", "bench/Job/bf16-matmul", "--db", url, "--config", config]) == 0
    assert "right-sizing" not in capsys.readouterr().out
    main(["explain", "bench/Job/bf16-matmul", "--db", url, "--config", config, "-o", "json"])
    assert "right_size" not in json.loads(capsys.readouterr().out)
