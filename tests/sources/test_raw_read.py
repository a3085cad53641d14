"""The raw-sample read of a short window gives what the four aggregate queries give.

An operator cycle reads one or two buckets; there the source asks one raw-sample query per
exporter name and computes count/sum/min/max itself (auditor/sources/samples.py). The garbage
checks, drop counts, verdicts and the store all rest on those figures, so the two paths must
give the same buckets with the same statistics, bit for bit, on the same data: checked here on
the bed's Prometheus with the awkward cases in one history (garbage, overshoot, NaN, gaps, a
series that starts late, MIG, duplicates, the node agent beside dcgm-exporter, a GPU without a
pod, a window whose ends cut buckets), and the maths against a plain reimplementation of
Prometheus's functions.
"""

from __future__ import annotations

import math
import random
import uuid

import pytest

from auditor.core.model import Window
from auditor.sources.prometheus import RAW_READ_SAMPLES, PrometheusSource
from auditor.sources.samples import bucket_stats
from tests.sources.test_prometheus_source import WIDTH, _const, _gpu, _om, _utc, _window

AGGREGATES_ONLY = -1
RAW_ALWAYS = 10**9


def _history(case: str, s: int, e: int, agent: bool) -> list[tuple[str, dict[str, str], list[tuple[float, float]]]]:
    series = []
    for i in range(3):
        labels = _gpu(case, i, pod=f"train-{i // 2}", namespace="ml", container="main")
        util = [(t, (t // 15 * 7 + i) % 101) for t in range(s, e, 15)]
        if i == 0:  # garbage: the 4294967295 sentinel, NaN, a negative, and a gap of a minute
            bad = {s + 315: 4294967295, s + 330: float("nan"), s + 345: -1, s + 1200: 4294967295}
            util = [(t, bad.get(t, v)) for t, v in util if not (s + 600 <= t < s + 660)]
        series.append(("DCGM_FI_DEV_GPU_UTIL", labels, util))
        sm = [(t, 1.03 if t == s + 600 + 15 * i else 0.1 + 0.37 * ((t // 15) % 3) / 3) for t in range(s, e, 15)]
        series.append(("DCGM_FI_PROF_SM_ACTIVE", labels, sm))
        series.append(("DCGM_FI_DEV_POWER_USAGE", labels, [(t, 100.125 + (t % 45) / 7) for t in range(s + 200, e, 15)]))
    # MIG instances of one GPU, a duplicate scrape, a GPU without a pod, the agent beside dcgm-exporter
    for gi, pod in (("1", "mig-a"), ("2", "mig-b")):
        mig = _gpu(case, 8, GPU_I_ID=gi, GPU_I_PROFILE="3g.71gb", pod=pod, namespace="mig")
        series.append(("DCGM_FI_PROF_GR_ENGINE_ACTIVE", mig, _const(s, e, 0.25 * int(gi))))
    for inst, start in (("10.0.0.1:9400", s), ("10.0.0.2:9400", s + 300)):
        dup = _gpu(case, 9, pod="dup", namespace="ns", instance=inst)
        series.append(("DCGM_FI_DEV_GPU_UTIL", dup, _const(start, e, 60)))
    series.append(("DCGM_FI_DEV_GPU_UTIL", _gpu(case, 10), _const(s, e, 0)))
    exporter = _gpu(case, 11, pod="both", namespace="ns")
    if agent:  # (without a source label anywhere the read takes its per-name path, no Series)
        series.append(
            (
                "DCGM_FI_PROF_SM_ACTIVE",
                _gpu(case, 11, pod="both", namespace="ns", source="gpu-auditor-agent"),
                _const(s, e, 0.5),
            )
        )
    series.append(("DCGM_FI_PROF_SM_ACTIVE", exporter, _const(s, e, 0.75)))
    series.append(("DCGM_FI_DEV_GPU_UTIL", exporter, _const(s, e, 40, step=30)))
    return series


@pytest.fixture(scope="module", params=[True, False], ids=["with the agent", "dcgm-exporter only"])
def mixed(testbed, request) -> tuple[str, str, int]:
    """(Prometheus URL, case label, history start): 30 minutes of the history above."""
    case = f"raw{uuid.uuid4().hex[:8]}"
    s, e = _window()
    testbed.backfill(_om(_history(case, s, e, agent=request.param)))
    return testbed.prometheus_url, case, s


def _source(mixed: tuple[str, str, int], raw_read_samples: int) -> PrometheusSource:
    url, case, _ = mixed
    return PrometheusSource(url, matchers={"case": case}, raw_read_samples=raw_read_samples)


def _bucket_rows(res) -> list[tuple]:
    return [tuple(b) for b in res.buckets]


@pytest.mark.parametrize(
    "start_off, end_off",
    [(300, 600), (600, 1200), (0, 1800), (450, 1020), (310, 610), (1500, 1790)],
    ids=["one bucket", "two buckets", "six buckets", "cut at both ends", "gap and garbage", "last open"],
)
def test_raw_and_aggregate_reads_give_the_same_buckets(mixed, start_off: int, end_off: int) -> None:
    s = mixed[2]
    window = Window(_utc(s + start_off), _utc(s + end_off))
    agg_src, raw_src = _source(mixed, AGGREGATES_ONLY), _source(mixed, RAW_ALWAYS)
    agg, raw = agg_src.read(window, WIDTH), raw_src.read(window, WIDTH)
    assert not agg_src.reads_raw(1, 1) and raw_src.reads_raw(10**6, 1)
    assert agg.buckets, "the history is in the window"
    assert _bucket_rows(raw) == _bucket_rows(agg)  # every field, exactly (sums included)
    assert [type(x) for x in _bucket_rows(raw)[0]] == [type(x) for x in _bucket_rows(agg)[0]]
    assert raw.report.present == agg.report.present
    assert raw.report.dropped == agg.report.dropped
    assert raw.report.labels == agg.report.labels
    assert raw.report.scrape_interval == agg.report.scrape_interval
    assert raw.report.warnings == agg.report.warnings
    assert raw_src.stats.gpus == agg_src.stats.gpus and raw_src.stats.hosts == agg_src.stats.hosts
    names = len(agg_src.stats.names)
    garbage_rereads = agg.report.queries - (2 + 4 * names)
    assert garbage_rereads >= 0
    assert raw.report.queries == 2 + names + garbage_rereads  # one raw query per name instead of four


def test_a_cycle_reads_raw_and_a_long_window_reads_aggregates() -> None:
    src = PrometheusSource("http://127.0.0.1:9")  # no call is made: the choice is pure
    five, thirty = 300_000, 1_800_000
    assert src.reads_raw(five, five)  # a cycle's bucket at the guessed 15 s: 20 samples a series
    assert not src.reads_raw(thirty, five)  # 120 samples a series: the aggregates are cheaper
    assert not src.reads_raw(2 * 3600_000, five)
    src._interval = 1.0  # a 1 s scrape: a 5-minute bucket holds 300 samples a series
    assert not src.reads_raw(five, five)
    src._interval = 30.0
    assert src.reads_raw(2 * five, five)


def _reference(values: list[float]) -> tuple[float, float, float, float]:
    """Prometheus 2.42's count/sum/min/max_over_time, transcribed (promql/functions.go)."""
    total, c = 0.0, 0.0
    for v in values:
        t = total + v
        if abs(total) >= abs(v):
            c += (total - t) + v
        else:
            c += (v - t) + total
        total = t
    total = total if math.isinf(total) else total + c
    lo = hi = values[0]
    for v in values:
        if v < lo or math.isnan(lo):
            lo = v
        if v > hi or math.isnan(hi):
            hi = v
    return float(len(values)), total, lo, hi


def test_bucket_stats_are_prometheus_s_functions() -> None:
    rng = random.Random(18)
    width, n, first = 300_000, 4, 1_767_225_600_000
    specials = [float("nan"), float("inf"), -float("inf"), 4294967295.0, -1.0, 0.0, -0.0, 1e300, 1e-300]
    result = []
    expected: dict[tuple[int, int], tuple[float, float, float, float]] = {}
    for j in range(40):
        points = []
        for i in range(n):
            if rng.random() < 0.2:
                continue  # a bucket without samples
            ts = sorted(rng.sample(range(0, width, 1000), rng.randint(1, 25)))
            vals = [rng.choice(specials) if rng.random() < 0.15 else rng.uniform(-3, 1e4) for _ in ts]
            points += [
                ((first + i * width + t) / 1000, repr(v).replace("inf", "Inf").replace("nan", "NaN"))
                for t, v in zip(ts, vals)
            ]
            expected[(j, i)] = _reference(vals)
        result.append({"metric": {"__name__": "x", "i": str(j)}, "values": points})
    labels, block = bucket_stats(result, first, width, n)
    assert labels == [{"i": str(j)} for j in range(40)]
    for j in range(40):
        for i in range(n):
            got = tuple(float(block[k, j, i]) for k in range(4))
            want = expected.get((j, i), (math.nan,) * 4)
            assert [repr(x) for x in got] == [repr(x) for x in want], (j, i)


def test_bucket_stats_of_one_bucket_and_of_an_empty_answer() -> None:
    labels, block = bucket_stats([{"metric": {"a": "1"}, "values": [[1.0, "2"], [16.0, "NaN"]]}], 0, 300_000, 1)
    assert labels == [{"a": "1"}] and block[0, 0, 0] == 2 and math.isnan(block[1, 0, 0])
    assert block[2, 0, 0] == 2 and block[3, 0, 0] == 2  # NaN is skipped by min/max unless all are NaN
    labels, block = bucket_stats([], 0, 300_000, 3)
    assert labels == [] and block.shape == (4, 0, 3)


def test_a_split_raw_read_joins_its_halves(mixed) -> None:
    """Where an engine refuses the raw read for its size, halves give the same buckets."""
    from auditor.errors import QueryTooLarge

    s = mixed[2]
    window = Window(_utc(s), _utc(s + 1800))
    src = _source(mixed, RAW_ALWAYS)
    whole = src.read(window, WIDTH)
    query = src.client.query
    refused = []

    def limited(expr: str, at_ms: int | None = None, convert=None, raw=None, **bounds):
        rng_ms = int(expr.rsplit("[", 1)[1].rstrip("ms]"))
        if raw is not None and rng_ms > 600_000:  # the raw read (the garbage re-read is not limited)
            refused.append(expr)
            raise QueryTooLarge("query processing would load too many samples into memory", limit="samples")
        return query(expr, at_ms, convert, raw, **bounds)

    src.client.query = limited  # type: ignore[method-assign]
    split = src.read(window, WIDTH)
    assert refused and _bucket_rows(split) == _bucket_rows(whole)
    assert split.report.scrape_interval == whole.report.scrape_interval


def test_six_buckets_of_a_fresh_source_stay_on_the_aggregates(mixed) -> None:
    s = mixed[2]
    src = _source(mixed, RAW_READ_SAMPLES)
    res = src.read(Window(_utc(s), _utc(s + 1800)), WIDTH)
    assert res.report.queries >= 2 + 4 * len(src.stats.names)
    assert res.report.scrape_interval == pytest.approx(15.0)
    # the next cycle's one bucket at the measured 15 s: 20 samples a series, read raw
    cycle = src.read(Window(_utc(s + 1500), _utc(s + 1800)), WIDTH)
    assert cycle.report.queries == 1 + len(src.stats.names)  # names, then one per name (the version is known)


def test_a_raw_read_hands_one_piece_per_device(mixed, monkeypatch) -> None:
    """A cycle's read hands one piece per (pod, GPU) holding all its metrics, sorted by pod and
    GPU, each materializing to that device's buckets in the aggregate path's order; the bed's
    answers are read from their bodies (no JSON object per sample), garbage and all."""
    import auditor.sources.prometheus as prometheus

    plain: list[bool] = []
    real = prometheus.parse_matrix

    def counting(body: bytes, name: str, times: bool = True):
        got = real(body, name, times)
        plain.append(got is not None)
        return got

    monkeypatch.setattr(prometheus, "parse_matrix", counting)
    s = mixed[2]
    window = Window(_utc(s + 600), _utc(s + 1200))
    lazy = _source(mixed, RAW_ALWAYS).read_lazy(window, WIDTH).buckets
    agg = _source(mixed, AGGREGATES_ONLY).read(window, WIDTH).buckets
    assert plain and all(plain)
    devices = [(pod.namespace, pod.pod, pod.container, key) for pod, key, _ in lazy.pieces]
    assert devices == sorted(set(devices))
    assert len(devices) == len({(b.pod, b.gpu.key) for b in agg})
    for pod, key, _ in lazy.pieces:
        assert {(b.pod, b.gpu.key) for b in lazy.materialize([(pod, key, _)])} == {(pod, key)}
    assert [tuple(b) for b in lazy.materialize(lazy.pieces)] == [tuple(b) for b in agg]
    assert len(lazy) == len(agg)


def test_the_next_read_decodes_no_label_set_again(mixed, monkeypatch) -> None:
    """An operator's source reads the same series each cycle: the second read's label sets and
    identities come from the first, with the same buckets and read details."""
    import auditor.sources.prometheus as prometheus

    decoded: list[int] = []
    real = prometheus.labels_of
    monkeypatch.setattr(prometheus, "labels_of", lambda keys: decoded.append(len(keys)) or real(keys))
    s = mixed[2]
    window = Window(_utc(s + 300), _utc(s + 900))
    src = _source(mixed, RAW_ALWAYS)
    first = src.read(window, WIDTH)
    stats = src.stats
    second = src.read(window, WIDTH)
    assert len(decoded) == 1 and decoded[0] > 0  # only the first read decoded any
    assert _bucket_rows(second) == _bucket_rows(first)
    assert second.report.warnings == first.report.warnings and second.report.labels == first.report.labels
    assert src.stats.gpus == stats.gpus and src.stats.attributed == stats.attributed
    assert src.stats.hosts == stats.hosts and src.stats.exporter_pods == stats.exporter_pods
