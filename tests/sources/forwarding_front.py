"""A local HTTP front before a real Prometheus, for tests that must change what an engine answers.

It stands where an engine's query frontend would: every API call goes to :meth:`ForwardingFront.serve`,
which by default forwards it to the upstream unchanged; a test's front overrides ``serve`` to refuse
a request in an engine's words or to rewrite the real answer.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests


class ForwardingFront:
    """Forwards to ``upstream``; subclasses override :meth:`serve`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        front = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                front._handle(self, b"")

            def do_POST(self) -> None:
                front._handle(self, self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> requests.Response:
        """The request as the upstream answers it."""
        return requests.request(
            handler.command,
            self.upstream + handler.path,
            data=body or None,
            headers={"Content-Type": handler.headers.get("Content-Type", "")} if body else None,
            timeout=60,
        )

    def serve(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, bytes, str]:
        """Status, body and content type of the answer to one request."""
        resp = self.forward(handler, body)
        return resp.status_code, resp.content, resp.headers.get("Content-Type", "application/json")

    def _handle(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        status, content, ctype = self.serve(handler, body)
        handler.send_response(status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
