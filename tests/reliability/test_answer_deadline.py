"""One answer has one deadline, however its body arrives.

The probe (issue 35): a truncated answer whose Content-Length lies (fewer bytes sent than it
promises, the connection then held open) took 131 s to end as "unreachable: timed out": the
read timeout bounds each read, not the answer, and a body that trickles in resets it with
every byte. Now ``prometheus.answer_deadline`` (default: ``prometheus.timeout`` + 30 s) bounds
the whole answer, headers and body: a watchdog shuts the connection down when it passes, and
the audit ends in one retryable line (exit 1), nothing stored. A body that breaks off (the
connection closed short of its Content-Length) is said to be one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from answer_faults import PASS, AnswerProxy, hold, trickle
from bed_history import History, audit, backfill_ten_gpus, error_line, settings_file, summaries
from faultproxy import Fault

DEADLINE = 3.0
#: what the deadline may be passed by: the watchdog's wake-up and the error's way out, on a
#: shared machine at load ~10
SLACK = 2.5


@pytest.fixture(scope="module")
def history(testbed) -> History:
    return backfill_ten_gpus(testbed)


@pytest.mark.parametrize("fault", [hold(keep=0.5, seconds=120), trickle(every=0.5)], ids=["lying-length", "trickle"])
@pytest.mark.parametrize("raw", [False, True], ids=["aggregates", "raw"])
def test_an_answer_that_never_ends_ends_at_its_deadline(
    fault: Fault, raw: bool, prometheus, history: History, tmp_path: Path, capsys
) -> None:
    proxy = AnswerProxy(prometheus.url)
    proxy.script(PASS, PASS).always(fault)  # buildinfo and the names pass; every query meets the fault
    config = settings_file(tmp_path, answer_deadline=f"{DEADLINE:g}s", timeout="60s")
    try:
        rc, _, err = audit(capsys, proxy.url, tmp_path / "a.db", *history.window(raw), *history.match, *config)
        ended = time.monotonic()
    finally:
        proxy.close()
    assert rc == 1
    what = "query" if raw else "query_range"
    assert error_line(err) == (
        f"gpu-auditor: failed (retryable): Prometheus at {proxy.url} did not send its whole answer ({what}) "
        f"within {DEADLINE:g}s (prometheus.answer_deadline); the answer was dropped"
    )
    faulted = [r.at for r in proxy.requests if r.fault == fault.kind]
    assert faulted
    # every query met the fault, and the last one asked ended within its deadline
    assert ended - max(faulted) < DEADLINE + SLACK, ended - max(faulted)
    assert summaries(tmp_path / "a.db") == 0


def test_a_body_cut_short_is_said_to_be(prometheus, history: History, tmp_path: Path, capsys) -> None:
    proxy = AnswerProxy(prometheus.url)
    proxy.script(PASS, PASS).always(Fault.truncate(0.5))
    try:
        rc, _, err = audit(capsys, proxy.url, tmp_path / "a.db", *history.window(), *history.match)
    finally:
        proxy.close()
    assert rc == 1
    line = error_line(err)
    assert line.startswith(
        f"gpu-auditor: failed (retryable): Prometheus at {proxy.url} broke off its answer (query_range): "
    )
    assert "IncompleteRead(" in line
    assert summaries(tmp_path / "a.db") == 0
