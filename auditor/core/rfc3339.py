"""RFC 3339 times: the one formatter and the one parser of the audit JSON's, Kueue's and the
annotations' timestamps.

A time without an offset is refused rather than guessed (RFC 3339 requires one; an assumed
zone shifts a window by hours). Results are aware UTC datetimes.
"""

from __future__ import annotations

from datetime import datetime, timezone


def format_rfc3339(t: datetime) -> str:
    """RFC 3339 UTC with ``Z``, whole seconds unless there is a fraction (milliseconds)."""
    v = t.astimezone(timezone.utc)
    return v.isoformat(timespec="milliseconds" if v.microsecond else "seconds").replace("+00:00", "Z")


def parse_rfc3339(text: object) -> datetime:
    """The inverse of :func:`format_rfc3339` (any offset is accepted, the result is UTC).

    ValueError saying what is wrong with ``text``; callers prefix where it came from and raise
    their own error type (a stored document's, a Workload's)."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"expected an RFC 3339 time, got {text!r}")
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 time") from None
    if t.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return t.astimezone(timezone.utc)


def read_rfc3339(text: object) -> datetime | None:
    """:func:`parse_rfc3339` of text a person wrote (an annotation), surrounding blanks allowed;
    None when unreadable — the caller treats it as absent, never guesses."""
    try:
        return parse_rfc3339(text.strip() if isinstance(text, str) else text)
    except ValueError:
        return None
