"""Times and durations as users type them on the command line.

``--start``/``--end`` take RFC 3339 (``2026-11-30T09:00:00Z``, ``2026-11-30T10:00:00+01:00``) or
a time relative to now (``now``, ``now-6h``, ``now-1h30m``, ``now+5m``). Durations are
``<number><unit>`` terms (``90s``, ``5m``, ``1h30m``, ``7d``, ``2w``). Pure: ``now`` is passed in,
so the same text always gives the same answer in tests; errors are :class:`BadInput` naming the
flag, so the CLI exits 2 with a message the user can act on.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from auditor.errors import BadInput

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TERM = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_RELATIVE = re.compile(r"^now(?:\s*([+-])\s*(.+))?$")


def parse_duration(text: str, *, what: str = "duration") -> timedelta:
    """Parse ``1h30m``-style text into a timedelta (positive; ``0s`` is rejected).

    ``what`` names the flag in the error message.
    """
    s = text.strip().lower().replace(" ", "")
    if not s:
        raise BadInput(f"{what}: empty duration (examples: 90s, 5m, 1h30m, 7d)")
    pos, seconds = 0, 0.0
    for m in _TERM.finditer(s):
        if m.start() != pos:
            break
        seconds += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise BadInput(f"{what}: cannot read duration {text!r} (examples: 90s, 5m, 1h30m, 7d)")
    if seconds <= 0:
        raise BadInput(f"{what}: duration {text!r} must be positive")
    return timedelta(seconds=seconds)


def parse_time(text: str, now: datetime, *, what: str = "time") -> datetime:
    """Parse an RFC 3339 or ``now[±duration]`` time into an aware UTC datetime.

    A time without an offset is refused rather than guessed: RFC 3339 requires one, and a
    silently assumed zone shifts the audit window by hours.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    s = text.strip()
    m = _RELATIVE.match(s.lower())
    if m:
        if m.group(1) is None:
            return now.astimezone(timezone.utc)
        delta = parse_duration(m.group(2), what=what)
        return (now + delta if m.group(1) == "+" else now - delta).astimezone(timezone.utc)
    try:
        value = datetime.fromisoformat(s)
    except ValueError:
        raise BadInput(
            f"{what}: cannot read time {text!r}; use RFC 3339 (2026-11-30T09:00:00Z) or now, now-6h"
        ) from None
    if value.tzinfo is None:
        raise BadInput(f"{what}: time {text!r} has no UTC offset; add Z or e.g. +01:00 (RFC 3339)")
    return value.astimezone(timezone.utc)


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` suffix, whole seconds unless there is a fraction."""
    v = value.astimezone(timezone.utc)
    text = v.isoformat(timespec="milliseconds" if v.microsecond else "seconds")
    return text.replace("+00:00", "Z")
