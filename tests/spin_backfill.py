"""One pod spinning one SM of an H200 (the recorded ``one_sm_spin`` trace), backfilled into the
test bed's Prometheus under a ``case`` label of its own: a job whose verdict is
``low_sm_efficiency``, for tests that need one in a real Prometheus."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

from auditor import traces
from auditor.core.model import PodRef


def backfill_spin(
    prometheus, case: str, *, end: datetime, pod: PodRef, minutes: int = 30, interval: timedelta = timedelta(seconds=15)
) -> timedelta:
    """Backfill ``pod`` spinning until ``end`` (whole trace cycles, at least ``minutes``); returns its duration."""
    trace = traces.load_trace("h200-microbench")
    cycle = len(trace.steady("one_sm_spin")) * interval
    duration = cycle * math.ceil(timedelta(minutes=minutes) / cycle)
    tj = traces.TraceJob(pod, traces.make_gpus(1, f"{case}-node"), "one_sm_spin", duration=duration)
    text = traces.trace_to_openmetrics(trace, [tj], end=end, duration=duration, interval=interval)
    prometheus.backfill(re.sub(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{", rf'\1{{case="{case}",', text, flags=re.M))
    return duration
