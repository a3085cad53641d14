"""Times and durations as users type them on the command line.

``--start``/``--end`` take RFC 3339 (``2026-11-30T09:00:00Z``, ``2026-11-30T10:00:00+01:00``) or
a time relative to now (``now``, ``now-6h``, ``now-1h30m``, ``now+5m``). Durations are
``<number><unit>`` terms (``90s``, ``5m``, ``1h30m``, ``7d``, ``2w``). Pure: ``now`` is passed in,
so the same text always gives the same answer in tests; errors are :class:`BadInput` naming the
flag, so the CLI exits 2 with a message the user can act on.

A range read from a metrics source is bounded (:func:`check_range`): the source keeps one value
per bucket for every series it reads, so an unbounded range (a start in year 0001, ten years
over three pods) would cost memory for time that holds no data.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from auditor.errors import BadInput

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TERM = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_RELATIVE = re.compile(r"^now(?:\s*([+-])\s*(.+))?$")
#: no metrics source holds samples before the Unix epoch (Prometheus timestamps are ms since it)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: buckets per series a read may span, whatever the settings (31 d at 30 s, 347 d at 5 m)
MAX_BUCKETS = 100_000


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
    try:
        value = timedelta(seconds=seconds)
    except OverflowError:
        raise BadInput(f"{what}: duration {text!r} is too long") from None
    if value <= timedelta(0):
        raise BadInput(f"{what}: duration {text!r} must be positive")
    return value


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
        try:
            value = now + delta if m.group(1) == "+" else now - delta
        except OverflowError:
            raise BadInput(f"{what}: {text!r} is out of the range of dates") from None
        return _after_epoch(value.astimezone(timezone.utc), text, what)
    try:
        value = datetime.fromisoformat(s)
    except ValueError:
        raise BadInput(
            f"{what}: cannot read time {text!r}; use RFC 3339 (2026-11-30T09:00:00Z) or now, now-6h"
        ) from None
    if value.tzinfo is None:
        raise BadInput(f"{what}: time {text!r} has no UTC offset; add Z or e.g. +01:00 (RFC 3339)")
    try:
        value = value.astimezone(timezone.utc)
    except OverflowError:
        raise BadInput(f"{what}: {text!r} is out of the range of dates") from None
    return _after_epoch(value, text, what)


def _after_epoch(value: datetime, text: str, what: str) -> datetime:
    if value < EPOCH:
        raise BadInput(f"{what}: {text!r} is before 1970-01-01T00:00:00Z; no metrics are older")
    return value


def check_range(
    start: datetime,
    end: datetime,
    *,
    max_range: timedelta,
    width: timedelta,
    what: str | None = None,
    setting: str = "max_audit_range",
) -> None:
    """Refuse a read of ``start..end`` longer than ``max_range`` or of more than
    :data:`MAX_BUCKETS` buckets of ``width``, in one line that says what to do instead.

    ``what`` names the range as the user gave it (default: the ``--start``/``--end`` pair);
    ``setting`` names the setting that raises ``max_range``.
    """
    span = end - start
    what = what or f"--start {format_time(start)} to --end {format_time(end)}"
    if span > max_range:
        raise BadInput(
            f"{what} is {format_duration(span)}, longer than "
            f"{setting} ({format_duration(max_range)}): audit it in pieces, or raise {setting} in the settings file "
            f"(GPU_AUDITOR_{setting.upper()})"
        )
    if span / width > MAX_BUCKETS:
        raise BadInput(
            f"{what} in {format_duration(width)} buckets is "
            f"{span // width:,} buckets, more than {MAX_BUCKETS:,}: use a wider --bucket or a shorter range"
        )


def format_duration(value: timedelta) -> str:
    """``3650d``, ``6h``, ``1h30m``, ``90s``: the largest units, as :func:`parse_duration` reads."""
    seconds = int(value.total_seconds())
    if seconds <= 0:
        return f"{value.total_seconds():g}s"
    out = []
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= n:
            out.append(f"{seconds // n}{unit}")
            seconds %= n
    return "".join(out)


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` suffix, whole seconds unless there is a fraction."""
    v = value.astimezone(timezone.utc)
    text = v.isoformat(timespec="milliseconds" if v.microsecond else "seconds")
    return text.replace("+00:00", "Z")
