"""The weekly report's Kueue queue waits per team (median, p90), next to efficiency, in every format."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from test_report_units import g

from auditor.reports.aggregate import Prices, WeekData, build_report
from auditor.reports.formats import to_markdown
from auditor.reports.html import render_html
from auditor.reports.slack import cluster_message, team_message

WS = datetime(2026, 11, 16, tzinfo=timezone.utc)


def _report() -> dict:
    groups = [g("a", "healthy", 10, 2.0), g("b", "healthy", 4, 1.0), g("c", "idle", 1, 1.0)]
    waits = {"a": [30.0, 60.0, 90.0, 600.0], "b": [5.0]}
    cur = WeekData("2026-W47", WS, WS + timedelta(days=7), groups, queue_waits=waits)
    return build_report(cur, [], timezone="UTC", prices=Prices(), generated_at=WS + timedelta(days=7))


def test_median_and_p90_per_team_and_for_the_cluster() -> None:
    doc = _report()
    teams = {t["team"]: t for t in doc["teams"]}
    assert (teams["a"]["admitted_jobs"], teams["a"]["queue_wait_median_s"], teams["a"]["queue_wait_p90_s"]) == (
        4,
        75.0,
        447.0,
    )
    assert (teams["b"]["queue_wait_median_s"], teams["b"]["queue_wait_p90_s"]) == (5.0, 5.0)
    # a team with no job admitted through Kueue: no figure, never 0
    assert teams["c"]["admitted_jobs"] == 0 and teams["c"]["queue_wait_median_s"] is None
    assert doc["total"]["admitted_jobs"] == 5 and doc["total"]["queue_wait_median_s"] == 60.0


def test_every_format_shows_the_waits_next_to_efficiency() -> None:
    doc = _report()
    md = to_markdown(doc)
    assert "| team | jobs | GPU-hours | SM-active GPU-h | tensor-active GPU-h | efficiency | queue wait median |" in md
    row_a = next(line for line in md.splitlines() if line.startswith("| a |"))
    assert "| 75 s | 7 min |" in row_a
    html = render_html(doc)
    assert '<td data-k="queue_wait_median_s">75 s</td><td data-k="queue_wait_p90_s">7 min</td>' in html
    a = next(t for t in doc["teams"] if t["team"] == "a")
    _, blocks = team_message(doc, a)
    assert "*Queue wait median · p90*\n75 s · 7 min" in [f["text"] for b in blocks for f in b.get("fields", [])]
    _, blocks = cluster_message(doc)
    assert "*Queue wait median · p90*\n60 s · 7 min" in [f["text"] for b in blocks for f in b.get("fields", [])]
