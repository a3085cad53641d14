"""The weekly report reads at a glance: no currency without prices, "no data" for a team or a week
without jobs (never 0), and every table fits a 1,400 px window in a real headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_report_chromium import chromium
from test_report_units import WE, g, week

from auditor.reports.aggregate import Prices, build_report
from auditor.reports.formats import to_markdown
from auditor.reports.html import render_html
from auditor.reports.slack import cluster_message, team_message

GOLDEN = Path(__file__).parents[1] / "golden/report/cluster.html"


def _doc(prices: Prices) -> dict:
    cur = week([g("a", "low_sm_efficiency", 10.0, 8.0), g("b", "healthy", 4.0, 0.4)])
    return build_report(cur, [], timezone="UTC", prices=prices, generated_at=WE, teams=["a", "b", "new"])


def _renderings(doc: dict) -> list[str]:
    slack = [json.dumps(cluster_message(doc)[1])] + [json.dumps(team_message(doc, t)[1]) for t in doc["teams"]]
    return [render_html(doc, with_charts=False), to_markdown(doc), *slack]


def test_no_currency_without_prices() -> None:
    for text in _renderings(_doc(Prices())):
        assert "USD" not in text and "cost" not in text.lower().replace("costs at", "")
    priced = _renderings(_doc(Prices(default=2.0)))
    assert all("USD" in text for text in priced[:4])  # the page, Markdown, cluster and team a in Slack
    assert "waste cost" in priced[0] and "| waste cost |" in priced[1]


def test_a_team_without_jobs_reads_no_data_never_zero() -> None:
    doc = _doc(Prices())
    html, md = render_html(doc, with_charts=False), to_markdown(doc)
    row = re.search(r'<tr data-team="new">.*?</tr>', html, re.S)
    assert row and 'data-k="no_data"' in row.group(0) and "0.000" not in row.group(0)
    assert re.search(r"^\| new \| no data \|", md, re.M)
    assert re.search(r"^\| a \| 1 \| 10\.000", md, re.M)  # a team with jobs keeps its figures


PROBE = """<script>window.addEventListener('load', function () {
  var out = Array.prototype.map.call(document.querySelectorAll('.scroll'), function (b) {
    return {table: (b.querySelector('table') || {}).getAttribute('data-table'), over: b.scrollWidth - b.clientWidth}; });
  var pre = document.createElement('pre'); pre.id = 'fit-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre); });</script>"""


def test_every_table_fits_1400_px_in_chromium(tmp_path: Path) -> None:
    """The golden cluster report (every table, the longest advice) at a 1,400 px window: no table
    is wider than its box, so nothing (advice included) is clipped or needs a sideways scroll."""
    page = tmp_path / "cluster.html"
    page.write_text(GOLDEN.read_text().replace("</body>", PROBE + "</body>"))
    out = chromium("--window-size=1400,1000", "--dump-dom", page.as_uri(), tmp=tmp_path).stdout
    probe = json.loads(re.search(r'<pre id="fit-probe">(.*?)</pre>', out, re.S).group(1))
    assert {p["table"] for p in probe} >= {"teams", "verdicts", "top_jobs", "trend"}
    assert [p for p in probe if p["over"] > 0] == []
