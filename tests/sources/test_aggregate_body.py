"""A long window's four-aggregate read gives the same buckets from its answers' bytes as from
decoded JSON, whatever the answers hold.

The aggregate path (``PrometheusSource._read_aggregates``, used past the raw-read bound: a first
sighting, a long audit) reads each query_range answer with ``parse_matrix`` (no Python object
per point) and puts the four aggregates of a name in one block per name. Here a small local
front stands before the bed's real Prometheus, with the awkward history of test_raw_read
(garbage, NaN, gaps, MIG, duplicate scrapes, the node agent beside dcgm-exporter), and serves
each answer either as Prometheus wrote it (read from its bytes) or re-spaced (left to the JSON
decoder), and optionally disturbed: ``__name__`` moved last, a series left out of one
aggregate's answers (an incomplete answer: re-read raw), a series answered twice. Every bucket
and every report field must be the same either way.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from auditor.core.model import Window
from auditor.sources.prometheus import PrometheusSource
from tests.sources.forwarding_front import ForwardingFront
from tests.sources.test_prometheus_source import WIDTH, _utc
from tests.sources.test_raw_read import AGGREGATES_ONLY, _bucket_rows, mixed  # noqa: F401 (a fixture)

pytestmark = pytest.mark.testbed

Rewrite = Callable[[str, list[dict]], list[dict]]


class Front(ForwardingFront):
    """A local HTTP front that forwards to a real Prometheus and rewrites query_range answers."""

    def __init__(self, upstream: str) -> None:
        self.rewrite: Rewrite | None = None
        self.spaced = False  # answer with JSON as Python writes it: the byte reader declines it
        super().__init__(upstream)

    def serve(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes, str]:
        resp = self.forward(handler, body)
        content = resp.content
        if urlsplit(handler.path).path.endswith("/query_range") and resp.ok:
            doc = resp.json()
            if self.rewrite is not None:
                doc["data"]["result"] = self.rewrite(parse_qs(body.decode())["query"][0], doc["data"]["result"])
            content = json.dumps(doc, separators=None if self.spaced else (",", ":")).encode()
        return resp.status_code, content, "application/json"


@pytest.fixture
def front(mixed) -> Iterator[Front]:  # noqa: F811 (the fixture imported above)
    f = Front(mixed[0])
    yield f
    f.close()


def _name_last(query: str, result: list[dict]) -> list[dict]:
    for item in result:
        labels = item["metric"]
        name = labels.pop("__name__", None)
        if name is not None:
            labels["__name__"] = name
    return result


def _disturbed(query: str, result: list[dict]) -> list[dict]:
    """The first series missing from max_over_time's answers; the last answered twice by sum."""
    if query.startswith("max_over_time") and result:
        return result[1:]
    if query.startswith("sum_over_time") and result:
        return [*result, result[-1]]
    return result


def _read(front: Front, case: str, window: Window, spaced: bool) -> tuple[list[tuple], Any, PrometheusSource]:
    front.spaced = spaced
    src = PrometheusSource(front.url, matchers={"case": case}, raw_read_samples=AGGREGATES_ONLY)
    res = src.read(window, WIDTH)
    return _bucket_rows(res), res.report, src


@pytest.mark.parametrize("rewrite", [None, _name_last, _disturbed], ids=["as written", "name last", "disturbed"])
@pytest.mark.parametrize("start_off, end_off", [(0, 1800), (450, 1020)], ids=["six buckets", "cut at both ends"])
def test_the_aggregate_read_of_the_bytes_gives_the_decoded_buckets(
    front: Front,
    mixed,  # noqa: F811 (the fixture imported above)
    rewrite: Rewrite | None,
    start_off: int,
    end_off: int,
) -> None:
    _, case, s = mixed
    window = Window(_utc(s + start_off), _utc(s + end_off))
    front.rewrite = rewrite
    rows, report, src = _read(front, case, window, spaced=False)
    want, want_report, want_src = _read(front, case, window, spaced=True)
    assert rows, "the history is in the window"
    assert rows == want  # every field, exactly (sums included)
    assert [type(x) for x in rows[0]] == [type(x) for x in want[0]]
    assert report.present == want_report.present and report.dropped == want_report.dropped
    assert report.labels == want_report.labels and report.scrape_interval == want_report.scrape_interval
    assert sorted(report.warnings) == sorted(want_report.warnings)
    assert report.queries == want_report.queries
    assert src.stats.gpus == want_src.stats.gpus and src.stats.hosts == want_src.stats.hosts
    if rewrite is _disturbed:  # the series without its max is re-read raw: its buckets are all there
        front.rewrite = None
        plain, plain_report, _ = _read(front, case, window, spaced=False)
        assert [r[:4] for r in rows] == [r[:4] for r in plain]
        assert report.queries > plain_report.queries  # (the raw re-read of the incomplete series)
