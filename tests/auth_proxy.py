"""A small authenticating reverse proxy in front of the test bed's Prometheus (loopback only).

Prometheus itself checks basic auth (``--web.config.file``) but never a bearer token, and most
real deployments put an authenticating proxy (oauth2-proxy, an ingress) in front of it: this
stands in for one. A request with the expected ``Authorization`` header is forwarded as it is;
any other gets HTTP 401 with Prometheus's error body. Each answer is counted, so a test can say
that the auditor sent its credentials on every request, not just that it got an answer.
"""

from __future__ import annotations

import base64
import http.server
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field


@dataclass
class AuthProxy:
    """``url`` to give the auditor; ``authorized``/``refused`` count the requests answered."""

    upstream: str
    expected: str
    url: str = ""
    authorized: int = 0
    refused: int = 0
    _server: http.server.ThreadingHTTPServer | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def basic(cls, upstream: str, user: str, password: str) -> "AuthProxy":
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return cls(upstream.rstrip("/"), f"Basic {token}")

    @classmethod
    def bearer(cls, upstream: str, token: str) -> "AuthProxy":
        return cls(upstream.rstrip("/"), f"Bearer {token}")

    def start(self) -> "AuthProxy":
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:  # quiet: pytest shows stderr of failures
                pass

            def _forward(self) -> None:
                if self.headers.get("Authorization") != proxy.expected:
                    with proxy._lock:
                        proxy.refused += 1
                    body = b'{"status":"error","errorType":"unauthorized","error":"missing or wrong credentials"}'
                    self.send_response(401)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                with proxy._lock:
                    proxy.authorized += 1
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else None
                request = urllib.request.Request(proxy.upstream + self.path, data=data, method=self.command)
                if self.headers.get("Content-Type"):
                    request.add_header("Content-Type", self.headers["Content-Type"])
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, content, ctype = answer.status, answer.read(), answer.headers.get("Content-Type")
                except urllib.error.HTTPError as exc:
                    status, content, ctype = exc.code, exc.read(), exc.headers.get("Content-Type")
                self.send_response(status)
                self.send_header("Content-Type", ctype or "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = _forward
            do_POST = _forward

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="auth-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
