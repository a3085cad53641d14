"""Which GPUs several pods used at once (time-slicing, MPS), bucket by bucket: the shares that
divide a GPU's hours among its pods and mark its metrics as device-wide. Pure."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from itertools import groupby
from operator import attrgetter
from typing import Callable, Iterable, Sequence

from auditor.core.model import Bucket, PodRef

_POD_GPU = attrgetter("pod", "gpu")


def gpu_shares(buckets: Iterable[Bucket]) -> dict[tuple[str, datetime], int]:
    """How many distinct pods were seen on each GPU (``GpuId.key``) in each bucket.

    More than one means time-slicing or MPS (or a pod replaced inside the bucket): the GPU's
    time is divided among them and the metrics are device-wide, not the pod's own.
    """
    pods: dict[tuple[str, datetime], set[PodRef]] = defaultdict(set)
    for (pod, gpu), run in groupby(buckets, key=_POD_GPU):
        key = gpu.key
        for b in run:
            if b.count or b.dropped:
                pods[(key, b.start)].add(pod)
    return {k: len(v) for k, v in pods.items()}


def shared_gpus(buckets: Sequence[Bucket]) -> dict[tuple[str, datetime], int]:
    """:func:`gpu_shares` without its entries of 1: only the GPUs and buckets with several pods.

    Every consumer reads shares with a default of 1, so this is the same map for them, and it
    looks at single buckets only on GPUs that more than one pod used at all — on a cluster
    without sharing, one step per (pod, GPU) run instead of a set per bucket.
    """
    return shares_among(
        ((pod, gpu.key) for (pod, gpu), _ in groupby(buckets, key=_POD_GPU)),
        lambda keys: (b for b in buckets if b.gpu.key in keys),
    )


def shares_among(
    pod_gpus: Iterable[tuple[PodRef, str]], buckets_on: Callable[[set[str]], Iterable[Bucket]]
) -> dict[tuple[str, datetime], int]:
    """:func:`shared_gpus` for any form of a read: ``pod_gpus`` lists its (pod, GPU key) pairs,
    ``buckets_on(keys)`` gives its buckets on those GPUs (asked only for GPUs several pods used)."""
    pods_per_gpu: dict[str, set[PodRef]] = defaultdict(set)
    for pod, key in pod_gpus:
        pods_per_gpu[key].add(pod)
    candidates = {k for k, v in pods_per_gpu.items() if len(v) > 1}
    if not candidates:
        return {}
    shares = gpu_shares(buckets_on(candidates))
    return {k: n for k, n in shares.items() if n > 1}
