"""Text from the cluster made safe to print and to open in a spreadsheet.

Pod names, labels, team and namespace values come from people who can create objects in the
cluster. Printed as they are, an ANSI escape repaints the terminal and a newline in a pod name
forges a row of the verdict table; written to a CSV as they are, ``=HYPERLINK(...)`` runs as a
formula when an admin opens the report. Every terminal output passes such values through
:func:`terminal_safe` and every CSV cell through :func:`csv_safe`; JSON and YAML output keep
the values exactly (their encoders escape), so nothing is lost for a program reading them.
"""

from __future__ import annotations

import csv
import unicodedata
from typing import Iterable, TextIO

#: the visible stand-ins for the control characters people recognise; every other control or
#: format character (ESC, DEL, C1, bidi overrides, zero-width marks) becomes U+FFFD
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
REPLACEMENT = "\ufffd"
ELLIPSIS = "…"

#: a spreadsheet takes a cell starting with one of these as a formula (OWASP's list)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _unsafe(ch: str) -> bool:
    """Control (Cc), format (Cf: bidi overrides, zero-width), line/paragraph separators."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def terminal_safe(s: str, width: int | None = None) -> str:
    """``s`` with every control character made visible and harmless, at most ``width`` characters.

    ``\\n``, ``\\r`` and ``\\t`` print as those two-character escapes (a reader sees where the
    value had one); every other control or format character (ESC of an ANSI sequence, DEL, C1,
    bidi overrides) becomes U+FFFD, so the rest of an escape sequence prints as inert text.
    ``width`` (for a table cell) cuts a longer result to ``width - 1`` characters and an
    ellipsis; ``None`` keeps the whole value. Never use it for JSON: that keeps the value.
    """
    if not s.isprintable():
        s = "".join(_NAMED.get(c, REPLACEMENT) if _unsafe(c) else c for c in s)
    if width is not None and len(s) > width:
        return s[: max(width - 1, 0)] + ELLIPSIS if width > 0 else ""
    return s


def csv_safe(value: object) -> object:
    """A CSV cell that a spreadsheet shows as text, never runs as a formula.

    A string starting with ``= + - @``, a tab or a carriage return gets a leading ``'`` (the
    spreadsheet convention for "this is text"), the defence OWASP recommends for CSV injection.
    Numbers pass unchanged, so a negative figure stays a number; so does a string that is a
    plain number (``-3.5``), which no spreadsheet runs.
    """
    if not isinstance(value, str) or not value.startswith(_FORMULA_STARTS):
        return value
    if _is_number(value):
        return value
    return "'" + value


def csv_row(values: Iterable[object]) -> list[object]:
    """:func:`csv_safe` on every cell of a row."""
    return [csv_safe(v) for v in values]


class CsvWriter:
    """The one CSV writer of the product: rows through :func:`csv_row`, ``\\n`` line ends.

    The standard writer quotes a cell holding the line terminator but not a lone carriage
    return, which every reader takes as the end of a row: a ``\\r`` inside a label would
    forge a row. A row with one is written with every cell quoted (still the same values).
    """

    def __init__(self, out: TextIO) -> None:
        self._minimal = csv.writer(out, lineterminator="\n")
        self._quoted = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)

    def writerow(self, values: Iterable[object]) -> None:
        row = csv_row(values)
        carriage = any(isinstance(v, str) and "\r" in v for v in row)
        (self._quoted if carriage else self._minimal).writerow(row)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip() == text and text.lower().lstrip("+-") not in ("nan", "inf", "infinity")
