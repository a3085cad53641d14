"""ISO weeks as half-open UTC intervals in a report time zone. Pure.

A report week is the ISO week (Monday 00:00 to the next Monday 00:00) *in the report's time
zone*, so a team in Berlin gets Monday-to-Monday Berlin time. The bounds are computed from the
local midnights and converted to UTC, so a week that contains a DST change really is 167 or 169
hours long; nothing here adds ``timedelta(days=7)`` to a local time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from auditor.errors import BadInput

_WEEK = re.compile(r"^(\d{4})-?W(\d{2})$")


def zone(name: str | None) -> ZoneInfo:
    """The IANA time zone ``name`` (``None``/empty: UTC), or :class:`BadInput` naming it."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise BadInput(f"unknown time zone {name!r} (use an IANA name such as UTC or Europe/Berlin): {exc}") from None


@dataclass(frozen=True, slots=True, order=True)
class IsoWeek:
    """One ISO week (``2026-W48``); :meth:`bounds` places it in a time zone."""

    year: int
    week: int

    def __post_init__(self) -> None:
        last = date(self.year, 12, 28).isocalendar()[1]  # 28 Dec is always in the last ISO week
        if not 1 <= self.week <= last:
            raise BadInput(f"ISO week {self.year}-W{self.week:02d} does not exist ({self.year} has {last} weeks)")

    @classmethod
    def parse(cls, text: str) -> "IsoWeek":
        """``YYYY-Www`` (``2026-W48``; ``2026W48`` too), or :class:`BadInput`."""
        m = _WEEK.match(text.strip()) if isinstance(text, str) else None
        if not m:
            raise BadInput(f"week {text!r} is not an ISO week (expected YYYY-Www, e.g. 2026-W48)")
        return cls(int(m.group(1)), int(m.group(2)))

    @classmethod
    def containing(cls, t: datetime, tz: ZoneInfo) -> "IsoWeek":
        """The ISO week that contains the instant ``t`` as seen in ``tz``."""
        if t.tzinfo is None:
            raise BadInput(f"time {t.isoformat()} has no time zone")
        y, w, _ = t.astimezone(tz).isocalendar()
        return cls(y, w)

    @property
    def monday(self) -> date:
        return date.fromisocalendar(self.year, self.week, 1)

    def bounds(self, tz: ZoneInfo) -> tuple[datetime, datetime]:
        """``[start, end)`` in UTC: local Monday 00:00 of this week and of the next."""
        start = datetime.combine(self.monday, time(0), tzinfo=tz)
        end = datetime.combine(self.monday + timedelta(days=7), time(0), tzinfo=tz)
        return start.astimezone(timezone.utc), end.astimezone(timezone.utc)

    def shift(self, weeks: int) -> "IsoWeek":
        """The week ``weeks`` later (negative: earlier)."""
        y, w, _ = (self.monday + timedelta(weeks=weeks)).isocalendar()
        return IsoWeek(y, w)

    def __str__(self) -> str:
        return f"{self.year}-W{self.week:02d}"


def last_complete_week(t: datetime, tz: ZoneInfo) -> IsoWeek:
    """The latest ISO week (in ``tz``) that has ended at the instant ``t``."""
    return IsoWeek.containing(t, tz).shift(-1)
