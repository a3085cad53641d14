"""Time ranges: a hostile or mistyped range is refused in one line before anything is read.

The probe: ``audit --start 0001-01-01T00:00:00Z`` ended in a MemoryError traceback, and a
10-year range over 3 pods took 2.6 GB, because a read keeps one value per bucket of every
series for the whole range. A range is now bounded by the ``max_audit_range`` setting (31 d by
default) and by 100,000 buckets per series, and times before 1970 and out-of-range dates are
bad input (exit 2). Within the bound a read still keeps dense per-bucket arrays for every series
it finds (auditor/sources/prometheus.py, scale's), so a short-lived pod in a long range costs
the whole range: the bound keeps that at 26,784 buckets of 5 min per series.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from auditor.errors import BadInput
from auditor.timeparse import MAX_BUCKETS, check_range, format_duration, parse_duration, parse_time

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
#: the child's own peak (VmHWM of its address space): ru_maxrss would not do, Linux carries the
#: parent's high-water mark into the child across fork + exec, so late in a suite the pytest
#: process's size (364 MB in CI) was read as the audit's
MEASURE = (
    "import sys; from auditor.cli.main import main; rc = main(sys.argv[1:]); "
    "hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')); "
    "print('maxrss_kb', hwm, file=sys.stderr); sys.exit(rc)"
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def audit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gpu-auditor audit`` in a child process that reports its peak memory on stderr."""
    return subprocess.run(
        [sys.executable, "-c", MEASURE, "audit", "--no-kube", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("0001-01-01T00:00:00Z", "before 1970-01-01T00:00:00Z"),
        ("1969-12-31T23:59:59Z", "before 1970-01-01T00:00:00Z"),
        ("now-99999999999d", "is too long"),
        ("now+99999999d", "out of the range of dates"),
        ("now-1000000w", "out of the range of dates"),
    ],
)
def test_impossible_times_are_bad_input(text: str, message: str) -> None:
    with pytest.raises(BadInput, match=message) as err:
        parse_time(text, NOW, what="--start")
    assert str(err.value).startswith("--start: ")


def test_durations_that_round_to_nothing_or_overflow_are_bad_input() -> None:
    with pytest.raises(BadInput, match="must be positive"):
        parse_duration("0.0000001ms", what="--bucket")
    with pytest.raises(BadInput, match="too long"):
        parse_duration("99999999999999d", what="--lookback")


def test_the_range_bound_says_what_to_do() -> None:
    start = datetime(2016, 12, 1, tzinfo=timezone.utc)
    with pytest.raises(BadInput) as err:
        check_range(start, NOW, max_range=timedelta(days=31), width=timedelta(minutes=5))
    assert str(err.value) == (
        "--start 2016-12-01T00:00:00Z to --end 2026-12-01T12:00:00Z is 3652d12h, longer than max_audit_range (31d): "
        "audit it in pieces, or raise max_audit_range in the settings file (GPU_AUDITOR_MAX_AUDIT_RANGE)"
    )
    with pytest.raises(BadInput, match=f"more than {MAX_BUCKETS:,}: use a wider --bucket"):
        check_range(NOW - timedelta(days=30), NOW, max_range=timedelta(days=31), width=timedelta(seconds=1))
    check_range(NOW - timedelta(days=31), NOW, max_range=timedelta(days=31), width=timedelta(seconds=30))
    assert [format_duration(timedelta(seconds=s)) for s in (90, 5400, 86400 * 7, 0.5)] == [
        "1m30s",
        "1h30m",
        "7d",
        "0.5s",
    ]


@pytest.mark.parametrize(
    "start, env, line",
    [
        ("0001-01-01T00:00:00Z", {}, "gpu-auditor: error: --start: '0001-01-01T00:00:00Z' is before 1970"),
        (
            "2016-11-30T00:00:00Z",
            {},
            "gpu-auditor: error: --start 2016-11-30T00:00:00Z to --end 2026-11-30T00:00:00Z is 3652d, longer than max_audit_range (31d)",
        ),
        (
            "2016-11-30T00:00:00Z",
            {"GPU_AUDITOR_MAX_AUDIT_RANGE": "4000d"},
            "gpu-auditor: error: --start 2016-11-30T00:00:00Z to --end 2026-11-30T00:00:00Z in 5m buckets is 1,051,776 buckets, more than 100,000",
        ),
    ],
)
def test_audit_refuses_an_unbounded_range_in_one_line_before_reading(
    start: str, env: dict[str, str], line: str, tmp_path: Path
) -> None:
    # a closed port: the refusal comes before any query (and before a store is opened)
    r = audit(
        "--prometheus",
        f"http://127.0.0.1:{closed_port()}",
        "--start",
        start,
        "--end",
        "2026-11-30T00:00:00Z",
        "--db",
        f"sqlite:///{tmp_path}/a.db",
        env=env,
    )
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if not x.startswith("maxrss_kb")]
    assert len(lines) == 1 and lines[0].startswith(line), r.stderr
    assert not (tmp_path / "a.db").exists()


def test_the_length_of_an_allowed_range_costs_no_memory_by_itself(prometheus, tmp_path: Path) -> None:
    """31 days (the default bound) of a selection that matches no series: the read costs what
    the interpreter costs (measured here: 92.6 MB for 31 d, 92.5 MB for 1 h; the probe's
    10 years over 3 pods took 2.6 GB). Not asserted on the bed's own pods: other tests and
    benchmarks load the shared bed's Prometheus (31 d of it took 113 MB one hour, 746 MB the
    next). The range is relative to now; nothing asserted depends on the clock."""
    r = audit(
        "--prometheus",
        prometheus.url,
        "--match",
        "namespace=no-such-namespace-harden",
        "--start",
        "now-31d",
        "--db",
        f"sqlite:///{tmp_path}/a.db",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rss_mb = int(r.stderr.rsplit("maxrss_kb", 1)[1].split()[0]) / 1024
    assert rss_mb < 150, f"{rss_mb:.0f} MB"
