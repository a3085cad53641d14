"""ISO weeks in a time zone, the cron trigger and which week is due: week boundaries and DST."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from auditor.errors import BadInput
from auditor.reports.delivery import build_trigger, due_week, latest_fire
from auditor.reports.weeks import IsoWeek, last_complete_week, zone

UTC = timezone.utc
BERLIN = zone("Europe/Berlin")


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


@pytest.mark.parametrize(
    "text, year, week",
    [("2026-W48", 2026, 48), ("2026W01", 2026, 1), ("2026-W53", 2026, 53), (" 2020-W53 ", 2020, 53)],
)
def test_parse(text: str, year: int, week: int) -> None:
    assert IsoWeek.parse(text) == IsoWeek(year, week)
    assert str(IsoWeek.parse(text)) == f"{year}-W{week:02d}"


@pytest.mark.parametrize("text", ["2026-48", "2026-W54", "2025-W53", "2026-W00", "W48", "", "2026-w48x"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(BadInput):
        IsoWeek.parse(text)


def test_bounds_utc_and_year_boundary() -> None:
    assert IsoWeek(2026, 48).bounds(zone("UTC")) == (utc(2026, 11, 23), utc(2026, 11, 30))
    # ISO 2027-W01 starts on Monday 2027-01-04; 2026 has 53 weeks
    assert IsoWeek(2026, 53).shift(1) == IsoWeek(2027, 1)
    assert IsoWeek(2027, 1).bounds(zone("UTC"))[0] == utc(2027, 1, 4)
    assert IsoWeek(2027, 1).shift(-1) == IsoWeek(2026, 53)
    assert IsoWeek.containing(utc(2027, 1, 3, 23, 59), zone("UTC")) == IsoWeek(2026, 53)


def test_week_boundary_depends_on_the_time_zone() -> None:
    # Sunday 23:30 UTC is already Monday in Berlin
    t = utc(2026, 11, 22, 23, 30)
    assert IsoWeek.containing(t, zone("UTC")) == IsoWeek(2026, 47)
    assert IsoWeek.containing(t, BERLIN) == IsoWeek(2026, 48)
    assert IsoWeek(2026, 48).bounds(BERLIN) == (utc(2026, 11, 22, 23), utc(2026, 11, 29, 23))


def test_dst_weeks_are_167_and_169_hours() -> None:
    # Europe: clocks go forward on Sun 2026-03-29 (W13) and back on Sun 2026-10-25 (W43)
    s, e = IsoWeek(2026, 13).bounds(BERLIN)
    assert (s, e) == (utc(2026, 3, 22, 23), utc(2026, 3, 29, 22))
    assert e - s == timedelta(hours=167)
    s, e = IsoWeek(2026, 43).bounds(BERLIN)
    assert (s, e) == (utc(2026, 10, 18, 22), utc(2026, 10, 25, 23))
    assert e - s == timedelta(hours=169)
    # consecutive weeks tile time: no gap, no overlap
    for w in range(10, 46):
        assert IsoWeek(2026, w).bounds(BERLIN)[1] == IsoWeek(2026, w + 1).bounds(BERLIN)[0]


def test_crontab_day_numbers_mean_what_crontab_says() -> None:
    # apscheduler 3 would read "1" as Tuesday; we translate crontab's numbers
    trig = build_trigger("0 8 * * 1", "UTC")
    nxt = trig.get_next_fire_time(None, utc(2026, 11, 24))
    assert nxt.strftime("%a %H:%M") == "Mon 08:00" and nxt.date().isoformat() == "2026-11-30"
    assert build_trigger("30 6 * * 0", "UTC").get_next_fire_time(None, utc(2026, 11, 24)).strftime("%a") == "Sun"
    assert build_trigger("0 8 * * 1-5", "UTC").get_next_fire_time(None, utc(2026, 11, 28)).strftime("%a") == "Mon"
    assert (
        build_trigger("mon 09:15", "UTC").get_next_fire_time(None, utc(2026, 11, 24)).strftime("%a %H:%M")
        == "Mon 09:15"
    )
    for bad in ("0 8 * *", "0 25 * * 1", "0 8 * * 9", "every monday"):
        with pytest.raises(BadInput):
            build_trigger(bad, "UTC")
    with pytest.raises(BadInput):
        build_trigger("0 8 * * 1", "Mars/Olympus")


def test_fire_times_follow_local_time_across_dst() -> None:
    trig = build_trigger("0 8 * * 1", "Europe/Berlin")
    # Monday 2026-10-19 08:00 CEST = 06:00 UTC; Monday 2026-10-26 08:00 CET = 07:00 UTC
    assert latest_fire(trig, utc(2026, 10, 19, 6, 30)) == utc(2026, 10, 19, 6)
    assert latest_fire(trig, utc(2026, 10, 26, 6, 59)) == utc(2026, 10, 19, 6)
    assert latest_fire(trig, utc(2026, 10, 26, 7, 0)) == utc(2026, 10, 26, 7)
    # spring: Monday 2026-03-30 08:00 CEST = 06:00 UTC (the week before: 07:00 UTC)
    assert latest_fire(trig, utc(2026, 3, 30, 6, 0)) == utc(2026, 3, 30, 6)
    assert latest_fire(trig, utc(2026, 3, 30, 5, 59)) == utc(2026, 3, 23, 7)


def test_due_week_is_the_last_complete_week_at_the_fire_time() -> None:
    trig = build_trigger("0 8 * * 1", "Europe/Berlin")
    # just before the first fire of the autumn DST week's successor: the week before is due
    assert due_week(trig, utc(2026, 10, 26, 6, 59), "Europe/Berlin") == (IsoWeek(2026, 42), utc(2026, 10, 19, 6))
    # at 08:00 CET the 169-hour week W43 becomes due
    assert due_week(trig, utc(2026, 10, 26, 7, 0), "Europe/Berlin") == (IsoWeek(2026, 43), utc(2026, 10, 26, 7))
    # days later it is still the same week (the ledger, not the clock, says whether it was sent)
    assert due_week(trig, utc(2026, 10, 29, 12), "Europe/Berlin")[0] == IsoWeek(2026, 43)
    # a Sunday-evening schedule reports the week that ended before, not the running one
    sunday = build_trigger("0 20 * * 0", "UTC")
    assert due_week(sunday, utc(2026, 11, 29, 21), "UTC")[0] == IsoWeek(2026, 47)
    assert last_complete_week(utc(2026, 11, 30, 0, 0), zone("UTC")) == IsoWeek(2026, 48)


def test_a_nonexistent_local_time_fires_once() -> None:
    # 02:30 does not exist in Berlin on Sunday 2026-03-29 (clocks jump 02:00 → 03:00)
    trig = build_trigger("30 2 * * 0", "Europe/Berlin")
    fires = []
    t, prev = utc(2026, 3, 21), None
    while True:
        nxt = trig.get_next_fire_time(prev, t)
        if nxt > utc(2026, 4, 6):
            break
        fires.append(nxt.astimezone(UTC))
        prev, t = nxt, nxt + timedelta(microseconds=1)
    days = [f.date().isoformat() for f in fires]
    assert days == ["2026-03-22", "2026-03-29", "2026-04-05"]
