"""The console's MFU figures (issue 28): the cluster, team and job pages show the MFU, its
reference and the recoverable GPU-hours (the MFU gap) beside waste, never added to it; the job
list sorts by them; and the pages render in a real headless Chromium (a job's MFU gauge at
desktop and phone widths).

The store holds a week written through the real summarizer with a class reference
(tests/reports/reportgen.py ``mfu_week``): an unfused transformer, its fused twin, one crossing
the week's end, and a recommender that has no reference and is never charged."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from auditor import compose
from auditor.console.app import ConsoleApp
from auditor.settings import Settings
from auditor.store import Store
from tests.console.browser import Browser
from tests.console.conftest import ARTIFACTS, serve
from tests.reports.reportgen import mfu_week, store_mfu_jobs

WS = datetime(2026, 11, 16, tzinfo=timezone.utc)  # Monday of 2026-W47
NOW = WS + timedelta(days=8)


@dataclass
class MfuConsole:
    url: str
    app: ConsoleApp
    store: Store
    docs: dict[str, dict]

    def page(self, path: str) -> str:
        where, _, query = path.partition("?")
        r = self.app.handle("GET", where, query, {}, b"")
        assert r.status == 200, r.body[:400]
        return r.body.decode()

    def job_id(self, name: str, team: str) -> int:
        found = self.store.find_job(f"ns-{team}", "Job", name, cluster="c1")
        assert found is not None
        return found[0]


@pytest.fixture(scope="module")
def mfu_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MfuConsole]:
    store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('mfu-console') / 'store.db'}")
    docs = store_mfu_jobs(store, mfu_week(WS), now=NOW)
    app = compose.console(Settings(cluster="c1"), store, lambda: NOW, writes=False)
    try:
        with serve(app) as url:
            yield MfuConsole(url, app, store, docs)
    finally:
        store.close()


def test_cluster_page_says_the_gap_beside_waste(mfu_console: MfuConsole) -> None:
    page = mfu_console.page("")
    docs = mfu_console.docs
    gap = sum(docs[n]["recoverable_gpu_hours"] for n in ("gpt-unfused", "gpt-fused", "gpt-crossing"))
    assert f"At their class&#x27;s reference MFU these 3 jobs would have needed {gap:,.1f} fewer GPU-hours" in page
    assert "MFU (GPU-hour-weighted)" in page and "recoverable GPU-hours (MFU gap)" in page
    assert "Recoverable GPU-hours (MFU gap) by team, week 2026-W48" in page
    # waste: the flagged jobs' idle-SM hours only (docs/figures.md), a healthy job's are headroom
    waste = sum(
        d["waste_gpu_hours"] or 0.0 for d in docs.values() if d["verdict"] not in ("healthy", "insufficient_data")
    )
    assert f"Waste (flagged jobs&#x27; SMs idle, {waste:,.1f} GPU-h) is counted apart and never added to it" in page


def test_teams_page_has_mfu_and_recoverable_per_week(mfu_console: MfuConsole) -> None:
    page = mfu_console.page("teams")
    assert "MFU per week (GPU-hour-weighted, jobs with an estimate)" in page
    assert "Recoverable GPU-hours per week (MFU gap)" in page
    row = re.search(r"<tr><td><a href=[^>]*>recsys</a></td><td>2026-W47</td>(.*?)</tr>", page)
    assert row and row.group(1).endswith("<td>n/a</td>")  # no reference: never charged, not 0


def test_job_list_sorts_by_the_gap_and_job_pages_show_the_reference(mfu_console: MfuConsole) -> None:
    page = mfu_console.page("jobs?sort=recoverable_gpu_hours&desc=1")
    names = re.findall(r'<a href="/console/jobs/\d+">ns-\w+/Job/([\w-]+)</a>', page)
    assert names[0] == "gpt-unfused" and names[-1] == "dlrm", names
    unfused = mfu_console.page(f"jobs/{mfu_console.job_id('gpt-unfused', 'llm')}")
    assert "llm-training" in unfused and 'class="chart gauge"' in unfused and 'data-k="gap"' in unfused
    rec = mfu_console.docs["gpt-unfused"]["recoverable_gpu_hours"]
    assert f"<dt>recoverable GPU-hours</dt><dd>{rec:,.1f}</dd>" in unfused
    dlrm = mfu_console.page(f"jobs/{mfu_console.job_id('dlrm', 'recsys')}")
    assert "<dt>reference MFU</dt><dd>none applies</dd>" in dlrm and 'data-k="gap"' not in dlrm


def test_mfu_pages_render_in_chromium(mfu_console: MfuConsole) -> None:
    b = Browser()
    try:
        job = mfu_console.job_id("gpt-unfused", "llm")
        for width, height in ((1366, 900), (390, 844)):
            b.viewport(width, height, mobile=width < 500)
            for path in ("", "teams", f"jobs/{job}"):
                b.goto(f"{mfu_console.url}/{path}")
                assert b.js("document.documentElement.scrollWidth") <= width + 1, f"{path} overflows at {width}"
                errors = [e for e in b.events if e.get("method") in ("Runtime.exceptionThrown", "Log.entryAdded")]
                assert not errors, errors
                b.screenshot(ARTIFACTS / f"mfu-{(path or 'cluster').replace('/', '-')}-{width}.png")
            gauge = b.js(
                "(() => { const s = document.querySelector('svg.gauge'); const r = s.getBoundingClientRect();"
                " return {w: r.width, gap: s.querySelector('[data-k=gap]').getBoundingClientRect().width}; })()"
            )
            assert 200 < gauge["w"] <= width and gauge["gap"] > 0, gauge
    finally:
        b.close()
    assert Path(ARTIFACTS / "mfu-cluster-390.png").exists()
