"""One source per GPU: when the agent and dcgm-exporter both export a GPU, the audit keeps one.

Both publish the same names with the same device labels (``UUID``, ``GPU_I_ID``), so a GPU that
both export would be counted twice: twice the samples, and means mixing a point read with a true
interval mean. The agent's series carry ``source="gpu-auditor-agent"``; dcgm-exporter's carry no
``source`` label. :func:`prefer_one_source` keeps, for every (GPU or MIG instance, metric), the
series of the best-ranked source that has one, and drops the others:

- the agent first: its values are means of 1 s samples (dcgm-exporter serves one cached reading
  per scrape), and it is installed precisely where dcgm-exporter lacks fields;
- dcgm-exporter for the metrics the agent does not serve (an agent on plain NVML has no
  profiling series; dcgm-exporter's then still count).

Pure: it only looks at label sets (so it lives in the core: the Prometheus source applies it to
what it reads, the agent only sets the label). Series that name no device are kept as they are
(the caller reports them).

In PromQL, the same preference per evaluation step (per bucket, finer than per window) is
``AGG_over_time(X{source="gpu-auditor-agent"}[r]) or on(UUID, GPU_I_ID) AGG_over_time(X{source!="gpu-auditor-agent"}[r])``
(``or`` keeps the right side only where no left series has the same ``UUID``/``GPU_I_ID``); see
:func:`promql_prefer_agent`.
"""

from __future__ import annotations

from typing import Callable, Hashable, Mapping, Sequence, TypeVar

T = TypeVar("T")

#: the label, and its value, on every series the gpu-auditor node agent serves (auditor/agent/server.py)
SOURCE_LABEL = "source"
SOURCE_VALUE = "gpu-auditor-agent"

AGENT = SOURCE_VALUE
EXPORTER = "dcgm-exporter"
#: best first
DEFAULT_ORDER: tuple[str, ...] = (AGENT, EXPORTER)


def source_of(labels: Mapping[str, str]) -> str:
    """``gpu-auditor-agent`` for the agent's series, else the ``source`` label's value, else ``dcgm-exporter``."""
    return labels.get(SOURCE_LABEL) or EXPORTER


def device_of(labels: Mapping[str, str]) -> str | None:
    """The device a series describes: parent UUID (either spelling) plus MIG ``GPU_I_ID``.

    Without a UUID, host and index still name a device; with neither, ``None``.
    """
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        host = labels.get("Hostname") or labels.get("hostname") or labels.get("instance")
        index = labels.get("gpu") or labels.get("device")
        if not host or not index:
            return None
        uuid = f"{host}:{index}"
    gi = labels.get("GPU_I_ID", "")
    return f"{uuid}/{gi}" if gi else uuid


def prefer_one_source(
    items: Sequence[T],
    *,
    labels: Callable[[T], Mapping[str, str]],
    metric: Callable[[T], Hashable] | None = None,
    order: Sequence[str] = DEFAULT_ORDER,
) -> tuple[list[T], list[T]]:
    """``(kept, dropped)``: per (device, metric), only the series of the best-ranked source present.

    ``labels`` gives an item's label set, ``metric`` its metric (items of different exporter
    names for the same metric — the 4.6 ``*_RATIO`` spellings — compete too when ``metric``
    maps them to the same value; default: the ``__name__`` label). Sources not in ``order`` rank
    after those in it, by name. Order among kept items is preserved.
    """
    rank = {s: i for i, s in enumerate(order)}
    # The label sets of one device are often one shared dict (a GPU's exporter names carry the
    # same labels): its device and source are worked out once per dict, not once per series.
    # (the dict is kept in the memo so that its id cannot be reused by another during the call)
    seen: dict[int, tuple[Mapping[str, str], str | None, tuple[int, str]]] = {}
    keys: list[tuple[str, Hashable] | None] = []
    ranks: list[tuple[int, str]] = []
    best: dict[tuple[str, Hashable], tuple[int, str]] = {}
    for item in items:
        lab = labels(item)
        got = seen.get(id(lab))
        if got is None:
            src = source_of(lab)
            got = seen[id(lab)] = (lab, device_of(lab), (rank.get(src, len(rank)), src))
        _, dev, r = got
        ranks.append(r)
        if dev is None:
            keys.append(None)
            continue
        k = (dev, metric(item) if metric is not None else lab.get("__name__", ""))
        keys.append(k)
        old = best.get(k)
        if old is None or r < old:
            best[k] = r
    kept: list[T] = []
    dropped: list[T] = []
    for item, key, r in zip(items, keys, ranks):
        if key is None or r == best[key]:
            kept.append(item)
        else:
            dropped.append(item)
    return kept, dropped


def promql_prefer_agent(
    agent_selector: str, other_selector: str, agg: str, range_ms: int, on: Sequence[str] = ("UUID", "GPU_I_ID")
) -> str:
    """One bucket query that prefers the agent's series per GPU at every step.

    ``agent_selector``/``other_selector`` are the same selector with ``source="gpu-auditor-agent"``
    and ``source!="gpu-auditor-agent"`` added. Works where both sources spell the UUID label the
    same way (dcgm-exporter's ``--use-old-namespace`` spells it ``uuid``: then match per window
    with :func:`prefer_one_source` instead).
    """
    return (
        f"{agg}_over_time({agent_selector}[{range_ms}ms]) or on({', '.join(on)}) "
        f"{agg}_over_time({other_selector}[{range_ms}ms])"
    )
