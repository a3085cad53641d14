"""``classify(..., explain=False)`` (the per-GPU verdicts of a summary) gives the verdict that
the full classification gives, for evidence across every branch of the verdict table."""

import random

from auditor.core.metrics import Metric
from auditor.core.thresholds import Thresholds
from auditor.core.verdicts import Evidence, classify


def _maybe(rnd: random.Random, lo: float = 0.0, hi: float = 1.0) -> float | None:
    return None if rnd.random() < 0.15 else rnd.uniform(lo, hi)


def test_verdict_alone_equals_the_explained_verdict() -> None:
    rnd = random.Random(11)
    th = Thresholds()
    seen = set()
    for _ in range(5000):
        ev = Evidence(
            busy=_maybe(rnd),
            busy_metric=rnd.choice((Metric.GPU_UTIL, Metric.GR_ENGINE_ACTIVE, None)),
            sm=_maybe(rnd),
            tensor=_maybe(rnd, 0.0, 0.4),
            dram=_maybe(rnd),
            fp32=_maybe(rnd, 0.0, 0.3),
            fp16=_maybe(rnd, 0.0, 0.3),
            power=_maybe(rnd, 0.0, 700.0),
            samples=rnd.choice((0, 5, 100, 1000)),
            span_s=rnd.choice((0.0, 60.0, 3600.0)),
            coverage=_maybe(rnd),
            shared_fraction=rnd.choice((0.0, 0.0, 0.9)),
            model="NVIDIA H200",
            silent_zero=[{"gpu": "g"}] if rnd.random() < 0.05 else [],
            gr_engine=_maybe(rnd),
            pcie_rx=_maybe(rnd, 0.0, 2e10),
            pcie_tx=_maybe(rnd, 0.0, 2e10),
        )
        verdict, findings = classify(ev, th)
        assert classify(ev, th, explain=False) == (verdict, [])
        seen.add((verdict, findings[0].code, findings[0].evidence.get("reason")))
    assert len(seen) >= 14, sorted(seen, key=str)  # the branches were reached
