"""A real local HTTP receiver standing in for Slack and a webhook endpoint (records every POST)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """``url`` + ``posts``; ``fail_paths`` answer 500 (to test retries and failures)."""

    server: ThreadingHTTPServer
    posts: list[Received] = field(default_factory=list)
    fail_paths: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def by_path(self, prefix: str) -> list[Received]:
        with self.lock:
            return [p for p in self.posts if p.path.startswith(prefix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_receiver() -> Receiver:
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n)
            rec = holder["r"]
            if self.path in rec.fail_paths:
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"boom")
                return
            with rec.lock:
                rec.posts.append(Received(self.path, dict(self.headers.items()), body))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec = Receiver(server)
    holder["r"] = rec
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return rec
