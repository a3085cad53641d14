"""The demo writes the weekly team report of its own store, with the same GPU-hours."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from auditor.cli.demo import run_demo


def test_demo_weekly_report(tmp_path) -> None:
    now = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)  # Wednesday: the 6 h window is inside W48
    summaries = run_demo(tmp_path, now=now)
    page = (tmp_path / "weekly-report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "2026-W48" in page
    assert not re.findall(r'(?:src|href)="(?!data:)', page)
    assert page.count("data:image/png;base64,") == 3
    total = sum(s.gpu_hours or 0.0 for s in summaries)
    m = re.search(r'<b data-k="gpu_hours">([0-9 .]+)</b>', page)
    assert m and float(m.group(1).replace(" ", "")) == pytest.approx(total, abs=1e-3)
    for team in ("vision", "llm", "recsys", "research"):
        assert f'data-team="{team}"' in page
