"""Operator cycles over data that no longer changes never change a summary (issue 12, item 5).

The report: two cycles 8 s apart over 15 s data that had ended inside a bucket gave a job 5.37,
then 6.00 GPU-hours ("sample interval 60 s"): the second cycle's window held only that partial
bucket, and its ``width / samples`` became the interval of the whole cumulative summary. Here
the data are raw samples rolled up as Prometheus would, the source tells the interval the way
the Prometheus source used to (a high percentile of samples per bucket over *every* bucket of
its window), and the cycles run against a real store (SQLite, and PostgreSQL on the test bed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from auditor.core.accumulate import JobAggregate
from auditor.core.metrics import Metric
from auditor.core.model import GpuId, PodRef, Window
from auditor.core.readings import SourceReport, SourceResult
from auditor.core.rollup import Sample, aggregate
from auditor.core.sharing import gpu_shares
from auditor.correlate import NoKubeResolver
from auditor.engine import align_down, run_audit
from auditor.store import Store

W = timedelta(minutes=5)
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
#: summary fields that follow the cycle, not the data
CYCLE_FIELDS = ("window", "computed_at")


class SampleSource:
    """Raw samples rolled up per window; the interval told as the old Prometheus source did:
    width over the 90th percentile of samples per bucket, partial buckets included."""

    def __init__(self, samples: list[Sample], *, tell: bool = True) -> None:
        self.samples = samples
        self.tell = tell

    def read(self, window: Window, width: timedelta) -> SourceResult:
        buckets = aggregate(self.samples, width, window)
        counts = sorted(b.count for b in buckets if b.count)
        told = (
            width.total_seconds() / counts[min(len(counts) - 1, int(len(counts) * 0.9))]
            if counts and self.tell
            else None
        )
        report = SourceReport(present={b.metric for b in buckets if b.count}, scrape_interval=told)
        return SourceResult(buckets=buckets, report=report)

    read_lazy = read


@dataclass
class Run:
    pod: PodRef
    gpus: list[GpuId]
    start: float  # Unix seconds
    end: float
    interval: float
    gaps: list[tuple[float, float]]
    util: float
    sm: float


def samples_of(runs: list[Run], rnd: random.Random) -> list[Sample]:
    out = []
    for r in runs:
        t = r.start
        while t < r.end:
            if not any(a <= t < b for a, b in r.gaps):
                for g in r.gpus:
                    out.append(
                        Sample(r.pod, g, Metric.GPU_UTIL, t, min(100.0, r.util * 100 * (0.9 + 0.2 * rnd.random())))
                    )
                    out.append(Sample(r.pod, g, Metric.SM_ACTIVE, t, min(1.0, r.sm * (0.9 + 0.2 * rnd.random()))))
            t += r.interval
    return out


def gpus(host: str, n: int) -> list[GpuId]:
    return [GpuId(uuid=f"GPU-{host}-{i}", hostname=host, index=str(i), model="NVIDIA H200") for i in range(n)]


def cycle(store: Store, source: SampleSource, start: datetime, now: datetime) -> None:
    run_audit(source, NoKubeResolver("c1"), store, Window(start, now), now=now, cumulative=True)


def summaries(store: Store) -> dict[str, dict]:
    return {
        f"{s['namespace']}/{s['job']}": {k: v for k, v in s.items() if k not in CYCLE_FIELDS} for s in store.summaries()
    }


@pytest.mark.parametrize("tell", [True, False], ids=["source-tells", "source-silent"])
def test_two_cycles_8s_apart_over_data_that_ended_mid_bucket_agree(store_url: str, tell: bool) -> None:
    """The report's case: 8 GPUs of 15 s data ending 75 s into a bucket; cycles at +100 s, +108 s."""
    start = T0.timestamp()
    end = start + 40 * 60 + 75  # 5 samples into the bucket at 09:40
    run = Run(PodRef("ml", "train-0"), gpus("n1", 8), start, end, 15.0, [], 0.95, 0.06)
    source = SampleSource(samples_of([run], random.Random(1)), tell=tell)
    now1 = datetime.fromtimestamp(end + 100, timezone.utc)
    now2 = now1 + timedelta(seconds=8)
    with Store.open(store_url) as store:
        cycle(store, source, T0, now1)
        first = summaries(store)["ml/Pod/train-0"]
        cycle(store, source, align_down(now1, W), now2)
        second = summaries(store)["ml/Pod/train-0"]
    hours = 8 * (40 * 60 + 75) / 3600
    assert first["scrape_interval_s"] == 15.0
    assert first["gpu_hours"] == pytest.approx(hours, rel=1e-3)
    assert second == first  # was 5.37 → 6.00 GPU-hours and "sample interval 60 s" in the report


@pytest.mark.testbed
def test_two_cycles_8s_apart_over_prometheus_data_that_ended_mid_bucket_agree(prometheus, store_url: str) -> None:
    """The report's case through the real Prometheus source: 8 GPUs, 15 s samples ending 75 s
    into a bucket, two cycles 8 s apart; the second window holds only that partial bucket."""
    import time
    import uuid

    from auditor.sources.prometheus import PrometheusSource
    from tests.sources.test_prometheus_source import _const, _gpu, _om

    case = f"c{uuid.uuid4().hex[:8]}"
    start = (int(time.time()) // 300 * 300) - 3 * 3600  # Prometheus's backfill wants the past
    end = start + 40 * 60 + 75
    series = []
    for i in range(8):
        labels = _gpu(case, i, pod="train-0", namespace="ml", container="main")
        series.append(("DCGM_FI_DEV_GPU_UTIL", labels, _const(start, end, 95)))
        series.append(("DCGM_FI_PROF_SM_ACTIVE", labels, _const(start, end, 0.06)))
    prometheus.backfill(_om(series))
    source = PrometheusSource(prometheus.url, matchers={"case": case})
    now1 = datetime.fromtimestamp(end + 100, timezone.utc)
    now2 = now1 + timedelta(seconds=8)
    with Store.open(store_url) as store:
        cycle(store, source, datetime.fromtimestamp(start, timezone.utc), now1)
        first = summaries(store)["ml/Pod/train-0"]
        window2 = Window(align_down(now1, W), now2)
        fresh = PrometheusSource(prometheus.url, matchers={"case": case})
        assert fresh.read(window2, W).report.scrape_interval is None  # no full bucket in it
        assert source.read(window2, W).report.scrape_interval == 15.0  # what the last full one measured
        # a steady-state window of two buckets: the first one, full, tells the interval
        steady = Window(align_down(now1, W) - W, now1)
        assert PrometheusSource(prometheus.url, matchers={"case": case}).read(steady, W).report.scrape_interval == 15.0
        cycle(store, source, window2.start, now2)
        second = summaries(store)["ml/Pod/train-0"]
    assert first["scrape_interval_s"] == 15.0
    assert first["gpu_hours"] == pytest.approx(8 * (40 * 60 + 75) / 3600, rel=2e-3)
    assert first["waste_gpu_hours"] == pytest.approx(first["gpu_hours"] * 0.94, rel=1e-3)
    assert second == first


def scenario(seed: int) -> tuple[list[Run], float]:
    """A random cluster: 1-3 pods, 1-2 GPUs each (sometimes one shared by two pods), a scrape
    interval of 10-60 s, starts and ends anywhere in a bucket, sometimes a gap; and its end."""
    rnd = random.Random(seed)
    runs = []
    base = T0.timestamp()
    for k in range(rnd.randint(1, 3)):
        iv = rnd.choice([10.0, 15.0, 30.0, 60.0])
        s = base + rnd.uniform(0, 1800)
        e = s + rnd.uniform(60, 3 * 3600)
        gaps = []
        if rnd.random() < 0.4 and e - s > 1200:
            g = rnd.uniform(s + 300, e - 600)
            gaps.append((g, g + rnd.uniform(30, 500)))
        host = "shared" if k and rnd.random() < 0.3 else f"n{k}"
        runs.append(
            Run(
                PodRef(f"team{k % 2}", f"job-{k}"),
                gpus(host, rnd.randint(1, 2)),
                s,
                e,
                iv,
                gaps,
                rnd.uniform(0.0, 1.0),
                rnd.uniform(0.0, 1.0),
            )
        )
    return runs, max(r.end for r in runs)


def check_cycles(store_url: str, seed: int) -> None:
    """Cycles at random times, some seconds apart, some across bucket bounds, some while the jobs
    still run: once every sample is in, no later cycle changes any stored summary; a job with
    full buckets gets the summary of one audit of its whole history."""
    runs, end = scenario(seed)
    rnd = random.Random(1000 + seed)
    source = SampleSource(samples_of(runs, rnd), tell=rnd.random() < 0.7)
    first = align_down(datetime.fromtimestamp(min(r.start for r in runs), timezone.utc), W)
    settled = datetime.fromtimestamp(end, timezone.utc) + timedelta(seconds=61)
    times: list[datetime] = []
    t = first + timedelta(seconds=rnd.uniform(30, 900))
    while t < settled + timedelta(minutes=20):
        times.append(t)
        t += timedelta(seconds=rnd.choice([8, 8, 30, 100, 299, 301, 640, 1500]))
    times.append(settled)
    times.sort()
    with Store.open(store_url) as store:
        start, seen = first, None
        for now in times:
            cycle(store, source, start, now)
            start = align_down(now, W)
            if now >= settled:
                got = summaries(store)
                if seen is None:
                    seen = got
                assert got == seen, f"seed {seed}: cycle at {now.isoformat()} changed a summary"
    assert seen
    one_shot = [
        s.to_json()
        for s in run_audit(source, NoKubeResolver("c1"), None, Window(first, settled), now=settled).summaries
    ]
    whole = {f"{s['namespace']}/{s['job']}": {k: v for k, v in s.items() if k not in CYCLE_FIELDS} for s in one_shot}
    assert set(seen) == set(whole)
    every = aggregate(source.samples, W)
    for r in runs:
        key = f"{r.pod.namespace}/Pod/{r.pod.pod}"
        agg = JobAggregate()
        agg.fold([b for b in every if b.pod == r.pod], gpu_shares(every))
        if agg.sample_interval() is not None:
            # measured from the job's own full buckets: equal to one audit of the whole history
            assert seen[key] == whole[key], key
            assert seen[key]["scrape_interval_s"] == pytest.approx(r.interval, rel=0.1), r
        else:
            # too short for a full bucket: whatever the sources told, never above what its own
            # busiest bucket allows
            assert 0 < seen[key]["scrape_interval_s"] <= agg.interval_for(None), r


@pytest.mark.parametrize("seed", range(30))
def test_rerunning_cycles_over_unchanged_data_never_changes_a_summary(tmp_path, seed: int) -> None:
    """Property over a seeded random table (no hypothesis here), on SQLite."""
    check_cycles(f"sqlite:///{tmp_path}/store.db", seed)


@pytest.mark.parametrize("seed", range(0, 30, 6))
def test_rerunning_cycles_over_unchanged_data_never_changes_a_summary_on_postgresql(
    postgres_url: str, seed: int
) -> None:
    """The same property on the test bed's PostgreSQL, every sixth seed."""
    check_cycles(postgres_url, seed)
