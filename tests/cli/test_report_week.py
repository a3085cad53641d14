"""``report --week last|this``: the week is taken in the report's time zone, from an injected now."""

from datetime import datetime, timezone

import pytest

from auditor.cli.report import parse_week
from auditor.errors import BadInput

#: Monday 2026-11-30 00:30 UTC: already Monday in Berlin, still Sunday in New York
NOW = datetime(2026, 11, 30, 0, 30, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "tz", "week"),
    [
        ("last", "UTC", "2026-W48"),
        ("LAST", "Europe/Berlin", "2026-W48"),
        ("last", "America/New_York", "2026-W47"),  # W48 has not ended there yet
        ("this", "UTC", "2026-W49"),
        ("this", "America/New_York", "2026-W48"),
        ("2026-W12", "UTC", "2026-W12"),
    ],
)
def test_week_words(text: str, tz: str, week: str) -> None:
    assert str(parse_week(text, NOW, tz)) == week


def test_anything_else_is_bad_input() -> None:
    with pytest.raises(BadInput, match="not an ISO week"):
        parse_week("yesterday", NOW, "UTC")
