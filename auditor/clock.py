"""The real clock: the one adapter that reads the wall clock and the monotonic clock.

Everything outside the core that needs "now", an elapsed time or an interruptible wait takes a
:class:`~auditor.ports.Clock` (this one unless told otherwise), so a test can put a cycle at any
time or run a Lease's whole term in milliseconds with a fake clock of its own.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Callable


class SystemClock:
    """:class:`~auditor.ports.Clock` over ``datetime.now(UTC)``, ``time.monotonic`` and ``Event.wait``."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))


#: the process's clock (stateless: one is enough)
SYSTEM_CLOCK = SystemClock()


class NowOnly(SystemClock):
    """A clock whose "now" is a given function (a test's fixed instant), the rest the system's."""

    def __init__(self, now: Callable[[], datetime]) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now()
