"""A malformed answer is one line naming the server, the call and the selector, never a traceback.

The probes (issue 35): an answer whose ``result`` is ``null`` ended in a ``TypeError``
traceback, one whose ``resultType`` is ``string`` in an ``AttributeError``, a sample value
``"abc"`` in a ``ValueError`` (each exit 1, nothing stored: safe, but not said). Now an answer
that is not a matrix is :class:`~auditor.errors.MalformedAnswer`: a garbled server, retryable
like an unreachable one (exit 1), nothing stored. One series with a sample that is not a
number is left out and named in a warning; the rest of the read goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from answer_faults import AnswerProxy
from bed_history import History, audit, backfill_ten_gpus, error_line, jobs_of, summaries


@pytest.fixture(scope="module")
def history(testbed) -> History:
    return backfill_ten_gpus(testbed)


def _data(value: Any) -> Callable[[str, dict], dict]:
    def rewrite(query: str, doc: dict) -> dict:
        return {**doc, "data": value}

    return rewrite


def _result(value: Any) -> Callable[[str, dict], dict]:
    def rewrite(query: str, doc: dict) -> dict:
        return {**doc, "data": {**doc["data"], "result": value}}

    return rewrite


def _first(**fields: Any) -> Callable[[str, dict], dict]:
    """The answer's last series given these fields (e.g. a ``metric`` that is a list)."""

    def rewrite(query: str, doc: dict) -> dict:
        result = doc["data"]["result"]
        result[-1] = {**result[-1], **fields}
        return doc

    return rewrite


MALFORMED = [
    ("result-null", _result(None), "result is null, not a list of series"),
    ("string", _data({"resultType": "string", "result": [1796300000, "abc"]}), "resultType is 'string', not 'matrix'"),
    ("data-list", _data([]), "data is [], not an object"),
    ("items", _result([1, 2]), "result[0] is int, not a series (metric and values)"),
    ("values-null", _result([{"metric": {}, "values": None}]), "result[0] is"),
    # (found by test_identity_properties.py: the plain body reader took these for label sets)
    ("metric-list", _first(metric=["a"]), "result[9] is"),
    ("values-string", _first(values="abc"), "result[9] is"),
]


@pytest.mark.parametrize("raw", [False, True], ids=["aggregates", "raw"])
@pytest.mark.parametrize("rewrite, says", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_a_malformed_answer_is_one_retryable_line(
    rewrite: Callable, says: str, raw: bool, prometheus, history: History, tmp_path: Path, capsys
) -> None:
    proxy = AnswerProxy(prometheus.url, rewrite=rewrite)
    try:
        rc, _, err = audit(capsys, proxy.url, tmp_path / "a.db", *history.window(raw), *history.match)
    finally:
        proxy.close()
    assert rc == 1
    what = "query" if raw else "query_range"
    line = error_line(err)
    assert line.startswith(f"gpu-auditor: failed (retryable): Prometheus at {proxy.url} answered {what} for DCGM_")
    assert f'{{case="{history.case}"}} with a malformed body: {says}' in line
    assert line.endswith("; nothing of it is stored")
    assert summaries(tmp_path / "a.db") == 0


def test_a_body_that_is_not_json_is_one_retryable_line(prometheus, history: History, tmp_path: Path, capsys) -> None:
    proxy = AnswerProxy(prometheus.url, rewrite=lambda query, doc: b"<html><body>502 Bad Gateway</body></html>")
    try:
        rc, _, err = audit(capsys, proxy.url, tmp_path / "a.db", *history.window(), *history.match)
    finally:
        proxy.close()
    assert rc == 1
    assert error_line(err).startswith(
        f"gpu-auditor: failed (retryable): Prometheus at {proxy.url} failed (query_range, HTTP 200): <html>"
    )


def _abc(query: str, doc: dict) -> dict:
    """The first sample of pod train-3's GPU_UTIL series made "abc"."""
    if "DCGM_FI_DEV_GPU_UTIL{" in query:
        for series in doc["data"]["result"]:
            if series["metric"].get("pod") == "train-3":
                series["values"][0][1] = "abc"
    return doc


@pytest.mark.parametrize("raw", [False, True], ids=["aggregates", "raw"])
def test_a_sample_that_is_not_a_number_leaves_its_series_out_and_says_so(
    raw: bool, prometheus, history: History, tmp_path: Path, capsys
) -> None:
    rc, clean, err = audit(capsys, prometheus.url, tmp_path / "clean.db", *history.window(raw), *history.match)
    assert rc == 0, err
    proxy = AnswerProxy(prometheus.url, rewrite=_abc)
    try:
        rc, out, err = audit(capsys, proxy.url, tmp_path / "a.db", *history.window(raw), *history.match)
    finally:
        proxy.close()
    assert rc == 0, err
    assert (
        "warning: DCGM_FI_DEV_GPU_UTIL series left out, a sample value that is not a number ('abc'): "
        "Hostname=node-0,gpu=3,pod=train-3"
    ) in err
    jobs = {j["job"]: j for j in jobs_of(out)}
    before = {j["job"]: j for j in jobs_of(clean)}
    assert len(jobs) == 10
    assert jobs["Pod/train-3"]["gpu_util"] is None  # missing, never 0
    assert jobs["Pod/train-3"]["sm_active"] == before["Pod/train-3"]["sm_active"]
    del jobs["Pod/train-3"], before["Pod/train-3"]
    assert jobs == before  # the other nine exactly as without the bad series
    assert summaries(tmp_path / "a.db") == 10
