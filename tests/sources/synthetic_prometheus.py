"""A local HTTP server that answers the Prometheus API calls of the source from series held in
memory, so that property tests can send answers no real exporter would produce in a few
milliseconds each (the bed's Prometheus takes a backfill and a restart per history).

It evaluates what :class:`~auditor.sources.prometheus.PrometheusSource` asks and nothing more:
``status/buildinfo`` (a 2.x server: ranges closed at both ends), ``label/__name__/values``, an
instant ``query`` of ``name{...}[Nms]`` (the raw read and the garbage re-read: samples with
``t - N <= ts <= t``) and a ``query_range`` of ``<agg>_over_time(name{...}[Nms])``. Label matchers
are ignored (every series of the name is answered; the source keeps what it asked for). Values
are written as given (a ``str`` as is, so a test can send ``"abc"``; a float as Go writes it),
and :attr:`SyntheticPrometheus.rewrite` may change any answer's document before it is sent.
The bed probes (tests/reliability/test_hostile_labels.py) use the real Prometheus.
"""

from __future__ import annotations

import json
import math
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from tests.sources.test_matrix_body import _go as go_float  # a value as Prometheus writes it

_RAW = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\[(\d+)ms\]$", re.S)
_AGG = re.compile(r"^(sum|count|min|max)_over_time\(([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\[(\d+)ms\]\)$", re.S)


@dataclass
class Series:
    """One series: its name, labels and samples (seconds, value; a str value is sent as is)."""

    name: str
    labels: dict[str, str]
    samples: list[tuple[float, float | str]] = field(default_factory=list)


class SyntheticPrometheus:
    """Serves ``series`` on 127.0.0.1 (:attr:`url`); ``close()`` stops it."""

    def __init__(self, series: list[Series] | None = None, version: str = "2.53.0") -> None:
        self.series: list[Series] = list(series or [])
        self.version = version
        #: (API path, document) → the document to send (an answer's shape changed by a test)
        self.rewrite: Callable[[str, dict[str, Any]], Any] | None = None
        self.requests = 0
        prom = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                url = urlsplit(self.path)
                form = {k: v[-1] for k, v in (parse_qs(url.query) | parse_qs(body.decode())).items()}
                status, doc = prom.answer(url.path.removeprefix("/api/v1/"), form)
                data = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- answers ---------------------------------------------------------------------------------
    def answer(self, path: str, form: dict[str, str]) -> tuple[int, Any]:
        self.requests += 1
        if path == "status/buildinfo":
            doc: Any = {"status": "success", "data": {"version": self.version}}
        elif path == "label/__name__/values":
            doc = {"status": "success", "data": sorted({s.name for s in self.series})}
        elif path == "query":
            doc = self._instant(form["query"], float(form.get("time", "0")))
        elif path == "query_range":
            doc = self._range(form["query"], float(form["start"]), float(form["end"]), float(form["step"]))
        else:
            return 404, {"status": "error", "errorType": "not_found", "error": path}
        if self.rewrite is not None:
            doc = self.rewrite(path, doc)
        return 200, doc

    @staticmethod
    def _value(v: float | str) -> str:
        return v if isinstance(v, str) else go_float(v)

    def _instant(self, query: str, at: float) -> dict[str, Any]:
        m = _RAW.match(query)
        if m is None:
            return {"status": "success", "data": {"resultType": "vector", "result": []}}
        name, rng = m.group(1), int(m.group(3)) / 1000
        result = []
        for s in self.series:
            if s.name != name:
                continue
            values = [[_ts(t), self._value(v)] for t, v in s.samples if at - rng <= t <= at]
            if values:
                result.append({"metric": {"__name__": name, **s.labels}, "values": values})
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}

    def _range(self, query: str, start: float, end: float, step: float) -> dict[str, Any]:
        m = _AGG.match(query)
        if m is None:
            return {"status": "success", "data": {"resultType": "matrix", "result": []}}
        agg, name, rng = m.group(1), m.group(2), int(m.group(4)) / 1000
        fn: Callable[[list[float]], float] = {"sum": _sum, "count": len, "min": _nanmin, "max": _nanmax}[agg]
        result = []
        for s in self.series:
            if s.name != name:
                continue
            values = []
            n = int(round((end - start) / step))
            for i in range(n + 1):
                t = round(start + i * step, 3)
                window = [_num(v) for ts, v in s.samples if t - rng <= ts <= t]
                if window:
                    values.append([_ts(t), go_float(float(fn(window)))])
            if values:
                # the functions drop the metric name (the source reads it from the query)
                result.append({"metric": dict(s.labels), "values": values})
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _ts(t: float) -> float | int:
    """A timestamp as Prometheus writes it: seconds, at most three decimals."""
    r = round(t, 3)
    return int(r) if r == int(r) else r


def _num(v: float | str) -> float:
    try:
        return float(v)
    except ValueError:
        return math.nan


def _nanmin(values: list[float]) -> float:
    """``min_over_time``: NaN only where every value is."""
    real = [v for v in values if v == v]
    return min(real) if real else math.nan


def _nanmax(values: list[float]) -> float:
    real = [v for v in values if v == v]
    return max(real) if real else math.nan


def _sum(values: list[float]) -> float:
    """``sum_over_time``: plain float addition, so an overflow is +Inf (as in Go), not an error."""
    total = 0.0
    for v in values:
        total += v
    return total
