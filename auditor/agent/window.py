"""Samples kept in memory, and the mean a scraper gets: the 1 s samples since *its* previous scrape.

dcgm-exporter serves DCGM's latest cached value: a point read (GPU_UTIL is a ≤1 s duty cycle, so
a 15 s scrape sees one second in fifteen and periodic workloads alias). The agent instead keeps
every 1 s sample for a while and serves, per series, the mean of the samples taken since the
same scraper's previous scrape. Scrapers are told apart by their address and User-Agent, so two
Prometheus replicas (or a person with curl beside Prometheus) each get complete means. A
scraper's first scrape gets the last ``first_window`` seconds. When no new sample arrived since
its previous scrape (scraping faster than the sampling interval) it gets the latest sample again,
if that sample is fresh (``max_age``); when sampling has stopped, the GPU series disappear rather
than repeat an old value.

A field that a source computes less often than it samples (NVML GPM's GR_ENGINE_ACTIVE, every
10 s by default) is absent from the ticks between its computations. A scrape whose window holds
none of its computations gets the device's last computed value instead, as long as that value is
at most ``hold`` seconds older than the window's newest tick: an exporter serves its last value at
every scrape, so a series never comes and goes between scrapes (Prometheus would write a
staleness marker each time it went missing, and instant queries and ``absent()`` alerts would
flicker). Past ``hold`` (the source stopped computing it) the field is absent again, never stale.

Pure: time is passed in; the agent holds the lock around calls.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Mapping

from auditor.agent.fields import AGGREGATION
from auditor.core.model import PodRef


@dataclass(frozen=True, slots=True)
class Tick:
    """One sampling tick: per device key, its owner at that moment and its field values."""

    t: float
    devices: Mapping[str, tuple[PodRef | None, Mapping[str, float]]]


@dataclass(slots=True)
class Mean:
    """The aggregate of one (device, owner, field) over a window."""

    total: float = 0.0
    n: int = 0
    #: ``mean``; ``or`` / ``last`` for bitmasks and codes, whose mean means nothing (fields.AGGREGATION)
    agg: str = "mean"

    @property
    def value(self) -> float:
        return self.total / self.n if self.agg == "mean" else self.total

    def add(self, v: float) -> None:
        if self.agg == "or":
            self.total = float(int(self.total) | int(v))
        elif self.agg == "last":
            self.total = v
        else:
            self.total += v
        self.n += 1


class SampleWindow:
    """A time-ordered buffer of :class:`Tick` with per-scraper cursors."""

    def __init__(
        self, *, keep: float = 600.0, first_window: float = 15.0, max_scrapers: int = 256, hold: float = 0.0
    ) -> None:
        self.keep = keep
        self.first_window = first_window
        self.max_scrapers = max_scrapers
        self.hold = hold
        self._ticks: deque[Tick] = deque()
        #: device key → field → (tick time, value) of the field's last computed value
        self._last: dict[str, dict[str, tuple[float, float]]] = {}
        #: scraper → (time of the last tick it was given, wall time of its last scrape)
        self._cursors: dict[str, tuple[float, float]] = {}

    def add(self, tick: Tick) -> None:
        self._ticks.append(tick)
        for key, (_, values) in tick.devices.items():
            last = self._last.setdefault(key, {})
            for name, v in values.items():
                last[name] = (tick.t, v)
        horizon = tick.t - self.keep
        while self._ticks and self._ticks[0].t < horizon:
            self._ticks.popleft()

    @property
    def latest(self) -> Tick | None:
        return self._ticks[-1] if self._ticks else None

    def take(
        self, scraper: str, now: float, max_age: float = 5.0
    ) -> tuple[dict[tuple[str, PodRef | None], dict[str, Mean]], int]:
        """Means per (device key, owner) and field over this scraper's window, and the tick count.

        A device that changed owner inside the window yields one entry per owner, each the mean
        of its own samples. A field absent from every tick of the window gets the device's last
        computed value (in its latest owner's entry) when that is at most ``hold`` seconds older
        than the window's newest tick; otherwise it stays absent.
        """
        cursor = self._cursors.get(scraper)
        since = cursor[0] if cursor is not None else now - self.first_window
        ticks = [t for t in self._ticks if t.t > since]
        if not ticks and self._ticks and now - self._ticks[-1].t <= max_age:
            ticks = [self._ticks[-1]]
        if ticks:
            self._remember(scraper, ticks[-1].t, now)
        out: dict[tuple[str, PodRef | None], dict[str, Mean]] = {}
        for tick in ticks:
            for key, (owner, values) in tick.devices.items():
                fields = out.setdefault((key, owner), {})
                for name, v in values.items():
                    m = fields.get(name)
                    if m is None:
                        m = fields[name] = Mean(agg=AGGREGATION.get(name, "mean"))
                    m.add(v)
        if ticks and self.hold > 0:
            self._hold_last(ticks[-1], out)
        return out, len(ticks)

    def _hold_last(self, newest: Tick, out: dict[tuple[str, PodRef | None], dict[str, Mean]]) -> None:
        """Fill fields absent from the window with their last computed value, if recent enough."""
        horizon = newest.t - self.hold
        for key, (owner, _) in newest.devices.items():
            fields = out.setdefault((key, owner), {})
            for name, (t, v) in self._last.get(key, {}).items():
                if name not in fields and t >= horizon:
                    fields[name] = Mean(v, 1)

    def _remember(self, scraper: str, t: float, now: float) -> None:
        self._cursors[scraper] = (t, now)
        if len(self._cursors) > self.max_scrapers:
            # forget scrapers silent for longer than the buffer, else the oldest
            stale = [k for k, (_, seen) in self._cursors.items() if now - seen > self.keep]
            for k in stale or [min(self._cursors, key=lambda k: self._cursors[k][1])]:
                del self._cursors[k]
