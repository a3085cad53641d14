"""Which pods hold GPUs, and how many GPU equivalents (pure functions on pod JSON).

A pod holds GPUs when any container requests ``nvidia.com/gpu`` or a MIG resource
``nvidia.com/mig-<profile>`` (in requests or limits: extended resources need not be listed in
both). Init containers follow the scheduler's rule: the pod needs
``max(sum of app containers + restartable (sidecar) init containers, largest plain init container)``,
so a GPU-using init container that runs before the app counts once, not on top of the app.
A MIG slice counts as its fraction of a GPU (``3g.40gb`` → 3/7, ``1c.3g.40gb`` → 1/7).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
#: compute slices of a full GPU with MIG (A100/H100/H200/B200: 7)
MIG_SLICES = 7
_MIG = re.compile(r"^nvidia\.com/mig-(?:(\d+)c\.)?(\d+)g\.")
TERMINAL_PHASES = ("Succeeded", "Failed")


def _quantity(value: Any) -> float:
    """An extended-resource quantity (whole numbers; ``"2"`` or ``2``); garbage is 0."""
    try:
        return max(0.0, float(str(value).strip()))
    except (TypeError, ValueError):
        return 0.0


def resource_gpus(resources: dict | None) -> float:
    """GPU equivalents one container asks for: limits where given, else requests."""
    if not resources:
        return 0.0
    merged = dict(resources.get("requests") or {})
    merged.update(resources.get("limits") or {})
    total = 0.0
    for name, qty in merged.items():
        if name == GPU_RESOURCE:
            total += _quantity(qty)
        elif name.startswith(MIG_PREFIX):
            m = _MIG.match(name)
            slices = int(m.group(1) or m.group(2)) if m else 1
            total += _quantity(qty) * min(slices, MIG_SLICES) / MIG_SLICES
    return total


def pod_gpus(spec: dict | None) -> float:
    """GPU equivalents a pod holds (0 for a CPU-only pod)."""
    if not spec:
        return 0.0
    app = sum(resource_gpus(c.get("resources")) for c in spec.get("containers") or [])
    sidecars = 0.0
    largest_init = 0.0
    for c in spec.get("initContainers") or []:
        g = resource_gpus(c.get("resources"))
        if c.get("restartPolicy") == "Always":
            sidecars += g
            largest_init = max(largest_init, sidecars)
        else:
            largest_init = max(largest_init, sidecars + g)
    return max(app + sidecars, largest_init)


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 time from the API (``2026-11-30T09:00:00Z``), aware UTC; None stays None."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(timezone.utc)
    except ValueError:
        return None


def pod_started(pod: dict) -> datetime | None:
    """When the pod started running (``status.startTime``); None while it is not scheduled."""
    return parse_time((pod.get("status") or {}).get("startTime"))


def pod_finished(pod: dict) -> datetime | None:
    """When a terminal pod's last container finished (None for a pod that is not terminal)."""
    status = pod.get("status") or {}
    if status.get("phase") not in TERMINAL_PHASES:
        return None
    ends = []
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        t = parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        if t:
            ends.append(t)
    if ends:
        return max(ends)
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            t = parse_time(cond.get("lastTransitionTime"))
            if t:
                return t
    return pod_started(pod) or parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
