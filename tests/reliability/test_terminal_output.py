"""What the terminal shows of hostile or odd data: one line per row, no escape sequences, no
10 kB lines, gaps drawn as gaps, and no MIG footnote on a GPU that is not MIG.

The probes: a ``\\n`` in a pod name forged a row, ANSI escapes in labels repainted the terminal,
a 10 kB name broke the tables, ``explain`` drew a 2 h gap as continuous data, and a whole GPU
whose GPU_UTIL samples were all garbage was footnoted as MIG.
"""

from __future__ import annotations

import io
import json
import logging
import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from auditor import redact
from auditor.cli.explain import _points, render, timeline
from auditor.core.identity import JobKey
from auditor.core.job_summary import JobSummary
from auditor.core.metrics import Metric
from auditor.core.model import Bucket, Finding, GpuId, PodRef
from auditor.render.safe_text import terminal_safe
from auditor.render.table import format_table

GOLDEN = Path(__file__).parents[1] / "golden"
BASE = JobSummary.from_json(json.loads((GOLDEN / "audit/demo.json").read_text())[0])
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
W = timedelta(minutes=5)
EVIL = "train-0\nml  Pod/fake  8  100%  healthy\x1b[2J\x1b]0;owned\x07\x9b31m"
HUGE = "x" * 10_000


def bucket(pod: str, metric: Metric, i: int, value: float, gpu: str = "GPU-0") -> Bucket:
    start = T0 + i * W
    return Bucket(
        PodRef("ns", pod), GpuId(gpu, hostname="n1", index="0"), metric, start, start + W, value * 30, 30, value, value
    )


def assert_inert(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\r" not in text


def _explained(cluster: str, job: str, label: str) -> str:
    s = replace(
        BASE,
        key=JobKey.of(cluster, "ns", job),
        team=label,
        findings=(Finding("idle", "pod " + label + " idle", {"pod": label}),),
        per_gpu=tuple(replace(g, pod=label, hostname=label) for g in BASE.per_gpu),
    )
    assert s.to_json()["job"] == job  # the JSON keeps the whole name
    return render(s, [bucket(label, Metric.SM_ACTIVE, 0, 0.5)])


def test_explain_shows_hostile_names_on_one_line_each_and_bounded() -> None:
    out = _explained("c\x1b[31m", "Job/" + HUGE, EVIL)
    assert_inert(out)
    assert max(len(line) for line in out.splitlines()) < 1000  # the 10 kB name is cut for display
    assert out.count("\n") == _explained("c", "Job/x", "train-0").count("\n")  # no forged line
    assert "train-0\\nml  Pod/fake" in out  # the newline shows as \n, inside its own line


def test_the_verdict_table_keeps_one_row_per_job_for_10kb_names() -> None:
    rows = [replace(BASE, key=JobKey.of("c", "ns", "Job/" + HUGE), team=HUGE), replace(BASE, team=EVIL)]
    for wide in (False, True):
        out = format_table(rows, wide=wide)
        assert_inert(out)
        assert out.count("\n") == format_table([BASE, BASE], wide=wide).count("\n")
    assert max(len(line) for line in format_table(rows).splitlines()) <= 120


def test_explain_draws_a_two_hour_gap_as_a_gap() -> None:
    # 1 h of data, 2 h without any bucket, 1 h of data: 48 slots of 5 min, all within 72 columns
    data = [bucket("p", Metric.SM_ACTIVE, i, 1.0) for i in [*range(12), *range(36, 48)]]
    row = next(line for line in timeline(data) if "SM active" in line)
    bars = row.split("│")[1]
    assert bars == "█" * 12 + " " * 24 + "█" * 12
    assert timeline(data)[0].startswith("timeline: 2026-11-30T09:00:00Z → 2026-11-30T13:00:00Z, one column per 5 min")


def test_a_gap_wider_than_a_column_still_shows_when_columns_merge() -> None:
    # 30 h at 5 min = 360 slots → 5 slots per column; a 2 h gap is 24 blank slots ≥ 4 blank columns
    data = [bucket("p", Metric.SM_ACTIVE, i, 1.0) for i in range(360) if not 180 <= i < 204]
    bars = next(line for line in timeline(data) if "SM active" in line).split("│")[1]
    assert len(bars) == 72 and "    " in bars and bars.count(" ") == 4


def test_the_png_line_breaks_across_a_gap() -> None:
    series = {T0 + i * W: (30.0, 30) for i in [0, 1, 2, 30, 31]}
    xs, ys = _points(series, sorted(series), W)
    assert len(xs) == 6 and math.isnan(ys[3]) and ys[:3] == [100.0] * 3


def test_gr_engine_utilization_is_footnoted_as_mig_only_on_mig() -> None:
    whole = replace(BASE, means=replace(BASE.means, gpu_util=None, gr_engine_active=0.5))
    out = format_table([whole])
    assert "50%†" in out and "MIG" not in out and "no usable GPU_UTIL samples" in out
    mig = replace(whole, per_gpu=tuple(replace(g, mig_instance="1") for g in whole.per_gpu))
    out = format_table([mig])
    assert "50%*" in out and "* = MIG" in out and "GPU_UTIL samples" not in out


def test_a_log_line_quoting_a_hostile_name_stays_one_line() -> None:
    """The CLI's log formatter (cli/main.py installs it on the root handler) neutralises the
    message: a newline or an ANSI escape in a logged pod name cannot forge or repaint a line."""
    stream = io.StringIO()
    logger = logging.getLogger("tests.reliability.hostile")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        redact.install(logger, clean=terminal_safe)
        logger.warning("pod %s could not be attributed", EVIL)
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed on %s", "x\ny")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert_inert(stream.getvalue())
    assert lines[0] == "pod " + terminal_safe(EVIL) + " could not be attributed"
    assert lines[1] == "failed on x\\ny" and lines[2] == "Traceback (most recent call last):"  # its own lines stay


def test_the_actions_list_keeps_one_line_per_action() -> None:
    from auditor.cli.actions import table

    row = {"updated_at": "2026-11-30T09:00:00Z", "state": "failed", "action": "notify", "policy": "p\x1b[2J"}
    out = table([{**row, "namespace": "ns", "job": EVIL, "error": "HTTP 500: " + EVIL, "why": None}])
    assert_inert(out)
    assert len(out.splitlines()) == 2 and max(len(line) for line in out.splitlines()) <= 120
