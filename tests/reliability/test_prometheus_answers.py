"""What a bad answer from Prometheus becomes: a timeout is said to be one (never
"unreachable"), and a partial answer is never stored as if it were complete.

The probes: a Prometheus that took the query and never answered was reported as
"unreachable: Max retries exceeded" (urllib3 wraps the read timeout); a partial response
(``warnings`` other than PromQL's annotations, as Thanos or a remote-read endpoint send when a
store was not heard) was stored as a complete result. Now the query asks Thanos for no partial
answers (``partial_response=false``) and an answer with such a warning fails the audit
(retryable) with nothing stored. Real bed Prometheus behind our own proxies.
"""

from __future__ import annotations

import http.client
import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from faultproxy import Fault

from auditor.cli.main import main

#: the bed's series are recent: an hour back from now holds some (what is found is not asserted)
RANGE = ["--start", "now-1h", "--end", "now"]


class WarningProxy:
    """Forwards to the real Prometheus and adds ``warnings`` to every ``query_range`` answer,
    as Thanos does for a partial response; records the form of every request."""

    def __init__(self, upstream: str, warnings: list[str]) -> None:
        up = urlsplit(upstream)
        proxy = self
        self.forms: list[dict[str, list[str]]] = []

        class H(BaseHTTPRequestHandler):
            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.forms.append(parse_qs(body.decode()) | parse_qs(urlsplit(self.path).query))
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
                conn.request(
                    self.command,
                    self.path,
                    body=body or None,
                    headers={"Content-Type": self.headers.get("Content-Type", "")},
                )
                resp = conn.getresponse()
                data = resp.read()
                if "/api/v1/query_range" in self.path and resp.status == 200:
                    doc = json.loads(data)
                    doc["warnings"] = warnings
                    data = json.dumps(doc).encode()
                self.send_response(resp.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _any

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def warning_proxy(prometheus) -> Iterator[type]:
    made: list[WarningProxy] = []

    def make(warnings: list[str]) -> WarningProxy:
        made.append(WarningProxy(prometheus.url, warnings))
        return made[-1]

    yield make
    for p in made:
        p.close()


def audit(capsys: pytest.CaptureFixture[str], url: str, db: Path, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["audit", "--prometheus", url, "--no-kube", *RANGE, "--db", f"sqlite:///{db}", *extra])
    return rc, capsys.readouterr().err


def summaries(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("select count(*) from job_summaries").fetchone()[0])


def test_a_partial_answer_fails_the_audit_and_stores_nothing(warning_proxy, tmp_path: Path, capsys) -> None:
    proxy = warning_proxy(["partial response: store 10.0.0.7:10901 unavailable: rpc error: code = Unavailable"])
    rc, err = audit(capsys, proxy.url, tmp_path / "a.db")
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith(
        f"gpu-auditor: failed (retryable): Prometheus at {proxy.url} answered query_range with incomplete data (partial response: store 10.0.0.7:10901"
    )
    assert summaries(tmp_path / "a.db") == 0
    assert all(
        f.get("partial_response") == ["false"] for f in proxy.forms if "query" in f
    )  # Thanos: no partial answers


def test_promql_annotations_are_warnings_not_missing_data(warning_proxy, tmp_path: Path, capsys) -> None:
    note = 'PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket: "DCGM_FI_PROF_SM_ACTIVE"'
    proxy = warning_proxy([note])
    rc, err = audit(capsys, proxy.url, tmp_path / "a.db")
    assert rc == 0, err
    assert f"warning: {note}" in err


def test_a_query_that_hangs_is_a_timeout_not_unreachable(prometheus, fault_proxy, tmp_path: Path, capsys) -> None:
    proxy = fault_proxy(prometheus.url).always(Fault.hang(30))
    rc, err = audit(capsys, proxy.url, tmp_path / "a.db", "--prometheus-timeout", "1", "--prometheus-retries", "0")
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert "unreachable" not in line
    assert line.startswith(f"gpu-auditor: failed (retryable): Prometheus at {proxy.url} did not answer within 1s")


def test_a_server_side_query_timeout_says_so(prometheus, fault_proxy, tmp_path: Path, capsys) -> None:
    body = b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}'
    proxy = fault_proxy(prometheus.url).always(Fault.status_code(503, body=body))
    rc, err = audit(capsys, proxy.url, tmp_path / "a.db", "--prometheus-retries", "0")
    assert rc == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"gpu-auditor: failed (retryable): Prometheus at {proxy.url} timed out evaluating the query")
    assert "raise --prometheus-timeout" in line
