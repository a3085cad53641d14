"""The harness itself: each fault of the proxy does what the suite's tests rely on."""

from __future__ import annotations

import time

import pytest
import requests
from conftest import tally
from faultproxy import Fault


def test_passthrough_reaches_the_real_receiver(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url)
    r = requests.post(proxy.url, data=b'{"a": 1}', headers={"X-Key": "k1"}, timeout=5)
    assert r.status_code == 200 and r.text == "ok"
    assert [x.body for x in receiver.requests] == [b'{"a": 1}']
    assert receiver.requests[0].headers["X-Key"] == "k1"
    assert receiver.requests[0].path == "/hook"
    assert proxy.forwarded and proxy.requests[0].fault == "pass"


def test_scripted_statuses_then_default(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).script(Fault.status_code(503, retry_after="1"), Fault.status_code(429))
    proxy.always(Fault.status_code(500))
    answers = [requests.post(proxy.url, data=b"x", timeout=5) for _ in range(3)]
    assert [a.status_code for a in answers] == [503, 429, 500]
    assert answers[0].headers["Retry-After"] == "1"
    assert receiver.requests == [], "a fault answered by the proxy never reaches the receiver"


def test_slow_answer_after_the_receiver_acted(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).script(Fault.slow(1.0))
    t0 = time.monotonic()
    with pytest.raises(requests.Timeout):
        requests.post(proxy.url, data=b"m", timeout=0.3)
    assert time.monotonic() - t0 < 1.0
    time.sleep(0.1)
    assert len(receiver.requests) == 1, "the receiver got the message although the client timed out"


def test_hang_until_released(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).script(Fault.hang())
    with pytest.raises(requests.Timeout):
        requests.post(proxy.url, data=b"m", timeout=0.3)
    proxy.release()
    assert receiver.requests == []


def test_truncated_partial_html_and_reset(fault_proxy, receiver) -> None:
    proxy = fault_proxy(receiver.url).script(Fault.truncate(), Fault.partial(), Fault.html(), Fault.reset())
    with pytest.raises(requests.exceptions.ChunkedEncodingError, match="IncompleteRead"):
        requests.post(proxy.url, data=b"m", timeout=5)  # fewer bytes than Content-Length
    partial = requests.post(proxy.url, data=b"m", timeout=5)
    assert partial.status_code == 200 and partial.text == "o"
    html = requests.post(proxy.url, data=b"m", timeout=5)
    assert html.headers["Content-Type"] == "text/html" and "<html>" in html.text
    with pytest.raises(requests.ConnectionError):
        requests.post(proxy.url, data=b"m", timeout=5)


class _Report:
    def __init__(self, nodeid: str, when: str, outcome: str) -> None:
        self.nodeid, self.when, self.outcome = nodeid, when, outcome
        self.keywords: dict = {}

    failed = property(lambda self: self.outcome == "failed")
    skipped = property(lambda self: self.outcome == "skipped")
    passed = property(lambda self: self.outcome == "passed")


def test_summary_counts_held_only_when_every_phase_passed() -> None:
    a, b, c = "tests/reliability/test_a.py::t", "tests/reliability/test_b.py::t", "tests/reliability/test_c.py::t"
    reports = [
        _Report(a, "setup", "passed"),
        _Report(a, "call", "passed"),
        _Report(a, "teardown", "passed"),
        _Report(b, "call", "passed"),
        _Report(b, "teardown", "failed"),
        _Report(c, "setup", "skipped"),
        _Report("tests/other/test_x.py::t", "call", "passed"),
    ]
    assert tally(reports) == {a: True, b: False, c: False}  # type: ignore[arg-type]
