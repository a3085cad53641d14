"""The console in a real headless Chromium (tests/console/browser.py, the DevTools protocol):
pages load with data and without script errors, the job list's filter works as a user drives
it, a job page draws its per-GPU charts, the ack button records an acknowledgement in the store
with the proxy's user, and screenshots at desktop (1366 px) and phone (390 px) widths are kept
in test-artifacts/console/."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from auditor.core.lineage import LineageKey
from auditor.store.lineage import AckLog
from tests.console.browser import Browser
from tests.console.conftest import ARTIFACTS, Console
from tests.console.data import CLUSTER, NOW

DESKTOP, PHONE = (1366, 900), (390, 844)
PAGES = ("", "teams", "jobs", "policy", "gate", "deliveries")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser()
    try:
        yield b
    finally:
        b.close()


def errors(b: Browser) -> list[dict]:
    return [e for e in b.events if e.get("method") in ("Runtime.exceptionThrown", "Log.entryAdded")]


def test_pages_load_with_data_at_desktop_and_phone_widths(console: Console, browser: Browser) -> None:
    timings: dict[str, float] = {}
    for width, height in (DESKTOP, PHONE):
        browser.viewport(width, height, mobile=width < 500)
        for page in PAGES + (f"jobs/{console.ids['finetune']}", f"jobs/{console.ids['hostile']}"):
            seconds = browser.goto(f"{console.url}/{page}")
            name = (page or "cluster").replace("/", "-")
            timings[f"{name}@{width}"] = round(seconds, 3)
            assert browser.js("document.querySelector('h1').textContent")
            assert browser.js("document.querySelectorAll('main table, main svg').length") > 0, page
            assert browser.js("document.documentElement.scrollWidth") <= width + 1, f"{page} overflows at {width} px"
            assert not errors(browser), (page, errors(browser))
            assert browser.js("typeof window.pwned") == "undefined", page  # the hostile team label ran
            browser.screenshot(ARTIFACTS / f"{name}-{width}.png")
    (ARTIFACTS / "load-seconds.json").write_text(json.dumps(timings, indent=1) + "\n")


def test_job_list_filter_and_client_side_table_filter(console: Console, browser: Browser) -> None:
    browser.viewport(*DESKTOP)
    browser.goto(f"{console.url}/jobs")
    assert (
        browser.js("document.getElementById('count').textContent") == "1–18 of 18 jobs"
    )  # issue 28's demo: + gpt-pretrain, its twin
    # choosing a team submits the filter form (console.js), the server answers with its jobs
    browser.submit_and_wait(
        "const s = document.querySelector('select[name=team]'); s.value = 'vision';"
        " s.dispatchEvent(new Event('change')); true"
    )
    assert "team=vision" in browser.js("location.search")
    teams = browser.js("[...document.querySelectorAll('table.jobs tbody tr')].map(r => r.cells[1].textContent)")
    assert teams == ["vision"] * 3
    # a column header sorts over every matching job, on the server
    browser.submit_and_wait("document.querySelector('table.jobs th a[href*=\"sort=gpu_hours\"]').click(); true")
    hours = browser.js(
        "[...document.querySelectorAll('table.jobs tbody tr')].map(r => parseFloat(r.cells[3].textContent))"
    )
    assert hours == sorted(hours, reverse=True)
    # the teams table filters as one types (console.js)
    browser.goto(f"{console.url}/teams")
    shown = browser.js(
        "const i = document.querySelector('input.filter'); i.value = 'recsys'; i.dispatchEvent(new Event('input'));"
        " [...document.querySelectorAll('table.teams tbody tr')].filter(r => !r.hidden).map(r => r.cells[0].textContent)"
    )
    assert shown and set(shown) == {"recsys"}


def test_job_page_draws_per_gpu_charts(console: Console, browser: Browser) -> None:
    for width, height in (DESKTOP, PHONE):
        browser.viewport(width, height, mobile=width < 500)
        browser.goto(f"{console.url}/jobs/{console.ids['finetune']}")
        charts = browser.js(
            "[...document.querySelectorAll('svg.timeline')].map(s => ({w: s.getBoundingClientRect().width,"
            " lines: s.querySelectorAll('polyline').length, points: s.querySelector('polyline').points.length}))"
        )
        assert len(charts) == 4
        assert all(c["lines"] == 4 and c["points"] == 48 for c in charts), charts  # 4 h in 5-min buckets
        assert all(200 < c["w"] <= width for c in charts), charts


def test_ack_button_records_an_acknowledgement(console: Console, browser: Browser) -> None:
    browser.viewport(*DESKTOP)
    browser.call("Network.enable")
    browser.call("Network.setExtraHTTPHeaders", headers={"X-Forwarded-User": "dana"})  # as an OIDC proxy would
    try:
        job = console.store.find_job("research", "Pod", "jupyter-alice", cluster=CLUSTER)
        assert job is not None
        browser.goto(f"{console.url}/jobs/{job[0]}")
        assert "recorded as dana" in browser.js("document.querySelector('form.ack').textContent")
        browser.submit_and_wait(
            "document.querySelector('form.ack input[name=reason]').value = 'notebook closed';"
            " document.querySelector('form.ack select[name=until]').value = '30d';"
            " document.getElementById('ack-button').click(); true"
        )
        assert browser.js("location.pathname") == f"/console/jobs/{job[0]}"
        assert "dana" in browser.js("document.querySelector('table.acks').textContent")
        browser.screenshot(ARTIFACTS / "job-after-ack-1366.png")
    finally:
        browser.call("Network.setExtraHTTPHeaders", headers={})
    acks = AckLog(console.store).acks(LineageKey(CLUSTER, "research", "jupyter-alice"))
    assert [(a.by, a.kind.value, a.via, a.reason, a.at) for a in acks] == [
        ("dana", "ack", "console", "notebook closed", NOW)
    ]
    assert acks[0].until is not None and (acks[0].until - NOW).days == 30
