"""One set of numbers on every surface (issue 30; docs/figures.md).

The demo cluster, audited into a store (SQLite, then the bed's PostgreSQL) at an injected
``NOW``, is read through every surface — the audit's table and JSON, ``explain``, ``status``,
the weekly report, the console (its reader and its pages) and the operator's ``/metrics`` — and
the figures of every job and every team are compared. Where windows differ (``status`` and the
gauges: the last hour; the report and the console's team tables: the ISO week), the expected
figures are computed over the jobs of that window with the one definition
(:mod:`auditor.core.figures`), never with a second copy of it.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
from fake_clock import FakeClock
from prometheus_client import CollectorRegistry

from auditor import compose
from auditor.cli.demo import scenario
from auditor.cli.main import main
from auditor.console import pages
from auditor.console.app import iso_weeks
from auditor.console.ports import JobFilter
from auditor.core.figures import Figures, gpus_text, is_flagged, of_jobs
from auditor.core.job_summary import JobSummary
from auditor.engine import run_audit
from auditor.operator_loop.fleet_metrics import FleetMetrics, families
from auditor.render.table import format_table
from auditor.settings import Settings
from auditor.sources.replay import ReplaySource
from auditor.store import Store
from auditor.store.console_queries import ConsoleQueries
from auditor.store.status_queries import operator_status

#: seconds per test (the demo's audit): the slow tier, and the bed's for PostgreSQL
pytestmark = pytest.mark.slow

#: a Wednesday: the demo's six hours lie inside ISO week 2026-W48
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
WEEK = "2026-W48"
CLUSTER = "demo"
RUNNING_WITHIN = timedelta(minutes=15)


@dataclass
class Demo:
    url: str
    store: Store
    summaries: list[JobSummary]
    window: Any

    def job_key(self, s: JobSummary) -> str:
        return f"{s.namespace}/{s.job}"


@pytest.fixture
def demo(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Demo]:
    """The demo cluster audited into ``store_url`` at ``NOW``; the CLI's clock reads ``NOW``."""
    monkeypatch.setattr(compose, "clock", lambda: FakeClock(NOW))
    monkeypatch.delenv("GPU_AUDITOR_CONFIG", raising=False)
    sc = scenario(NOW, interval=timedelta(minutes=2))
    source = ReplaySource(sc.feeds, end=NOW, duration=sc.duration, interval=sc.interval)
    store = Store.open(store_url)
    try:
        result = run_audit(source, sc.resolver, store, sc.window, now=NOW, clock=FakeClock(NOW))
        yield Demo(store_url, store, list(result.summaries), sc.window)
    finally:
        store.close()


def _by_team(summaries: list[JobSummary]) -> dict[str, Figures]:
    teams: dict[str, list[JobSummary]] = {}
    for s in summaries:
        teams.setdefault(s.team or "", []).append(s)
    return {t: of_jobs(js) for t, js in teams.items()}


def _seen_within(summaries: list[JobSummary], since: datetime) -> list[JobSummary]:
    return [s for s in summaries if s.end is not None and s.end >= since]


def _approx(x: float | None, nd: int) -> Any:
    return None if x is None else pytest.approx(x, abs=0.6 * 10**-nd)


def _cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc in (0, 1), out  # status exits 1 without report deliveries etc.: the figures still print
    return json.loads(out)


def test_every_job_reads_the_same_everywhere(demo: Demo, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Per job: the audit JSON, the table, ``explain`` (JSON and text), the console's job list
    and the weekly report's per-job rows say the same GPUs, GPU-hours, waste, MFU, gap, verdict."""
    truth = {demo.job_key(s): s.to_json() for s in demo.summaries}
    assert len(truth) == 17

    table = format_table(demo.summaries, wide=True).splitlines()
    head = table[0].split()
    for key, doc in truth.items():
        ns, job = key.split("/", 1)
        cells = next(line.split() for line in table if line.split()[:2] == [ns, job])
        assert cells[head.index("GPUS")] == gpus_text(doc["gpus"]), cells
        assert cells[head.index("GPU-H")] == f"{doc['gpu_hours']:.2f}", cells

        explained = _cli_json(["explain", key, "--db", demo.url, "-o", "json"], capsys)["summary"]
        for field in ("gpus", "gpu_hours", "waste_gpu_hours", "mfu_estimate", "recoverable_gpu_hours", "verdict"):
            assert explained[field] == doc[field], (key, field)
        assert main(["explain", key, "--db", demo.url]) == 0
        text = capsys.readouterr().out
        assert f"GPUs {gpus_text(doc['gpus'])} " in text  # one GPU count: 0.14 for a 1g slice, not 0.1429

    app = compose.console(Settings(cluster=CLUSTER), demo.store, lambda: NOW, writes=False)
    page = ConsoleQueries(demo.store).jobs(JobFilter(limit=1000, running_since=NOW - RUNNING_WITHIN))
    assert page.total == len(truth)
    for r in page.rows:
        doc = truth[f"{r.namespace}/{r.kind}/{r.name}"]
        assert (r.verdict, r.gpu_hours, r.waste_gpu_hours) == (doc["verdict"], doc["gpu_hours"], doc["waste_gpu_hours"])
        assert (r.mfu_estimate, r.recoverable_gpu_hours) == (doc["mfu_estimate"], doc["recoverable_gpu_hours"])
        job_page = app.handle("GET", f"jobs/{r.id}", "", {}, b"").body.decode()
        assert f"<dt>GPUs</dt><dd>{gpus_text(doc['gpus'])}</dd>" in job_page  # 0.14, not 0.14285714
        # its state as the list (and the cluster page) counts it: a job not seen lately is not running
        assert ("<dt>state</dt><dd>running</dd>" in job_page) == r.running, r.name
    assert sum(not r.running for r in page.rows) >= 1  # the demo's mlp-baseline ended an hour ago

    assert main(["report", "--week", WEEK, "--db", demo.url, "-o", "csv", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    jobs_csv = tmp_path / f"jobs-{WEEK}.csv"
    with jobs_csv.open(newline="") as f:
        rows = {f"{r['namespace']}/{r['job']}": r for r in csv.DictReader(f)}
    assert set(rows) == set(truth)
    for key, r in rows.items():
        doc = truth[key]
        assert r["verdict"] == doc["verdict"]
        assert float(r["gpu_hours"]) == pytest.approx(doc["gpu_hours"], abs=5e-4)
        if doc["waste_gpu_hours"] is None:
            assert r["waste_gpu_hours"] == ""
        else:
            assert float(r["waste_gpu_hours"]) == pytest.approx(doc["waste_gpu_hours"], abs=5e-4)


def test_every_team_reads_the_same_everywhere(demo: Demo, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Per team: jobs, flagged, GPU-hours, waste (flagged jobs only), headroom, efficiency, MFU
    and recoverable hours agree between the table's sums, the weekly report, the console and,
    over their window (the last hour), ``status`` and the ``/metrics`` gauges."""
    week = _by_team(demo.summaries)  # every demo job lies inside the week
    assert set(week) == {"llm", "recsys", "research", "vision"}

    # the weekly report (JSON)
    assert main(["report", "--week", WEEK, "--db", demo.url, "-o", "json", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    for t in report["teams"]:
        f = week[t["team"]]
        assert t["jobs"] == f.jobs and t["flagged_jobs"] == f.flagged, t["team"]
        assert t["gpu_hours"] == _approx(f.gpu_hours, 3)
        assert t["waste_gpu_hours"] == _approx(f.waste_gpu_hours, 3)
        assert t["headroom_gpu_hours"] == _approx(f.headroom_gpu_hours, 3)
        assert t["efficiency"] == _approx(f.efficiency, 4)
        assert t["mfu"] == _approx(f.mfu, 4)
        assert t["recoverable_gpu_hours"] == _approx(f.recoverable, 3)
        # the most wasteful jobs are flagged jobs (a healthy job's idle SMs are headroom)
        assert all(is_flagged(j["verdict"]) for j in t["top_jobs"])
    whole = of_jobs(demo.summaries)
    assert report["total"]["waste_gpu_hours"] == _approx(whole.waste_gpu_hours, 3)

    # the console: the teams of the week, their page, and the cluster page
    reader = ConsoleQueries(demo.store)
    weeks = iso_weeks(NOW, 1)
    assert weeks[-1][0] == WEEK
    rows = reader.team_weeks(weeks, {})
    assert {r.team for r in rows} == set(week)
    teams_page = pages.teams("/console", rows, [WEEK], "USD")
    for r in rows:
        f = week[r.team]
        assert r.jobs == f.jobs and r.gpu_hours == pytest.approx(f.gpu_hours)
        assert r.waste_gpu_hours == pytest.approx(f.waste_gpu_hours)
        assert r.headroom_gpu_hours == pytest.approx(f.headroom_gpu_hours)
        assert r.efficiency == pytest.approx(f.efficiency)
        assert r.gap.mfu == pytest.approx(f.mfu) and r.gap.recoverable == _approx(f.recoverable, 9)
        assert r.main_waste == f.main_waste and is_flagged(r.main_waste)
        # the page prints the report's rounded figure (recsys: 52.4 % on both, was 62.0 % vs 52.44 %)
        report_eff = next(t["efficiency"] for t in report["teams"] if t["team"] == r.team)
        assert f"<td>{pages.pct(report_eff)}</td>" in teams_page
    c = reader.cluster_now(NOW, recent=RUNNING_WITHIN.total_seconds(), since=NOW - timedelta(days=7))
    assert c.flagged_jobs == whole.flagged
    assert c.waste_gpu_hours == pytest.approx(whole.waste_gpu_hours)
    assert c.headroom_gpu_hours == pytest.approx(whole.headroom_gpu_hours)
    assert c.gap.recoverable == pytest.approx(whole.recoverable)
    # running: the cluster page's count is the job list's state=running
    running = reader.jobs(JobFilter(state="running", limit=1000, running_since=NOW - RUNNING_WITHIN))
    assert c.running_jobs == running.total and all(r.running for r in running.rows)

    # status and the /metrics gauges: the jobs seen in the last hour
    hour = _by_team(_seen_within(demo.summaries, NOW - timedelta(hours=1)))
    doc = _cli_json(["status", "--db", demo.url, "-o", "json"], capsys)
    assert doc["window"]["seen_since"] == "2026-11-25T11:00:00Z"
    assert doc["flagged_now"] == sum(f.flagged for f in hour.values())
    assert set(doc["teams"]) == set(hour)
    for team, t in doc["teams"].items():
        f = hour[team]
        assert (t["jobs"], t["flagged"]) == (f.jobs, f.flagged), team
        assert t["gpu_hours"] == _approx(f.gpu_hours, 2)
        assert t["waste_gpu_hours"] == _approx(f.waste_gpu_hours, 2)
        assert t["headroom_gpu_hours"] == _approx(f.headroom_gpu_hours, 2)
        assert t["efficiency"] == _approx(f.efficiency, 4)
        # printed, it reads as the console prints it (no double rounding: 13.3 %, not 13.2 %)
        assert f"{100 * t['efficiency']:.1f}%" == pages.pct(f.efficiency)
    st = operator_status(demo.store, now=NOW, since=NOW - timedelta(days=7), recent_since=NOW - timedelta(hours=1))
    gauges = {fam.name: fam for fam in families(st, CLUSTER, lambda t: t)}
    eff = {s.labels["team"]: s.value for s in gauges["gpu_auditor_team_efficiency"].samples}
    assert eff == {t: pytest.approx(f.efficiency) for t, f in hour.items() if f.efficiency is not None}

    # the /metrics counters of the audit's cycle: waste = the flagged verdicts' idle-SM hours
    registry = CollectorRegistry()
    fleet = FleetMetrics(registry)
    fleet.observe_cycle(CLUSTER, demo.window, demo.summaries, [])
    waste: dict[str, float] = {}
    for fam in registry.collect():
        if fam.name == "gpu_auditor_waste_gpu_hours":
            for s in fam.samples:
                if s.name.endswith("_total") and is_flagged(s.labels["verdict"]):
                    waste[s.labels["team"]] = waste.get(s.labels["team"], 0.0) + s.value
    for team, f in week.items():
        assert waste.get(team, 0.0) == pytest.approx(f.waste_gpu_hours, rel=1e-3), team


def test_the_demo_windows_are_said(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    """Every surface that sums jobs says which: the table's footer its flagged count and what waste
    holds, ``status`` its hour, the console's tiles their start."""
    table = format_table(demo.summaries)
    whole = of_jobs(demo.summaries)
    assert f"17 jobs ({whole.flagged} flagged)" in table
    assert f"{whole.waste_gpu_hours:.2f} waste GPU-hours (flagged jobs' idle SMs" in table
    assert main(["status", "--db", demo.url]) in (0, 1)
    text = capsys.readouterr().out
    assert re.search(r"jobs flagged now: \d+ \(seen since 2026-11-25T11:00:00Z, the last hour", text)
    c = ConsoleQueries(demo.store).cluster_now(NOW, recent=900, since=NOW - timedelta(days=7))
    html = pages.cluster("/console", c, [], WEEK)
    assert "jobs to look at (flagged, since 2026-11-18 12:00)" in html
    assert "headroom GPU-hours (healthy jobs&#x27; idle SMs)" in html
