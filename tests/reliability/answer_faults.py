"""The fault proxy (``faultproxy.FaultProxy``) with what issue 35's probes add: answers rewritten
(a function of the real answer's JSON), a body cut short under a Content-Length that promises
more and the connection then held open, and a body trickled a few bytes at a time.

    proxy = AnswerProxy(prometheus.url, rewrite=lambda query, doc: {**doc, "data": None})
    proxy.script(PASS, PASS).always(hold(keep=0.5, seconds=60))
"""

from __future__ import annotations

import gzip
import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Callable
from urllib.parse import parse_qs, urlsplit

from faultproxy import Fault, FaultProxy, ProxiedRequest

#: a rewrite: (the query's PromQL, the decoded answer) → the answer to send (an object, or bytes as they are)
Rewrite = Callable[[str, dict], "dict | bytes"]

PASS = Fault.passthrough()


def hold(keep: float = 0.5, seconds: float = 60.0) -> Fault:
    """Send ``keep`` of the real body under its full Content-Length, then hold the connection
    open ``seconds`` (or until released) without a byte more: the lying Content-Length."""
    return Fault("hold", keep=keep, delay=seconds)


def trickle(every: float = 0.5) -> Fault:
    """Send the real body one byte every ``every`` seconds: each read gets something, so no
    per-read timeout ever fires."""
    return Fault("trickle", delay=every)


class AnswerProxy(FaultProxy):
    """A :class:`FaultProxy` whose passed-through answers to ``query``/``query_range`` go through
    ``rewrite`` (when given), and which knows :func:`hold` and :func:`trickle`."""

    def __init__(self, upstream: str, rewrite: Rewrite | None = None) -> None:
        super().__init__(upstream)
        self.rewrite = rewrite

    def _apply(self, h: BaseHTTPRequestHandler, fault: Fault, req: ProxiedRequest) -> None:
        path = req.path.split("?", 1)[0]
        if fault.kind == "pass" and self.rewrite is not None and path in ("/api/v1/query", "/api/v1/query_range"):
            status, headers, data = self._forward(req)
            if any(k.lower() == "content-encoding" and v == "gzip" for k, v in headers):
                data = gzip.decompress(data)
                headers = [(k, v) for k, v in headers if k.lower() != "content-encoding"]
            if status == 200:
                out = self.rewrite(_query_of(req), json.loads(data))
                data = out if isinstance(out, bytes) else json.dumps(out, separators=(",", ":")).encode()
            self._answer(h, status, headers, data)
            return
        if fault.kind in ("hold", "trickle"):
            status, headers, data = self._forward(req)
            h.send_response(status)
            for k, v in headers:
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if fault.kind == "hold":
                h.wfile.write(data[: int(len(data) * fault.keep)])
                h.wfile.flush()
                self._released.wait(fault.delay)
            else:
                for i in range(len(data)):
                    if self._released.is_set():
                        break
                    h.wfile.write(data[i : i + 1])
                    h.wfile.flush()
                    time.sleep(fault.delay)
            h.connection.close()
            return
        super()._apply(h, fault, req)


def _query_of(req: ProxiedRequest) -> str:
    """The PromQL of a query request (its form, in the body of a POST or the URL of a GET)."""
    form = parse_qs(req.body.decode()) | parse_qs(urlsplit(req.path).query)
    return form.get("query", [""])[0]
