"""Times and durations as typed on the command line (pure: ``now`` is passed in)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from auditor.errors import BadInput
from auditor.timeparse import format_time, parse_duration, parse_time

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("now", NOW),
        ("now-6h", NOW - timedelta(hours=6)),
        ("NOW - 1h30m", NOW - timedelta(hours=1, minutes=30)),
        ("now+5m", NOW + timedelta(minutes=5)),
        ("now-7d", NOW - timedelta(days=7)),
        ("2026-11-30T09:00:00Z", datetime(2026, 11, 30, 9, tzinfo=timezone.utc)),
        ("2026-11-30T10:00:00+01:00", datetime(2026, 11, 30, 9, tzinfo=timezone.utc)),
        ("2026-11-30T09:00:00.250Z", datetime(2026, 11, 30, 9, 0, 0, 250000, tzinfo=timezone.utc)),
    ],
)
def test_parse_time(text, expected):
    value = parse_time(text, NOW)
    assert value == expected and value.tzinfo == timezone.utc


@pytest.mark.parametrize(
    "text, message",
    [
        ("yesterday", "cannot read time"),
        ("2026-11-30T09:00:00", "no UTC offset"),
        ("now-", "cannot read time"),
        ("now-6x", "cannot read duration"),
        ("", "cannot read time"),
    ],
)
def test_parse_time_errors_name_the_flag(text, message):
    with pytest.raises(BadInput, match=f"--start: .*{message}|--start: {message}"):
        parse_time(text, NOW, what="--start")


def test_naive_now_is_a_programming_error():
    with pytest.raises(ValueError):
        parse_time("now", datetime(2026, 1, 1))


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("5m", 300), ("1h30m", 5400), ("7d", 604800), ("2w", 1209600), ("500ms", 0.5), ("1.5h", 5400)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "5", "m5", "0s", "5m3", "-5m", "1y"])
def test_parse_duration_errors(text):
    with pytest.raises(BadInput):
        parse_duration(text, what="--bucket")


def test_format_time():
    assert format_time(datetime(2026, 11, 30, 10, tzinfo=timezone(timedelta(hours=1)))) == "2026-11-30T09:00:00Z"
    assert format_time(datetime(2026, 11, 30, 9, 0, 0, 250000, tzinfo=timezone.utc)) == "2026-11-30T09:00:00.250Z"
