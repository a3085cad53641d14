"""The weekly report's MFU figures (issue 28): per team the GPU-hour-weighted MFU and its
distribution, per job the estimate, its reference and the recoverable GPU-hours, and the MFU gap
beside waste (never added to it), in every rendering; read from a real SQLite store written
through the real summarizer."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from reportgen import mfu_week, store_mfu_jobs

from auditor.reports import IsoWeek, generate
from auditor.reports.aggregate import mfu_sparkline
from auditor.reports.formats import teams_csv, to_markdown, write_jobs_csv
from auditor.reports.html import render_html
from auditor.reports.service import iter_jobs
from auditor.reports.slack import cluster_message, team_message
from auditor.store import Store

UTC = timezone.utc
WEEK = IsoWeek.parse("2026-W47")
WS = datetime(2026, 11, 16, tzinfo=UTC)
NOW = WS + timedelta(days=8)


def _store(tmp_path: Path) -> tuple[Store, dict[str, dict]]:
    store = Store.open(f"sqlite:///{tmp_path / 'mfu.sqlite'}")
    return store, store_mfu_jobs(store, mfu_week(WS), now=NOW)


@pytest.fixture
def week(tmp_path: Path) -> tuple[Store, dict[str, dict]]:
    store, docs = _store(tmp_path)
    yield store, docs
    store.close()


def test_team_mfu_distribution_and_recoverable(week: tuple[Store, dict[str, dict]]) -> None:
    store, docs = week
    unfused, fused, crossing = docs["gpt-unfused"], docs["gpt-fused"], docs["gpt-crossing"]
    assert unfused["mfu_reference"] == 0.4 and unfused["recoverable_gpu_hours"] > 0
    report = generate(store, WEEK, now=NOW)
    teams = {t["team"]: t for t in report["teams"]}
    llm, rec = teams["llm"], teams["recsys"]
    # the crossing job counts half (its first hour of two is in the week), its MFU unchanged
    hours = [(8.0, unfused["mfu_estimate"]), (4.0, fused["mfu_estimate"]), (2.0, crossing["mfu_estimate"])]
    want_mfu = sum(h * m for h, m in hours) / sum(h for h, _ in hours)
    assert llm["mfu"] == pytest.approx(want_mfu, abs=1e-4)
    want_rec = unfused["recoverable_gpu_hours"] + fused["recoverable_gpu_hours"] + crossing["recoverable_gpu_hours"] / 2
    assert llm["recoverable_gpu_hours"] == pytest.approx(want_rec, abs=1e-3)
    assert llm["referenced_jobs"] == 3 and llm["referenced_gpu_hours"] == 14.0
    assert sum(b["jobs"] for b in llm["mfu_histogram"]) == 3
    assert sum(b["gpu_hours"] for b in llm["mfu_histogram"]) == pytest.approx(14.0)
    # a class without a reference is never charged: the gap is unknown (null), not 0
    assert rec["referenced_jobs"] == 0 and rec["recoverable_gpu_hours"] is None and rec["mfu"] is not None
    # two losses, never mixed: waste is the same figure as without MFU
    assert report["total"]["waste_gpu_hours"] == pytest.approx(
        sum(t["waste_gpu_hours"] for t in report["teams"]), abs=1e-3
    )
    assert report["total"]["recoverable_gpu_hours"] == llm["recoverable_gpu_hours"]
    # the largest gap first; a job without a reference never makes the list
    gap = [j["job"] for j in report["total"]["top_mfu_gap"]]
    assert gap[0] == "Job/gpt-unfused" and "Job/dlrm" not in gap
    top = report["total"]["top_mfu_gap"][0]
    assert top["mfu_class"] == "llm-training" and top["mfu_reference"] == 0.4
    # the trend carries both figures
    assert report["total"]["trend"][-1]["mfu"] == report["total"]["mfu"]
    assert report["total"]["trend"][-1]["recoverable_gpu_hours"] == report["total"]["recoverable_gpu_hours"]


def test_every_rendering_says_the_gap_beside_waste(week: tuple[Store, dict[str, dict]]) -> None:
    store, _ = week
    report = generate(store, WEEK, now=NOW)
    t = report["total"]
    n = f"{t['recoverable_gpu_hours']:.3f}"
    sentence = f"At their class's reference MFU these 3 jobs would have needed {n} fewer GPU-hours"
    md = to_markdown(report)
    assert sentence in md and "## Largest MFU gap" in md and "| llm | " in md
    html = render_html(report, with_charts=False)
    assert sentence.replace("'", "&#39;") in html and 'data-table="top_mfu_gap"' in html and 'class="hist"' in html
    assert html.count('data-h="mfu_headline"') == 1 + len(report["teams"])  # the cluster, then each team
    rows = {r["team"]: r for r in csv.DictReader(io.StringIO(teams_csv(report)))}
    assert float(rows["llm"]["recoverable_gpu_hours"]) == report["teams"][0]["recoverable_gpu_hours"]
    assert rows["recsys"]["recoverable_gpu_hours"] == ""  # unknown, not 0
    buf = io.StringIO()
    write_jobs_csv(buf, str(WEEK), iter_jobs(store, WEEK))
    jobs = {r["job"]: r for r in csv.DictReader(io.StringIO(buf.getvalue()))}
    assert jobs["Job/gpt-unfused"]["mfu_class"] == "llm-training" and jobs["Job/dlrm"]["mfu_reference"] == ""
    _, blocks = cluster_message(report)
    text = json.dumps(blocks, ensure_ascii=False)
    assert sentence in text and "Teams with the largest MFU gap" in text
    _, blocks = team_message(report, report["teams"][0])
    text = json.dumps(blocks, ensure_ascii=False)
    assert "Largest MFU gap" in text and "llm-training" in text and "MFU distribution" in text


def test_sparkline_bins() -> None:
    hist = [{"lo": 0.15, "hi": 0.2, "jobs": 2, "gpu_hours": 8.0}, {"lo": 0.45, "hi": 0.5, "jobs": 1, "gpu_hours": 4.0}]
    line = mfu_sparkline(hist)
    assert len(line) == 20 and line[3] == "█" and line[9] == "▄" and line.count(" ") == 18
    assert mfu_sparkline([]) == ""
