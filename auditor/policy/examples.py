"""Policy example suites (``policies/<name>/suite.yaml``): summaries that must and must not fire.

A suite entry gives a summary and, for sustained conditions, constant per-metric means held for
``minutes`` up to ``now`` in 5-minute buckets on one GPU; for a ``lineage`` condition,
``lineage_best`` is the best MFU of the lineage's earlier runs (absent: none). Used by the tests of the shipped
policies and available to users for their own (``policy validate`` runs suites it finds).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from auditor.core.job_summary import JobSummary
from auditor.core.metrics import Metric
from auditor.core.model import Bucket, GpuId, PodRef
from auditor.policy.evaluate import evaluate
from auditor.policy.schema import Policy

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
_WIDTH = timedelta(minutes=5)
_METRIC = {"power_w": Metric.POWER}


def example_buckets(spec: dict[str, Any], now: datetime = NOW) -> list[Bucket]:
    """Buckets holding each ``spec`` metric constant for ``spec['minutes']`` before ``now``."""
    minutes = int(spec.get("minutes", 60))
    pod = PodRef("examples", "example-0")
    gpu = GpuId("GPU-example", index="0", model="NVIDIA H200")
    out = []
    n = minutes // 5
    for i in range(n):
        start = now - _WIDTH * (n - i)
        for name, value in spec.items():
            if name == "minutes" or value is None:
                continue
            m = _METRIC.get(name) or Metric(name)
            out.append(Bucket(pod, gpu, m, start, start + _WIDTH, float(value) * 20, 20, float(value), float(value)))
    return out


def run_suite(policy: Policy, suite_file: Path) -> list[str]:
    """Failures of the suite (empty when every example behaves)."""
    data = yaml.safe_load(suite_file.read_text()) or {}
    failures = []
    for expect, key in ((True, "fire"), (False, "quiet")):
        for ex in data.get(key) or []:
            summary = JobSummary.example(**ex["summary"])
            buckets = example_buckets(ex["sustained"]) if "sustained" in ex else []
            ev = evaluate(policy, summary, now=NOW, buckets=buckets, lineage_best=ex.get("lineage_best"))
            if ev.fires != expect:
                failures.append(f"{suite_file}: {key} example {ex.get('name')!r}: fires={ev.fires} ({ev.reason})")
    return failures
