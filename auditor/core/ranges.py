"""The unit and valid range of a number a user writes (a threshold, a policy condition's value).

A ratio metric compared with ``90`` can never match (the summary holds 0.9, not 90 %), and a
clock compared in Hz never matches a value in MHz: such numbers are accepted by the type checks
and then silently do nothing. Each one is refused here, with a hint where the slip is plain to
see (a percent for a ratio, Hz for MHz). Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """A unit (for the message) and the closed interval ``[low, high]`` of valid values."""

    unit: str
    low: float = 0.0
    high: float | None = None
    integer: bool = False

    def describe(self) -> str:
        if self.high is None:
            return f"≥ {self.low:g} {self.unit}"
        return f"{self.low:g}–{self.high:g} {self.unit}"

    def problem(self, value: float) -> str | None:
        """None when ``value`` is valid; else why not (with a "did you mean" where one fits)."""
        if not math.isfinite(value):
            return f"{value} is not a finite number"
        if self.integer and value != int(value):
            return f"{value:g} is not a whole number of {self.unit}"
        if value >= self.low and (self.high is None or value <= self.high):
            return None
        msg = f"{value:g} is out of range ({self.describe()})"
        hint = self._hint(value)
        return f"{msg}; {hint}" if hint else msg

    def _hint(self, value: float) -> str | None:
        if self.unit == "ratio" and self.high == 1.0 and 1.0 < value <= 100.0:
            return f"ratios are 0–1: did you mean {value / 100:g}?"
        if self.unit == "MHz" and self.high is not None and max(self.low, 1.0) <= value / 1e6 <= self.high:
            return f"clocks are in MHz: did you mean {value / 1e6:g}?"
        return None


#: activities, coverage, MFU: the project's unit for every DCGM activity (docs/verdicts.md)
RATIO = Range("ratio", 0.0, 1.0)
