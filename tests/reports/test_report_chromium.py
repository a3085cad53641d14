"""Done-when of issue 6: a week of generated history for 5+ teams in the test bed's PostgreSQL,
the HTML report rendered by a real headless Chromium (started here): no broken images, a
screenshot taken (desktop and phone widths), the figures shown equal the JSON, CSV totals equal
the JSON, and the Markdown shows the same figures."""

from __future__ import annotations

import csv
import html
import io
import json
import re
import shutil
import struct
import subprocess
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest
from reportgen import GenJob, store_jobs

from auditor.cli.main import main
from auditor.reports import IsoWeek, Prices, ReportOptions, generate
from auditor.reports.aggregate import FIGURES, VERDICTS, fmt, mfu_headline
from auditor.reports.formats import teams_csv, to_markdown
from auditor.reports.html import render_html
from auditor.reports.weeks import zone
from auditor.store import Store

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WEEK = IsoWeek(2026, 47)
WS, WE = WEEK.bounds(zone("UTC"))
NOW = WE + timedelta(hours=8)
TEAMS = ("vision", "llm", "recsys", "research", "infra", "speech")
PROFILES = ("healthy", "low_sm", "idle", "no_sm", "underutilized")
KINDS = {k: kind for k, _, kind in FIGURES}
#: HTML's void elements the pages use (no end tag: the context stack must not wait for one)
VOID = ("img", "meta", "br", "link", "input", "wbr", "hr")

# After load, write what every <img> looks like into the page, for --dump-dom to print.
PROBE = """<script>window.addEventListener('load', function () {
  var out = Array.prototype.map.call(document.images, function (i) {
    return {complete: i.complete, w: i.naturalWidth, h: i.naturalHeight, src: i.src.slice(0, 22)}; });
  var pre = document.createElement('pre'); pre.id = 'img-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre); });</script>"""


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    profile = tmp / f"chromium-profile-{len(list(tmp.glob('chromium-profile-*')))}"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def assert_nontrivial_png(path: Path, width: int) -> None:
    import numpy as np
    from matplotlib.image import imread

    assert path.stat().st_size > 20_000
    w, h = png_size(path)
    assert w == width and h > 500
    px = imread(str(path))[..., :3]
    assert float(px.std()) > 0.05  # not a blank page
    assert len(np.unique((px * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 100  # charts, colours, text


class Cells(HTMLParser):
    """Collect the text of every element carrying data-k, with the enclosing data-team /
    data-week / data-job / data-table context."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[dict[str, str]] = []
        self.cells: list[tuple[dict[str, str], str, str]] = []  # (context, key, text)
        self._open: list[tuple[dict[str, str], str, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        ctx = dict(self.stack[-1]) if self.stack else {}
        for k in ("data-team", "data-week", "data-job", "data-table"):
            if k in a:
                ctx[k] = a[k]
        if tag in VOID:
            return
        self.stack.append(ctx)
        if "data-k" in a:
            self._open.append((ctx, a["data-k"], []))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if self._open and len(self.stack) and self._open[-1][0] is self.stack[-1]:
            ctx, key, parts = self._open.pop()
            self.cells.append((ctx, key, "".join(parts).strip()))
        if self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        for _, _, parts in self._open:
            parts.append(data)


def expected(key: str, value: object, cur: str) -> str:
    if key.startswith("verdicts."):
        return str(value)
    if key in KINDS:
        return fmt(KINDS[key], value, cur)
    kind = {
        "sm_active": "ratio",
        "tensor_active": "ratio",
        "waste_cost": "money",
        "actions_total": "int",
        "week": "text",
        "mfu_estimate": "ratio",
        "mfu_reference": "ratio",
        "recoverable_cost": "money",
        "referenced_jobs": "int",
    }.get(key, "hours")
    return fmt(kind, value, cur) if kind != "text" else str(value)


@pytest.fixture
def history(postgres_url: str):
    store = Store.open(postgres_url)
    jobs = []
    for i, team in enumerate(TEAMS[:5]):  # "speech" only has a configured name: an empty report
        for k in range(8):
            start = WS + timedelta(hours=11 * k + 3 * i)
            jobs.append(
                GenJob(team, f"{team}-job-{k}", start, 2 + (k * 3 + i) % 9, 1 + (k + i) % 4, PROFILES[(k + i) % 5])
            )
        # history for the trend, and a job crossing into the week
        for back in (1, 2, 3):
            jobs.append(
                GenJob(
                    team,
                    f"{team}-old-{back}",
                    WS - timedelta(weeks=back) + timedelta(days=2),
                    6 + back + i,
                    2,
                    PROFILES[(back + i) % 5],
                )
            )
        jobs.append(GenJob(team, f"{team}-cross", WS - timedelta(hours=5), 10, 1, "low_sm"))
    store_jobs(store, jobs, now=NOW)
    yield store, postgres_url
    store.close()


def test_html_report_in_chromium(history, tmp_path: Path) -> None:
    store, url = history
    opts = ReportOptions(prices=Prices({"NVIDIA H200": 3.25}, default=2.0), teams=("speech",))
    doc = generate(store, WEEK, now=NOW, options=opts)
    assert len([t for t in doc["teams"] if t["jobs"]]) >= 5
    page = render_html(doc)
    assert not re.findall(r'(?:src|href)="(?!data:)', page), "assets must be inline"
    html_file = tmp_path / "report.html"
    html_file.write_text(page, encoding="utf-8")
    probe_file = tmp_path / "probe.html"
    probe_file.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")

    dom = chromium("--virtual-time-budget=10000", "--dump-dom", probe_file.as_uri(), tmp=tmp_path).stdout
    m = re.search(r'<pre id="img-probe">(.*?)</pre>', dom, re.S)
    assert m, dom[-2000:]
    images = json.loads(m.group(1).replace("&quot;", '"'))
    assert len(images) == 3
    for img in images:
        assert img["complete"] and img["w"] > 300 and img["h"] > 150 and img["src"].startswith("data:image/png;base64")

    for width, height, name in ((1280, 2400, "desktop.png"), (390, 1800, "phone.png")):
        shot = tmp_path / name
        chromium(f"--window-size={width},{height}", f"--screenshot={shot}", html_file.as_uri(), tmp=tmp_path)
        assert_nontrivial_png(shot, width)

    # every figure Chromium shows equals the JSON document
    parser = Cells()
    parser.feed(dom)
    cur = doc["prices"]["currency"]
    teams = {t["team"]: t for t in doc["teams"]} | {"*": doc["total"]}
    checked = 0
    for ctx, key, text in parser.cells:
        team = teams.get(ctx.get("data-team", ""))
        if key == "week":
            assert text == doc["week"]
        elif "data-week" in ctx:
            (point,) = [p for p in doc["total"]["trend"] if p["week"] == ctx["data-week"]]
            if key == "no_data":
                assert text == "no data" and point["jobs"] == 0, (ctx, point)
            else:
                assert text == expected(key, point[key], cur), (ctx, key)
        elif "data-job" in ctx:
            owner = team or doc["total"]
            listed = owner["top_mfu_gap" if ctx.get("data-table") == "top_mfu_gap" else "top_jobs"]
            (job,) = [j for j in listed if f"{j['namespace']}/{j['job']}" == ctx["data-job"]]
            assert text == expected(key, job[key], cur), (ctx, key)
        elif key.startswith("verdicts."):
            assert text == str(team["verdicts"][key.split(".", 1)[1]]), (ctx, key)
        elif key == "no_data":  # a team without jobs in the week: no figures, never zeros
            assert team is not None and text == "no data" and team["jobs"] == 0, (ctx, team)
        else:
            assert team is not None, (ctx, key)
            assert text == expected(key, team[key], cur), (ctx, key, team["team"])
        checked += 1
    assert checked > 150
    shown = {(c.get("data-team"), k) for c, k, _ in parser.cells if "data-week" not in c and "data-job" not in c}
    for t in teams:
        if teams[t]["jobs"]:
            assert {(t, k) for k, _, _ in FIGURES} <= shown, t
    assert ("*", "verdicts.low_sm_efficiency") in shown
    assert "No jobs of team speech" in dom
    # the MFU gap's sentence, beside waste, for the cluster and each team with jobs (issue 28)
    text = html.unescape(dom)
    for t in teams.values():
        if t["jobs"]:
            assert mfu_headline(t) in text, t["team"]

    # CSV totals equal the JSON
    rows = list(csv.DictReader(io.StringIO(teams_csv(doc))))
    total = rows[-1]
    assert total["row"] == "total" and [r["team"] for r in rows[:-1]] == [t["team"] for t in doc["teams"]]
    for key in (
        "jobs",
        "gpu_hours",
        "measured_gpu_hours",
        "unmeasured_gpu_hours",
        "sm_active_gpu_hours",
        "tensor_active_gpu_hours",
        "efficiency",
        "waste_gpu_hours",
        "cost",
        "waste_cost",
        "actions_total",
    ):
        assert float(total[key]) == pytest.approx(doc["total"][key], abs=0), key
        if key != "efficiency":
            assert sum(float(r[key] or 0) for r in rows[:-1]) == pytest.approx(doc["total"][key] or 0, abs=0.01), key
    t = doc["total"]
    assert t["efficiency"] == pytest.approx(t["sm_active_gpu_hours"] / t["measured_gpu_hours"], abs=1e-4)
    for v in VERDICTS:
        assert int(total[f"verdict_{v}"]) == doc["total"]["verdicts"][v]
    # the Markdown carries the same formatted figures
    md = to_markdown(doc)
    for key, label, kind in FIGURES:
        assert f"- **{label}**: {fmt(kind, doc['total'][key], cur)}" in md

    # and the CLI writes all four formats from the same store with the same numbers
    out = tmp_path / "cli"
    assert (
        main(
            [
                "report",
                "--week",
                str(WEEK),
                "--format",
                "html,csv,md,json",
                "--out",
                str(out),
                "--db",
                url,
                "--price",
                "NVIDIA H200=3.25",
                "--price",
                "default=2",
            ]
        )
        == 0
    )
    cli_doc = json.loads((out / f"report-{WEEK}.json").read_text())
    assert cli_doc["total"] == {**doc["total"]} and [t["team"] for t in cli_doc["teams"]] == [
        t for t in sorted(teams) if t not in ("*", "speech")
    ]
    jobs_rows = list(csv.DictReader((out / f"jobs-{WEEK}.csv").open()))
    assert len(jobs_rows) == doc["total"]["jobs"]
    assert sum(float(r["gpu_hours"]) for r in jobs_rows) == pytest.approx(doc["total"]["gpu_hours"], abs=0.01)
