"""The same series answered twice (an HA pair without deduplication) is counted once and said.

The probe (issue 35): a Prometheus answering every series twice with identical labels made
coverage fall from 1.0 to 0.5 and verdicts flip to ``insufficient_data``, with no warning.
Now the read merges identical label sets per bucket (a sample counted once) and warns once per
selector how many series came twice; coverage and every figure are those of the answer
without the copies, on both read paths (the four aggregates of a window, the raw samples of a
short one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from answer_faults import AnswerProxy
from bed_history import GPUS, NAMES, History, audit, backfill_ten_gpus, jobs_of


@pytest.fixture(scope="module")
def history(testbed) -> History:
    return backfill_ten_gpus(testbed)


def _twice(query: str, doc: dict) -> dict:
    result = doc["data"]["result"]
    doc["data"]["result"] = result + [json.loads(json.dumps(s)) for s in result]
    return doc


@pytest.mark.parametrize("raw", [False, True], ids=["aggregates", "raw"])
def test_every_series_twice_is_counted_once_with_a_warning(
    raw: bool, prometheus, history: History, tmp_path: Path, capsys
) -> None:
    rc, clean, err = audit(capsys, prometheus.url, tmp_path / "clean.db", *history.window(raw), *history.match)
    assert rc == 0, err
    proxy = AnswerProxy(prometheus.url, rewrite=_twice)
    try:
        rc, out, err = audit(capsys, proxy.url, tmp_path / "a.db", *history.window(raw), *history.match)
    finally:
        proxy.close()
    assert rc == 0, err
    jobs = jobs_of(out)
    assert [j["coverage"] for j in jobs] == [1.0] * GPUS
    assert jobs == jobs_of(clean)
    for name in NAMES:
        assert (
            f'warning: {GPUS} series answered twice with identical labels for {name}{{case="{history.case}"}} '
            "(an HA pair without deduplication?): each counted once"
        ) in err
