"""A sampler that replays recorded samples: the GPU layer for CI and demos, where no GPU exists.

The shared traces (``h200-microbench.csv``, ``h200-demo-cluster.csv``) were recorded at 1 Hz on
a real H200 with NVML and GPM, so replaying one row per tick gives the agent exactly the input it
would have read on that GPU. Each device plays its own list of rows (looping), and a test can
switch a device to another workload (:meth:`RecordedSampler.play`) while the agent runs.
"""

from __future__ import annotations

import threading
from typing import Iterable, Mapping, Sequence

from auditor.agent.fields import BY_NAME
from auditor.agent.nvml import SLOW_GPM
from auditor.agent.sampler import Device, Sample


def trace_rows(trace: object, phase: str) -> list[dict[str, float]]:
    """The steady-state rows of one phase of a :class:`auditor.traces.Trace`, as agent samples.

    Trace values are already in the exporter's units (GPU_UTIL percent, profiling ratios); each
    metric is keyed by its classic dcgm-exporter name. Metrics the agent does not export are
    dropped; absent cells stay absent.
    """
    from auditor.core.metrics import SPECS

    rows = []
    for r in trace.steady(phase):  # type: ignore[attr-defined]
        row = {}
        for metric, v in r.values.items():
            name = SPECS[metric].names[0]
            if name in BY_NAME:
                row[name] = float(v)
        rows.append(row)
    return rows


class RecordedSampler:
    """:class:`~auditor.agent.sampler.GpuSampler` replaying rows per device (``name = "recorded"``).

    ``rows`` maps a device key to the samples it plays in order, looping; a device without rows
    (or with an empty list) yields an empty sample: every series of it absent.

    ``computed_every`` replays NVML GPM's pacing of its costly fields (``slow``, by default
    GR_ENGINE_ACTIVE; ``--gr-engine-interval``): they appear only on every ``computed_every``-th
    tick, as the mean of the rows since their previous appearance, and are absent in between,
    exactly as :class:`~auditor.agent.nvml.NvmlSampler` yields them.
    """

    name = "recorded"

    def __init__(
        self,
        devices: Sequence[Device],
        rows: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
        *,
        computed_every: int = 1,
        slow: frozenset[str] = SLOW_GPM,
    ) -> None:
        self._devices = list(devices)
        self._lock = threading.Lock()
        self._rows: dict[str, list[dict[str, float]]] = {}
        self._pos: dict[str, int] = {}
        self.samples = 0
        self.computed_every = computed_every
        self._slow = slow
        #: device key → slow field → values since its last appearance
        self._pending: dict[str, dict[str, list[float]]] = {}
        for key, r in (rows or {}).items():
            self.play(key, r)

    def play(self, key: str, rows: Iterable[Mapping[str, float]]) -> None:
        """Make device ``key`` replay ``rows`` from their start."""
        with self._lock:
            self._rows[key] = [dict(r) for r in rows]
            self._pos[key] = 0

    def devices(self) -> list[Device]:
        return list(self._devices)

    def sample(self) -> Sample:
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            self.samples += 1
            for d in self._devices:
                rows = self._rows.get(d.key) or []
                if not rows:
                    out[d.key] = {}
                    continue
                i = self._pos[d.key]
                out[d.key] = self._paced(d.key, dict(rows[i % len(rows)]))
                self._pos[d.key] = i + 1
        return out

    def _paced(self, key: str, values: dict[str, float]) -> dict[str, float]:
        """Hold back the slow fields except on every ``computed_every``-th tick (then their mean)."""
        if self.computed_every == 1:
            return values
        pending = self._pending.setdefault(key, {})
        due = self.samples % self.computed_every == 0
        for name in self._slow & values.keys():
            seen = pending.setdefault(name, [])
            seen.append(values.pop(name))
            if due:
                values[name] = sum(seen) / len(seen)
                seen.clear()
        return values

    def close(self) -> None:
        pass
