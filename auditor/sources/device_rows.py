"""A raw read's clean buckets kept as its answers' rows, one piece per device.

An operator cycle at 10,000 GPUs reads nine exporter names: 90,000 series. Made into one
:class:`~auditor.core.rollup.BucketRun` per series (and sorted as such) they cost more than the
arithmetic; here each exporter name keeps its answer's statistics as flat arrays (one entry per
row and bucket), and each device (pod, GPU) is one :class:`DeviceRows` that finds its row in
every name by index. Its buckets are those the per-series runs would make, in the same order
(metric by metric, bucket by bucket): :func:`~auditor.core.rollup.add_runs` makes both.

Only a device with one label set, no bucket to re-read and one exporter name per metric is kept
so; the others take the general path (runs, re-reads, duplicates merged) in the source.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, PodRef
from auditor.core.rollup import add_runs


@dataclass(slots=True)
class NameRows:
    """One exporter name's clean rows: ``row_of[d]`` is device ``d``'s row (-1: none), the
    aggregates of row ``j``'s bucket ``i`` (in the metric's unit: scaled once, in numpy) are at
    ``j * width + i`` of the flat arrays, and ``idx[j]`` lists row ``j``'s clean bucket positions."""

    metric: Metric
    row_of: list[int]
    counts: Sequence[int]
    sums: Sequence[float]
    mins: Sequence[float]
    maxs: Sequence[float]
    idx: list[Sequence[int]]
    width: int


class ReadBlock:
    """The clean rows of a read, per exporter name in metric order, and the buckets' spans."""

    __slots__ = ("names", "spans")

    def __init__(self, names: list[NameRows], spans: Sequence[tuple[datetime, datetime]]) -> None:
        self.names, self.spans = names, spans


class DeviceRows:
    """One device's buckets of a :class:`ReadBlock` (a :class:`~auditor.core.rollup.Run`)."""

    __slots__ = ("block", "device", "pod", "gpu", "size")

    def __init__(self, block: ReadBlock, device: int, pod: PodRef, gpu: GpuId, size: int) -> None:
        self.block, self.device, self.pod, self.gpu, self.size = block, device, pod, gpu, size

    def __len__(self) -> int:
        return self.size

    def buckets(self) -> list[Bucket]:
        out: list[Bucket] = []
        d = self.device
        runs = (
            (rows.metric, rows.sums, rows.counts, rows.mins, rows.maxs, rows.idx[j], j * rows.width)
            for rows in self.block.names
            if (j := rows.row_of[d]) >= 0
        )
        add_runs(out, self.pod, self.gpu, self.block.spans, runs)
        return out


def name_rows(
    metric: Metric, scale: float, part: Any, ok: Any, rows: Any, devices: Any, n_devices: int, sizes: Any
) -> NameRows | None:
    """The clean rows ``rows`` (of ``part``, one name's ``(4, series, buckets)`` block, whose
    clean buckets are ``ok``) as a :class:`NameRows`; row ``j`` is device ``devices[j]``.
    Adds each device's clean buckets to ``sizes``; None when no row is given."""
    import numpy as np

    if not len(rows):
        return None
    n = part.shape[2]
    row_of = np.full(n_devices, -1, dtype=np.int64)
    row_of[devices[rows]] = rows
    per_row = ok.sum(axis=1)
    sizes[devices[rows]] += per_row[rows]
    whole = range(n)
    idx: list[Sequence[int]] = [whole] * len(ok)
    for j in np.flatnonzero(per_row[rows] < n).tolist():
        r = int(rows[j])
        clean = np.flatnonzero(ok[r]).tolist()
        idx[r] = range(clean[0], clean[-1] + 1) if clean[-1] - clean[0] + 1 == len(clean) else clean
    # (x * scale in numpy is the same IEEE product as in Python; a count is whole where clean).
    # Kept as arrays of machine numbers (8 bytes a value, not a float object's 32: a long
    # window's rows are millions); indexing one gives the same Python float or int
    sums, mins, maxs = (_packed("d", part[k] * scale if scale != 1.0 else part[k]) for k in (1, 2, 3))
    cnts = _packed("q", np.nan_to_num(part[0]).astype(np.int64))
    return NameRows(metric, row_of.tolist(), cnts, sums, mins, maxs, idx, n)


def _packed(code: str, values: Any) -> array:
    """A numpy array's values, flattened, as an ``array(code)`` (copied bytes, exact)."""
    import numpy as np

    out = array(code)
    out.frombytes(np.ascontiguousarray(values).tobytes())
    return out
