"""A small HTTP proxy of our own that puts a bad day in front of a real server.

It forwards every request to a real upstream (the test bed's Prometheus, a local Slack or
webhook receiver) unless a :class:`Fault` is scripted for it; then it answers 503/429/500,
hangs, answers slowly (after or before the upstream saw the request), cuts the body short,
returns a partial or an HTML body, or drops the connection. Every request is recorded with what
was done to it, so a test can say both what the client saw and what the real server received.

    proxy = FaultProxy("http://127.0.0.1:9090")
    proxy.script(Fault.status(503, retry_after="1"), Fault.slow(2.0))   # the next two requests
    proxy.always(Fault.hang())                                         # every later one
"""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

#: hop-by-hop headers a proxy must not pass on (RFC 9110 7.6.1), plus the ones we recompute
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host"}

HTML_PAGE = (
    b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head>"
    b"<body><h1>Bad Gateway</h1><p>The upstream server is unavailable.</p></body></html>"
)


@dataclass(frozen=True)
class Fault:
    """What to do to one request. Build with the class methods; ``PASS`` forwards untouched."""

    kind: str
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    delay: float = 0.0
    #: for ``slow``: forward first (the upstream acts on it) and answer late, else wait first
    forward_first: bool = True
    #: for ``truncate`` / ``partial``: how much of the upstream body is sent (a fraction, 0..1)
    keep: float = 0.5

    @classmethod
    def passthrough(cls) -> "Fault":
        return cls("pass")

    @classmethod
    def status_code(cls, status: int, *, retry_after: str | None = None, body: bytes = b"error") -> "Fault":
        """Answer ``status`` without asking the upstream (503, 429, 500, ...)."""
        headers = (("Retry-After", retry_after),) if retry_after is not None else ()
        return cls("status", status=status, headers=headers, body=body)

    @classmethod
    def hang(cls, seconds: float = 30.0) -> "Fault":
        """Accept the request and answer nothing (until released, closed, or ``seconds``), then drop it."""
        return cls("hang", delay=seconds)

    @classmethod
    def slow(cls, seconds: float, *, forward_first: bool = True) -> "Fault":
        """Answer after ``seconds``. ``forward_first``: the upstream gets (and acts on) the
        request at once and only its answer is late, as with a receiver slower than our timeout."""
        return cls("slow", delay=seconds, forward_first=forward_first)

    @classmethod
    def truncate(cls, keep: float = 0.5) -> "Fault":
        """Forward, then send the full Content-Length but only ``keep`` of the body and close."""
        return cls("truncate", keep=keep)

    @classmethod
    def partial(cls, keep: float = 0.5) -> "Fault":
        """Forward, then send the first ``keep`` of the body as a complete (well-framed) answer."""
        return cls("partial", keep=keep)

    @classmethod
    def html(cls, status: int = 200) -> "Fault":
        """Answer an HTML page (a captive portal or a load balancer's error page)."""
        return cls("html", status=status, headers=(("Content-Type", "text/html"),), body=HTML_PAGE)

    @classmethod
    def reset(cls) -> "Fault":
        """Close the connection without a word."""
        return cls("reset")


@dataclass
class ProxiedRequest:
    """One request the proxy saw: what it was, what was done to it, whether the upstream got it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    fault: str
    forwarded: bool = False
    at: float = field(default_factory=time.monotonic)


class FaultProxy:
    """A threading HTTP proxy on 127.0.0.1 in front of ``upstream`` (its scheme, host and port).

    ``url`` is the proxy's address with the upstream's path, so it replaces the upstream's URL
    as is. Faults are taken from the script (one per request, in order), then from ``always``.
    """

    def __init__(self, upstream: str, *, upstream_timeout: float = 30.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"fault proxy: upstream must be http://host:port, not {upstream!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self._path = parts.path.rstrip("/")
        self._timeout = upstream_timeout
        self._lock = threading.Lock()
        self._script: list[Fault] = []
        self._default = Fault.passthrough()
        self._released = threading.Event()
        self.requests: list[ProxiedRequest] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner._handle(self)

            do_POST = do_PUT = do_DELETE = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="fault-proxy")
        self._thread.start()

    # ------------------------------------------------------------------ the script

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{self._path}"

    def script(self, *faults: Fault) -> "FaultProxy":
        """The next requests meet these faults, one each, in order (appended to what is left)."""
        with self._lock:
            self._script.extend(faults)
        return self

    def always(self, fault: Fault | None) -> "FaultProxy":
        """What every request meets once the script is used up (None: pass through)."""
        with self._lock:
            self._default = fault or Fault.passthrough()
        return self

    def release(self) -> None:
        """Let every hung request go (dropped without an answer)."""
        self._released.set()

    @property
    def forwarded(self) -> list[ProxiedRequest]:
        with self._lock:
            return [r for r in self.requests if r.forwarded]

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ serving

    def _next(self) -> Fault:
        with self._lock:
            return self._script.pop(0) if self._script else self._default

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        fault = self._next()
        req = ProxiedRequest(h.command, h.path, dict(h.headers.items()), body, fault.kind)
        with self._lock:
            self.requests.append(req)
        try:
            self._apply(h, fault, req)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first (its timeout): what a slow answer is for
        h.close_connection = True

    def _apply(self, h: BaseHTTPRequestHandler, fault: Fault, req: ProxiedRequest) -> None:
        kind = fault.kind
        if kind == "reset":
            h.connection.close()
            return
        if kind == "hang":
            self._released.wait(fault.delay)
            h.connection.close()
            return
        if kind in ("status", "html"):
            self._answer(h, fault.status, list(fault.headers), fault.body)
            return
        if kind == "slow" and not fault.forward_first:
            time.sleep(fault.delay)
        status, headers, data = self._forward(req)
        if kind == "slow" and fault.forward_first:
            time.sleep(fault.delay)
        if kind == "truncate":
            cut = data[: int(len(data) * fault.keep)]
            self._answer(h, status, headers, cut, length=len(data))
            h.connection.close()
            return
        if kind == "partial":
            data = data[: int(len(data) * fault.keep)]
        self._answer(h, status, headers, data)

    def _forward(self, req: ProxiedRequest) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP}
            conn.request(req.method, req.path, body=req.body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            with self._lock:
                req.forwarded = True
            out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP | {"content-length"}]
            return resp.status, out, data
        finally:
            conn.close()

    @staticmethod
    def _answer(
        h: BaseHTTPRequestHandler,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        length: int | None = None,
    ) -> None:
        h.send_response(status)
        for k, v in headers:
            if k.lower() != "content-length":
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()
