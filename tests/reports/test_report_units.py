"""Server-free tests: the pure aggregation and split, the formats, the CLI on SQLite."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from reportgen import GenJob, store_jobs

from auditor.cli.main import main
from auditor.errors import BadInput
from auditor.reports.aggregate import Prices, WeekData, build_report, fmt, team_view
from auditor.reports.formats import teams_csv, to_markdown
from auditor.reports.html import render_html
from auditor.reports.slack import cluster_message, team_message
from auditor.store.reports import Group, JobWeek, _split

UTC = timezone.utc
WS = datetime(2026, 11, 16, tzinfo=UTC)
WE = WS + timedelta(days=7)


def g(
    team: str, verdict: str, hours: float, waste: float | None, model: str = "H200", tensor: float = 0.0, jobs: int = 1
) -> Group:
    measured = waste is not None
    return Group(
        team,
        verdict,
        model,
        jobs,
        hours,
        hours if measured else 0.0,
        0.0 if measured else hours,
        waste or 0.0,
        tensor * hours,
    )


def week(groups: list[Group], name: str = "2026-W47", start: datetime = WS) -> WeekData:
    return WeekData(name, start, start + timedelta(days=7), groups)


def test_totals_efficiency_cost_and_rounding() -> None:
    prices = Prices({"H200": 3.0}, default=1.5, currency="EUR")
    cur = week(
        [
            g("a", "healthy", 10, 2.0, tensor=0.5),
            g("a", "idle", 5, 5.0),
            g("a", "insufficient_data", 4, None, model="A100"),
            g("b", "low_sm_efficiency", 1 / 3, 0.3),
        ]
    )
    doc = build_report(cur, [], timezone="UTC", prices=prices, generated_at=WE, top_n=5)
    a = {t["team"]: t for t in doc["teams"]}["a"]
    assert a["gpu_hours"] == 19 and a["measured_gpu_hours"] == 15 and a["unmeasured_gpu_hours"] == 4
    # waste: the flagged (idle) job's idle SMs; the healthy job's 2 are headroom (docs/figures.md)
    assert a["sm_active_gpu_hours"] == 8 and a["efficiency"] == round(8 / 15, 4) and a["waste_gpu_hours"] == 5
    assert a["headroom_gpu_hours"] == 2 and a["flagged_jobs"] == 1
    assert a["tensor_active_gpu_hours"] == 5 and a["cost"] == 15 * 3 + 4 * 1.5 and a["waste_cost"] == 15
    assert a["verdicts"]["idle"] == 1 and list(a["verdicts"])[0] == "insufficient_data"
    assert doc["total"]["gpu_hours"] == 19.333 and doc["total"]["jobs"] == 4
    assert fmt("ratio", a["efficiency"]) == "53.33 %" and fmt("money", 1234.5, "EUR") == "1 234.50 EUR"
    assert fmt("hours", None) == "–"
    # a team view is the same numbers under scope "team"
    tv = team_view(doc, "b")
    assert tv["scope"] == "team" and tv["total"]["gpu_hours"] == 0.333 and tv["teams"] == [tv["total"]]
    with pytest.raises(BadInput):
        team_view(doc, "zzz")
    with pytest.raises(BadInput):
        Prices({"H200": -1.0})


def test_trend_and_empty_teams() -> None:
    hist = [week([g("a", "healthy", 2, 1.0)], f"2026-W{43 + k}", WS - timedelta(weeks=4 - k)) for k in range(4)]
    doc = build_report(week([]), hist, timezone="UTC", prices=Prices(), generated_at=WE, teams=["a", "new"])
    a, new = doc["teams"]
    assert a["jobs"] == 0 and a["efficiency"] is None and a["note"] and a["top_jobs"] == []
    # a week without jobs has no figures ("no data"), never 0 GPU-hours
    assert [p["gpu_hours"] for p in a["trend"]] == [2.0, 2.0, 2.0, 2.0, None]
    assert [p["efficiency"] for p in a["trend"]] == [0.5, 0.5, 0.5, 0.5, None]
    assert [p["jobs"] for p in a["trend"]] == [1, 1, 1, 1, 0]
    assert all(p["gpu_hours"] is None and p["waste_gpu_hours"] is None for p in new["trend"])
    assert new["trend"][-1]["week"] == "2026-W47" and doc["total"]["note"]
    assert "| 2026-W47 | no data |" in to_markdown(doc)
    assert 'data-k="no_data"' in render_html(doc, with_charts=False)
    # every format copes with an all-empty report
    assert "No jobs" in render_html(doc, with_charts=False)
    assert "No jobs" in to_markdown(doc)
    assert teams_csv(doc).count("\n") == 4
    text, blocks = team_message(doc, a)
    assert "No jobs" in json.dumps(blocks)
    cluster_message(doc)


def jw(start: datetime, end: datetime, hours: float, waste: float | None) -> JobWeek:
    return JobWeek(
        1, "c", "ns", "Job/x", "t", "healthy", "H200", start, end, "inside", 1.0, hours, 0.5, 0.2, waste, 1.0
    )


def test_split_by_rollup_and_by_time() -> None:
    j = jw(WE - timedelta(hours=2), WE + timedelta(hours=6), 8.0, 4.0)
    # rollup: 24 of 96 busy samples in the week, SM 0.25 there
    out = _split(
        j,
        WS,
        WE,
        busy="gpu_util",
        busy_samples={"gpu_util": 96},
        sums={"gpu_util": (20.0, 24), "sm_active": (6.0, 24)},
        has_buckets=True,
    )
    assert out.split == "rollup" and out.fraction == 0.25 and out.gpu_hours == 2.0 and out.sm_active == 0.25
    assert out.waste_gpu_hours == pytest.approx(1.5)
    # no buckets left: proportional to the span
    out = _split(
        jw(WE - timedelta(hours=2), WE + timedelta(hours=6), 8.0, 4.0),
        WS,
        WE,
        busy="gpu_util",
        busy_samples={"gpu_util": 96},
        sums={},
        has_buckets=False,
    )
    assert out.split == "time" and out.fraction == 0.25 and out.gpu_hours == 2.0 and out.waste_gpu_hours == 1.0
    # unmeasured stays unmeasured; a fraction never exceeds 1
    out = _split(
        jw(WS - timedelta(hours=1), WS + timedelta(hours=1), 2.0, None),
        WS,
        WE,
        busy="gpu_util",
        busy_samples={"gpu_util": 10},
        sums={"gpu_util": (9.0, 12)},
        has_buckets=True,
    )
    assert out.fraction == 1.0 and out.waste_gpu_hours is None


def test_cli_on_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from auditor.store import Store

    db = f"sqlite:///{tmp_path}/s.db"
    with Store.open(db) as s:
        store_jobs(
            s,
            [
                GenJob("a", "j1", WS + timedelta(hours=5), 3, 1, "low_sm"),
                GenJob("b", "j2", WS + timedelta(days=2), 2, 2, "healthy"),
            ],
            now=WE,
        )
    out = tmp_path / "out"
    assert main(["report", "--week", "2026-W47", "--format", "csv,json,md", "--out", str(out), "--db", db]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in printed) == [
        "jobs-2026-W47.csv",
        "report-2026-W47.json",
        "report-2026-W47.md",
        "teams-2026-W47.csv",
    ]
    doc = json.loads((out / "report-2026-W47.json").read_text())
    rows = list(csv.DictReader(io.StringIO((out / "teams-2026-W47.csv").read_text())))
    assert float(rows[-1]["gpu_hours"]) == doc["total"]["gpu_hours"] == 7.0
    # one team, a team without jobs
    assert main(["report", "--week", "2026-W47", "--team", "a", "--format", "json", "--out", str(out), "--db", db]) == 0
    assert json.loads((out / "report-2026-W47-a.json").read_text())["total"]["gpu_hours"] == 3.0
    assert (
        main(["report", "--week", "2026-W47", "--team", "ghost", "--format", "html", "--out", str(out), "--db", db])
        == 0
    )
    assert "No jobs of team ghost" in (out / "report-2026-W47-ghost.html").read_text()
    assert "No jobs" in capsys.readouterr().err
    # bad input → exit 2
    for bad in (
        ["--week", "2026-48"],
        ["--week", "2026-W47", "--format", "pdf"],
        ["--week", "2026-W47", "--price", "H200"],
        ["--week", "2026-W47", "--timezone", "Nowhere/City"],
    ):
        assert main(["report", *bad, "--out", str(out), "--db", db]) == 2


def test_options_and_destinations_from_settings() -> None:
    from types import SimpleNamespace

    from auditor.reports import Destinations, options_from

    # the settings of today's operator: only the schedule → defaults
    o = options_from(SimpleNamespace(weekly_schedule="0 8 * * 1"))
    assert o.timezone == "UTC" and o.prices.default == 0.0 and o.top_n == 10 and o.teams == ()
    o = options_from(
        {
            "timezone": "Europe/Berlin",
            "prices": {"NVIDIA H200": 3.5, "default": 2},
            "currency": "EUR",
            "top_n": 3,
            "teams": ["a"],
        },
        cluster="prod",
    )
    assert o.prices.of("NVIDIA H200") == 3.5 and o.prices.of("A100") == 2.0 and o.prices.currency == "EUR"
    assert (o.timezone, o.top_n, o.teams, o.cluster) == ("Europe/Berlin", 3, ("a",), "prod")
    with pytest.raises(BadInput):
        options_from({"timezone": "Nowhere/City"})
    notifications = SimpleNamespace(
        slack=SimpleNamespace(webhook_url_env="ADMIN_SLACK"),
        webhook=SimpleNamespace(url_env="HOOK_URL", hmac_key_env="HOOK_KEY"),
        routes={
            "vision": SimpleNamespace(slack_webhook_url_env="VISION_SLACK"),
            "llm": SimpleNamespace(slack_webhook_url_env="UNSET"),
        },
    )
    env = {
        "ADMIN_SLACK": "https://hooks.example/a",
        "HOOK_URL": "https://hook.example/x",
        "HOOK_KEY": "k",
        "VISION_SLACK": "https://hooks.example/v",
    }
    d = Destinations.from_settings(notifications, env)
    assert set(d.team_slack) == {"vision"} and d.admin_slack is not None and d.webhook is not None
    d = Destinations.from_settings(SimpleNamespace(), {})
    assert d.team_slack == {} and d.admin_slack is None and d.webhook is None
