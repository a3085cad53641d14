"""The engines users run past one Prometheus (Mimir, Thanos, VictoriaMetrics): tenant header and
query-size limits, against the bed's real Prometheus behind a small local front.

The front stands where Mimir's query frontend or Thanos Query would: it forwards every API call
to the real Prometheus, and answers in the engine's own words (texts and status codes from the
engines' sources, see auditor/sources/prometheus_client.py ``LIMIT_ERRORS``) when a request has
no tenant or asks for more than its limit allows. The data is real, backfilled into the bed's
Prometheus; only the limit is enforced by the front.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from auditor.core.model import Window
from auditor.errors import QueryRefused, QueryTooLarge
from auditor.sources.prometheus import PrometheusSource
from auditor.sources.prometheus_client import limit_of
from tests.sources.forwarding_front import ForwardingFront

pytestmark = pytest.mark.testbed

WIDTH = timedelta(minutes=5)


class EngineFront(ForwardingFront):
    """A local HTTP front of a real Prometheus with a tenant check and one range limit."""

    def __init__(self, upstream: str) -> None:
        self.tenant: str | None = None  # required X-Scope-OrgID, when set
        self.max_range_s: float | None = None  # a query_range longer than this is refused
        self.refusal: tuple[int, str] = (422, "")
        self.seen_tenants: list[str | None] = []
        self.refused = 0
        #: answer every series of an instant query twice (an engine whose deduplication failed)
        self.twice = False
        super().__init__(upstream)

    def serve(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes, str]:
        self.seen_tenants.append(handler.headers.get("X-Scope-OrgID"))
        url = urlsplit(handler.path)
        form = {**parse_qs(url.query), **parse_qs(body.decode())}
        if self.tenant and handler.headers.get("X-Scope-OrgID") != self.tenant:
            return 401, b"no org id\n", "text/plain"
        if self.max_range_s is not None and url.path.endswith("/query_range"):
            length = float(form["end"][0]) - float(form["start"][0])
            if length > self.max_range_s:
                self.refused += 1
                status, error = self.refusal
                doc = {"status": "error", "errorType": "execution", "error": error}
                return status, json.dumps(doc).encode(), "application/json"
        resp = self.forward(handler, body)
        content = resp.content
        if self.twice and url.path.endswith("/query") and resp.ok:
            doc = resp.json()
            doc["data"]["result"] = [item for item in doc["data"]["result"] for _ in range(2)]
            content = json.dumps(doc, separators=(",", ":")).encode()  # (as compact as Go writes it)
        return resp.status_code, content, resp.headers.get("Content-Type", "application/json")


@pytest.fixture
def front(prometheus) -> Iterator[EngineFront]:
    f = EngineFront(prometheus.url)
    yield f
    f.close()


@pytest.fixture(scope="module")
def history(testbed) -> tuple[str, Window]:
    """Two GPUs of one pod, 1 h of 15 s samples ending an hour ago, under a case label of their own."""
    case = f"eng{uuid.uuid4().hex[:8]}"
    end = int(time.time()) // 300 * 300 - 3600
    start = end - 3600
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for gpu in range(2):
        labels = f'case="{case}",namespace="ml",pod="train-0",container="main",UUID="GPU-{case}-{gpu}",gpu="{gpu}",Hostname="n1"'
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {40 + 20 * gpu} {t}" for t in range(start, end, 15)]
    testbed.backfill("\n".join(lines) + "\n# EOF\n")
    return case, Window(datetime.fromtimestamp(start, timezone.utc), datetime.fromtimestamp(end, timezone.utc))


def _means(src: PrometheusSource, window: Window) -> dict[tuple[str, datetime], float]:
    return {(b.gpu.uuid, b.start): b.mean for b in src.read(window, WIDTH).buckets}


def test_tenant_header_reaches_a_multi_tenant_front(front: EngineFront, history) -> None:
    case, window = history
    front.tenant = "team-gpu"
    src = PrometheusSource(front.url, tenant="team-gpu", matchers={"case": case})
    means = _means(src, window)
    assert len(means) == 2 * 12 and set(means.values()) == {0.4, 0.6}
    assert front.seen_tenants and set(front.seen_tenants) == {"team-gpu"}  # every call, label values too
    with pytest.raises(QueryRefused, match=r"HTTP 401.*prometheus.tenant \(--prometheus-tenant\)"):
        PrometheusSource(front.url, matchers={"case": case}, retries=0).read(window, WIDTH)


@pytest.mark.parametrize(
    "engine, status, error",
    [
        (
            "mimir",
            422,
            "the query time range exceeds the limit (query length: 1h0m0s, limit: 20m0s) (err-mimir-max-query-length)",
        ),
        (
            "victoriametrics",
            422,
            "cannot select more than -search.maxSamplesPerQuery=1000 samples; possible solutions: increase the "
            "-search.maxSamplesPerQuery; reduce time range for the query; use more specific label filters",
        ),
        ("thanos", 500, "expanding series: rpc error: code = Unknown desc = exceeded samples limit: limit 1000"),
    ],
)
def test_size_limit_errors_split_the_range_like_prometheus_s(
    front: EngineFront, history, prometheus, engine: str, status: int, error: str
) -> None:
    case, window = history
    direct = _means(PrometheusSource(prometheus.url, matchers={"case": case}), window)
    front.max_range_s, front.refusal = 20 * 60, (status, error)
    src = PrometheusSource(front.url, matchers={"case": case}, retries=0)
    assert _means(src, window) == direct  # the same buckets, read in halves
    assert front.refused >= 1


def test_a_series_answered_twice_is_counted_once(front: EngineFront, history, prometheus) -> None:
    """A cycle's raw read of an engine that answers a series twice (as HA pairs that were not
    deduplicated do) keeps one bucket per GPU and bucket, and says so."""
    case, window = history
    cycle = Window(window.end - WIDTH, window.end)
    direct = PrometheusSource(prometheus.url, matchers={"case": case}).read(cycle, WIDTH)
    front.twice = True
    doubled = PrometheusSource(front.url, matchers={"case": case}).read(cycle, WIDTH)
    assert doubled.report.queries == direct.report.queries == 3  # version, names, the one raw read
    assert [tuple(b) for b in doubled.buckets] == [tuple(b) for b in direct.buckets]
    assert len(direct.buckets) == 2
    assert any("duplicate series" in w for w in doubled.report.warnings)
    assert not any("duplicate series" in w for w in direct.report.warnings)


def test_a_series_limit_is_not_split_but_said(front: EngineFront, history) -> None:
    case, window = history
    front.max_range_s = 0  # every range query refused: a series limit holds for any time range
    front.refusal = (
        422,
        "the query exceeded the maximum number of series (limit: 1 series) (err-mimir-max-series-per-query)",
    )
    with pytest.raises(QueryTooLarge, match="only fewer series per query helps") as info:
        PrometheusSource(front.url, matchers={"case": case}, retries=0).read(window, WIDTH)
    # each of the (up to 4 parallel) first queries refused once, none halved down to single buckets
    assert info.value.limit == "series" and front.refused <= 4


def test_limit_texts_of_each_engine() -> None:
    assert limit_of("query processing would load too many samples into memory in query execution") == "samples"
    assert limit_of("exceeded maximum resolution of 11,000 points per timeseries. Try decreasing ...") == "points"
    assert limit_of("the total query time range exceeds the limit (query length: 800h, limit: 721h)") == "length"
    assert limit_of(
        "the query exceeded the maximum number of chunks (limit: 11 chunks) (err-mimir-max-chunks-per-query)"
    )
    assert limit_of("the query exceeded the aggregated chunks size limit (limit: 10 bytes)") == "samples"
    assert limit_of("exceeded series limit: limit 3 violated (got 4)") == "series"
    assert limit_of("exceeded chunks limit: limit 5 violated") == "samples"
    assert (
        limit_of("too many points for the given start=1, end=9 and step=1: 9; the maximum number of points is 30000")
        == "points"
    )
    assert limit_of("the number of matching timeseries exceeds 300000; either narrow down the search") == "series"
    assert limit_of("parse error at char 5: unexpected identifier") is None


def test_the_audit_reads_5m_downsampled_raw_series(testbed) -> None:
    """Raw DCGM series with one sample per 5 minutes (a downsampled store's raw resolution): one
    sample per bucket, the right means, and the interval the coverage is counted by is 5 minutes."""
    case = f"ds{uuid.uuid4().hex[:8]}"
    end = int(time.time()) // 300 * 300 - 3600
    start = end - 3600
    labels = f'case="{case}",namespace="ml",pod="p",container="c",UUID="GPU-{case}",gpu="0",Hostname="n1"'
    rows = [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {30 + (t // 300) % 2 * 20} {t}" for t in range(start + 150, end, 300)]
    testbed.backfill("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + "\n".join(rows) + "\n# EOF\n")
    window = Window(datetime.fromtimestamp(start, timezone.utc), datetime.fromtimestamp(end, timezone.utc))
    res = PrometheusSource(testbed.prometheus_url, matchers={"case": case}).read(window, WIDTH)
    assert len(res.buckets) == 12 and {b.count for b in res.buckets} == {1}
    assert [b.mean for b in res.buckets] == pytest.approx(
        [0.3 + (int(b.start.timestamp()) // 300) % 2 * 0.2 for b in res.buckets]
    )
    assert res.report.scrape_interval == pytest.approx(300.0)
