"""Real local HTTP receivers (http.server threads on 127.0.0.1) standing in for Slack and webhooks."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Answers with the next status of ``script`` (then ``default``), records every request."""

    script: list[tuple[int, dict]] = field(default_factory=list)
    default: int = 200
    requests: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        rec = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                with lock:
                    rec.requests.append(Received(self.path, dict(self.headers), body))
                    status, headers = rec.script.pop(0) if rec.script else (rec.default, {})
                    rec.statuses.append(status)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                payload = b"ok" if status < 300 else b"error"
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *a: object) -> None:
                pass

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    @property
    def accepted(self) -> list[Received]:
        return [r for r, s in zip(self.requests, self.statuses) if 200 <= s < 300]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
