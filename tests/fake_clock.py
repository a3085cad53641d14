"""A fake :class:`~auditor.ports.Clock` for tests: time moves only when told, or when code waits.

``wait`` advances the clock by the time asked instead of sleeping (unless the event is set), so
a loop that retries every 2 s for 15 s runs its 8 tries at once, and its deadlines still hold.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Callable

#: a fixed start: no test depends on the day or the hour it runs
START = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


class FakeClock:
    def __init__(self, start: datetime = START) -> None:
        self._start = start
        self._elapsed = 0.0
        self._lock = threading.Lock()
        #: the seconds each ``wait`` asked for, in order
        self.waits: list[float] = []
        #: called with the seconds of each wait, after the clock moved: what others did meanwhile
        self.meanwhile: Callable[[float], object] | None = None

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        return self._elapsed

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._elapsed += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        self.waits.append(seconds)
        self.advance(max(0.0, seconds))
        if self.meanwhile is not None:
            self.meanwhile(seconds)
        return event.is_set()
