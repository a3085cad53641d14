"""The checks the store applies to values before they reach the database.

Each refuses a value with :class:`Invalid`; inside :meth:`Store.reading`/:meth:`Store.writing`
(or :meth:`Store.checking`) that becomes a :class:`~auditor.errors.StoreError` naming the URL
and the operation, so SQLite and PostgreSQL refuse the same values with the same message.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import orjson


class Invalid(ValueError):
    """A value the store refuses; the store turns it into StoreError with the URL and operation."""


def aware(value: datetime, label: str) -> datetime:
    """``value`` when it is a timezone-aware datetime (a naive one would be guessed into a zone)."""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise Invalid(f"{label} must be a timezone-aware datetime, got {value!r}")
    return value


def plain_json(value: Any, label: str, default: Any = None) -> Any:
    """A deep copy through JSON: what the database will hold, refused early if it is not JSON
    (NaN is refused too: PostgreSQL's jsonb rejects it, and SQLite would silently differ).

    orjson first (an operator cycle copies a summary per job, and the standard library's float
    formatting cost ~1 ms each): its copy is taken only when it equals ``value``, which is what
    the standard library's copy would be; otherwise (NaN and infinities, which orjson writes as
    null, tuples, non-string keys, other types) the standard library decides as before.
    """
    if default is None:
        try:
            out = orjson.loads(orjson.dumps(value))
        except (TypeError, ValueError):
            pass
        else:
            if out == value:
                return out
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=default))
    except (TypeError, ValueError) as exc:
        raise Invalid(f"{label} is not plain JSON: {exc}") from None


def plain_json_text(value: Any, label: str) -> tuple[Any, str]:
    """:func:`plain_json` of ``value`` and the JSON text the database gets of it, serialized
    once where orjson's copy is taken (the common case); otherwise the copy's text by orjson,
    or by the standard library for what orjson does not write (integers beyond 64 bits)."""
    try:
        raw = orjson.dumps(value)
        out = orjson.loads(raw)
    except (TypeError, ValueError):
        pass
    else:
        if out == value:
            return out, raw.decode()
    out = plain_json(value, label)
    try:
        return out, orjson.dumps(out).decode()
    except TypeError:
        return out, json.dumps(out)


def parse_time(value: Any, label: str) -> datetime | None:
    """An RFC 3339 time (or an aware datetime) of a document field; None stays None."""
    if value is None:
        return None
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
        except ValueError:
            raise Invalid(f"{label} {value!r} is not an RFC 3339 time") from None
    else:
        raise Invalid(f"{label} {value!r} is not an RFC 3339 time")
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise Invalid(f"{label} {value!r} has no time zone")
    return dt


def number(value: Any, label: str) -> float | None:
    """A finite number of a document field (booleans are not numbers); None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Invalid(f"{label} {value!r} is not a finite number")
    return float(value)
