"""Pure helpers for the Prometheus source: PromQL text, bucket timing, label conventions.

Nothing here does I/O, so the query shapes and the label rules are testable as tables.

**Bucket boundaries.** Buckets are half-open ``[start, end)`` on ``width``-aligned boundaries.
A range selector ``x[r]`` evaluated at ``t`` selects samples with ``t - r <= ts <= t`` in
Prometheus 2.x (closed at both ends) and ``t - r < ts <= t`` from 3.0 on (left-open). Evaluating
at ``end - 1ms`` (timestamps are whole milliseconds) with ``r = width - 1ms`` on 2.x, or
``r = width`` on 3.x, selects exactly ``start <= ts < end`` on either: a sample that lands on a
boundary belongs to the bucket it starts, never to both. :func:`range_ms` picks ``r`` from the
server's major version.

**A few queries per exporter name, never per job.** Each name gets four ``query_range`` calls
at ``step = width``: ``sum_over_time``, ``count_over_time``, ``min_over_time`` and
``max_over_time`` of every series at once. (Folding the four into one expression with
``label_replace(...) or ...`` saves three HTTP requests but costs Prometheus about three times the
evaluation time, measured on 2.42, so they stay separate.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from auditor.core.identity import check_pod
from auditor.core.model import GpuId, PodRef

AGGREGATES = ("sum", "count", "min", "max")

#: Prometheus's limit on points per series in one query_range answer
MAX_POINTS_PER_SERIES = 11_000

#: label conventions for the workload's pod, namespace and container, in detection priority:
#: ``exported_*`` (scraped with honorLabels false: ``pod`` then names the exporter itself),
#: ``*_name`` (dcgm-exporter ``--use-old-namespace``), plain (honorLabels true)
POD_CONVENTIONS: tuple[tuple[str, str, str], ...] = (
    ("exported_pod", "exported_namespace", "exported_container"),
    ("pod_name", "pod_namespace", "container_name"),
    ("pod", "namespace", "container"),
)

_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$])")
_EXPORTER_POD = re.compile(r"(^|-)dcgm-exporter(-|$)")


def quote(value: str) -> str:
    """A PromQL double-quoted string literal for ``value``."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def regex_alternation(values: Iterable[str]) -> str:
    """An RE2 alternation matching exactly the given literal values (fully anchored by PromQL)."""
    return "|".join(_REGEX_META.sub(r"\\\1", v) for v in sorted(set(values)))


def selector(name: str, matchers: Mapping[str, str] | None = None, regex: Mapping[str, str] | None = None) -> str:
    """``name{a="x",b=~"y|z"}`` with properly quoted values."""
    parts = [f"{k}={quote(v)}" for k, v in sorted((matchers or {}).items())]
    parts += [f"{k}=~{quote(v)}" for k, v in sorted((regex or {}).items())]
    return f"{name}{{{','.join(parts)}}}" if parts else name


def range_ms(width_ms: int, major_version: int) -> int:
    """The range-selector length that makes ``[x]`` at ``end - 1ms`` cover ``[start, end)``."""
    return width_ms if major_version >= 3 else width_ms - 1


def bucket_query(sel: str, agg: str, rng_ms: int) -> str:
    """``<agg>_over_time(sel[rng])``: one per-bucket aggregate of every series of a selector."""
    if agg not in AGGREGATES:
        raise ValueError(f"unknown aggregate {agg!r}")
    return f"{agg}_over_time({sel}[{rng_ms}ms])"


def chunks(
    first_end_ms: int, last_end_ms: int, width_ms: int, max_steps: int = MAX_POINTS_PER_SERIES - 1
) -> list[tuple[int, int]]:
    """Split bucket end times ``first_end..last_end`` (step ``width``) into runs of ``max_steps``.

    Returns ``(first_end, last_end)`` pairs, both inclusive, each run short enough that a
    ``query_range`` stays under the points-per-series limit.
    """
    out: list[tuple[int, int]] = []
    t = first_end_ms
    span = max(1, max_steps) * width_ms
    while t <= last_end_ms:
        stop = min(last_end_ms, t + span - width_ms)
        out.append((t, stop))
        t = stop + width_ms
    return out


def halve(first_end_ms: int, last_end_ms: int, width_ms: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Bucket ends ``first_end..last_end`` (at least two) as two runs, for a query the engine
    refused for its size."""
    mid = first_end_ms + ((last_end_ms - first_end_ms) // width_ms // 2) * width_ms
    return (first_end_ms, mid), (mid + width_ms, last_end_ms)


def format_ts(ms: int) -> str:
    """A Prometheus API timestamp (seconds with millisecond precision) for ``ms``."""
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    return f"{sign}{ms // 1000}.{ms % 1000:03d}"


def parse_ts_ms(value: float | str) -> int:
    """Milliseconds from an API timestamp (JSON numbers like ``1767225899.999``)."""
    return int(round(float(value) * 1000))


@dataclass(frozen=True, slots=True)
class LabelConvention:
    """Which label names carry the workload pod and the GPU identity in this Prometheus."""

    pod: str = "pod"
    namespace: str = "namespace"
    container: str = "container"

    def describe(self) -> dict[str, str]:
        return {"pod": self.pod, "namespace": self.namespace, "container": self.container}


def detect_convention(label_sets: Iterable[Mapping[str, str]]) -> LabelConvention:
    """The pod-label convention of a set of DCGM series.

    If any series carries ``exported_pod`` the scrape used honorLabels false, so ``pod`` is
    the exporter's own pod on *every* series and must never be read as a workload (a GPU
    without a workload then has no ``exported_pod`` at all). Likewise for ``pod_name``.
    """
    seen: set[str] = set()
    for labels in label_sets:
        for conv in POD_CONVENTIONS[:2]:
            if labels.get(conv[0]):
                seen.add(conv[0])
    for conv in POD_CONVENTIONS:
        if conv[0] in seen:
            return LabelConvention(*conv)
    return LabelConvention(*POD_CONVENTIONS[-1])


def first_label(labels: Mapping[str, str], *names: str) -> tuple[str, str]:
    """``(name, value)`` of the first of ``names`` present with a non-empty value, else ``("", "")``."""
    for n in names:
        v = labels.get(n)
        if v and isinstance(v, str):  # (a proxy's JSON may hold a number: no name of a device)
            return n, v
    return "", ""


def gpu_of(labels: Mapping[str, str]) -> GpuId | None:
    """The GPU (or MIG instance) a series describes; ``None`` when it names no device.

    ``UUID`` (``uuid`` with ``--use-old-namespace``) names the parent GPU, also on MIG series;
    ``GPU_I_ID`` the MIG instance. Without a UUID the host and index still name a device.
    """
    _, uuid = first_label(labels, "UUID", "uuid")
    _, host = first_label(labels, "Hostname", "hostname")
    _, index = first_label(labels, "gpu")
    if not index:
        _, device = first_label(labels, "device")
        index = device[len("nvidia") :] if device.startswith("nvidia") else device
    if not uuid:
        _, instance = first_label(labels, "instance")
        if not (host or instance) or not index:
            return None
        uuid = f"{host or instance}:{index}"
    _, model = first_label(labels, "modelName", "model_name")
    return GpuId(
        uuid=uuid,
        instance=first_label(labels, "GPU_I_ID")[1],
        hostname=host,
        index=index,
        model=model,
        mig_profile=first_label(labels, "GPU_I_PROFILE")[1],
    )


def pod_of(labels: Mapping[str, str], conv: LabelConvention) -> PodRef | None:
    """The workload pod of a series under ``conv``; ``None`` for a GPU no pod holds.

    The one place metric labels become a :class:`PodRef`: a pod, namespace or container no
    Kubernetes object could have (``pod="job-1/../x"``) raises
    :class:`~auditor.core.identity.InvalidIdentity`, and the source quarantines that series
    instead of letting the name reach a job key."""
    pod = labels.get(conv.pod, "")
    ns = labels.get(conv.namespace, "")
    if not pod or not ns:
        return None
    ns, pod, container = check_pod(ns, pod, labels.get(conv.container) or "")
    return PodRef(namespace=ns, pod=pod, container=container)


def looks_like_exporter(labels: Mapping[str, str], conv: LabelConvention) -> bool:
    """True when the "workload" pod is really dcgm-exporter itself (honorLabels false, no workload).

    With honorLabels false and no GPU in use, no series has ``exported_pod``, so detection
    falls back to ``pod`` — which then names the exporter. Its name and container give it away.
    """
    if conv.pod != "pod":
        return False
    pod, container = first_label(labels, "pod")[1], first_label(labels, "container")[1]
    return bool(_EXPORTER_POD.search(pod) or _EXPORTER_POD.search(container))
