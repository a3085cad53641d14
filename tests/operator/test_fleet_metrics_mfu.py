"""The operator's MFU series per team (issue 28), scraped from its real ``/metrics`` endpoint.

A SQLite store holds a week written by the real summarizer with a class reference
(tests/reports/reportgen.py ``mfu_week``: llm's unfused and fused transformers measured against
the bf16 LLM training reference, recsys's recommender without one); one cycle over the last hour
of the unfused job is fed to :class:`OperatorMetrics`; the HTTP server answers the scrape.
"""

from __future__ import annotations

import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.core.job_summary import JobSummary
from auditor.core.model import Window
from auditor.operator_loop.health import HealthServer, OperatorMetrics
from auditor.store import Store
from tests.reports.reportgen import mfu_week, store_mfu_jobs

WS = datetime(2026, 11, 16, tzinfo=timezone.utc)
#: half an hour after the unfused job (WS + 1 d, 2 h) ended
NOW = WS + timedelta(days=1, hours=2, minutes=30)
WINDOW = Window(NOW - timedelta(hours=2, minutes=30), NOW)  # the whole unfused run: 4 GPUs x 2 h


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, list], dict[str, dict]]]:
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('fleet-mfu') / 's.db'}")
    metrics = OperatorMetrics()
    server = HealthServer("127.0.0.1", 0, metrics=metrics, healthy=lambda: (True, ""), ready=lambda: (True, "")).start()
    try:
        docs = store_mfu_jobs(store, mfu_week(WS), now=WS + timedelta(days=8))
        summaries = [JobSummary.from_json(d) for d in docs.values()]
        metrics.fleet.observe_cycle("c1", WINDOW, summaries, [])
        metrics.fleet.observe_store(store, "c1", NOW, since=NOW - timedelta(days=7))
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out: dict[str, list] = {}
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                out.setdefault(sample.name, []).append((sample.labels, sample.value))
        yield out, docs
    finally:
        server.stop()
        store.close()


def _value(samples: list, **labels: str) -> float:
    return sum(v for lab, v in samples if all(lab.get(k) == x for k, x in labels.items()))


def test_mfu_and_recoverable_counters_per_team(scraped: tuple[dict[str, list], dict[str, dict]]) -> None:
    m, docs = scraped
    unfused = docs["gpt-unfused"]
    hours = 4 * 2.0  # only the unfused job ran inside the cycle's window
    mfu_h = _value(m["gpu_auditor_mfu_gpu_hours_total"], cluster="c1", team="llm")
    measured = _value(m["gpu_auditor_mfu_measured_gpu_hours_total"], cluster="c1", team="llm")
    assert measured == pytest.approx(hours) and mfu_h / measured == pytest.approx(unfused["mfu_estimate"], abs=1e-6)
    rec = _value(m["gpu_auditor_recoverable_gpu_hours_total"], team="llm", verdict=unfused["verdict"])
    assert rec == pytest.approx(unfused["recoverable_gpu_hours"], rel=1e-3)
    # the gap is its own counter: the waste counter is what it was without MFU
    sm = unfused["sm_active"]
    assert _value(m["gpu_auditor_waste_gpu_hours_total"], team="llm") == pytest.approx(hours * (1 - sm), rel=1e-6)
    # recsys ran outside the window, and has no reference anyway: no gap series for it
    assert not [lab for lab, _ in m["gpu_auditor_recoverable_gpu_hours_total"] if lab["team"] == "recsys"]


def test_team_gauges_of_the_last_hour(scraped: tuple[dict[str, list], dict[str, dict]]) -> None:
    m, docs = scraped
    mfu = {lab["team"]: v for lab, v in m["gpu_auditor_team_mfu"]}
    gap = {lab["team"]: v for lab, v in m["gpu_auditor_team_recoverable_gpu_hours"]}
    # every stored job's summary ends after NOW - 1 h (the store holds the whole week): all count
    llm = [d for d in docs.values() if d["team"] == "llm"]
    want = sum(d["gpu_hours"] * d["mfu_estimate"] for d in llm) / sum(d["gpu_hours"] for d in llm)
    assert mfu["llm"] == pytest.approx(want, abs=1e-6)
    assert gap["llm"] == pytest.approx(sum(d["recoverable_gpu_hours"] for d in llm), rel=1e-6)
    # a team without a reference has an MFU but no recoverable series: unknown, never 0
    assert "recsys" in mfu and "recsys" not in gap
