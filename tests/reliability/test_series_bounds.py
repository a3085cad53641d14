"""Bounds on what one read may take: series per answer, series per cycle, memory per range.

The probe (issue 35): a Prometheus, or a proxy in front of one, answering 100,000 series for a
10-GPU window drove the audit to a ``MemoryError`` traceback at 5.7 GB after 60 s; nothing
capped the series of an answer or of a cycle, and nothing said which selector exploded. Now
the series of an answer are counted as its body arrives (auditor/sources/prometheus_client.py),
and the read stops at ``prometheus.max_series_per_answer`` (50,000), at
``prometheus.max_series_per_cycle`` (500,000 across a read's answers) or where the statistics
it would hold pass ``prometheus.max_read_memory_mb`` (2,048): before the rest of the body is
read or any of it decoded, in one line naming the selector (exit 1, nothing stored).
Real bed Prometheus; the flood comes from a proxy in front of it (answer_faults.AnswerProxy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from answer_faults import AnswerProxy
from bed_history import History, audit, backfill_ten_gpus, error_line, jobs_of, settings_file, summaries

from auditor.cli.main import main

#: the child's own peak memory (VmHWM), as test_time_ranges.py measures it
MEASURE = (
    "import sys; from auditor.cli.main import main; rc = main(sys.argv[1:]); "
    "hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')); "
    "print('maxrss_kb', hwm, file=sys.stderr); sys.exit(rc)"
)
FLOOD = 100_000


@pytest.fixture(scope="module")
def history(testbed) -> History:
    return backfill_ten_gpus(testbed)


class Flood:
    """Every query answer made 100,000 series: the real ten, and copies on other GPUs and pods
    (built once, from the first real answer: the read must stop long before it parses one)."""

    def __init__(self) -> None:
        self.body: bytes | None = None
        self.lock = threading.Lock()

    def __call__(self, query: str, doc: dict) -> bytes:
        with self.lock:
            if self.body is None:
                real = doc["data"]["result"]
                parts = [json.dumps(s, separators=(",", ":")) for s in real]
                for i in range(FLOOD - len(real)):
                    s = real[i % len(real)]
                    labels = {**s["metric"], "UUID": f"GPU-flood-{i}", "pod": f"flood-{i}"}
                    parts.append(json.dumps({"metric": labels, "values": s["values"]}, separators=(",", ":")))
                head = b'{"status":"success","data":{"resultType":"matrix","result":['
                self.body = head + ",".join(parts).encode() + b"]}}"
            return self.body


def test_a_100000_series_answer_is_refused_within_its_bound_naming_the_selector(
    prometheus, history: History, tmp_path: Path
) -> None:
    flood = Flood()
    proxy = AnswerProxy(prometheus.url, rewrite=flood)
    try:
        db = tmp_path / "a.db"
        argv = ["audit", "--no-kube", "--prometheus", proxy.url, "--db", f"sqlite:///{db}"]
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-c", MEASURE, *argv, *history.window(), *history.match],
            capture_output=True,
            text=True,
            timeout=300,
            env=os.environ.copy(),
        )
        took = time.monotonic() - t0
    finally:
        proxy.close()
    assert r.returncode == 1, r.stderr
    line = error_line(r.stderr)
    assert line.startswith(f"gpu-auditor: failed: Prometheus at {proxy.url} answered more than 50,000 series for DCGM_")
    assert f'{{case="{history.case}"}} (query_range; prometheus.max_series_per_answer)' in line
    assert "--match" in line and "shards" in line
    assert flood.body is not None and flood.body.count(b'"metric":') == FLOOD
    kb = int(r.stderr.rsplit("maxrss_kb ", 1)[1].split()[0])
    print(
        f"100,000-series answer: refused in {took:.1f} s, peak RSS {kb / 1024:.0f} MB, body {len(flood.body) / 1e6:.0f} MB"
    )
    assert kb < 500 * 1024
    assert summaries(db) == 0


def test_the_bound_per_answer_is_a_setting(prometheus, history: History, tmp_path: Path, capsys) -> None:
    config = settings_file(tmp_path, max_series_per_answer=5)
    rc, _, err = audit(capsys, prometheus.url, tmp_path / "a.db", *history.window(), *history.match, *config)
    assert rc == 1
    assert "answered more than 5 series for DCGM_" in error_line(err)
    # the raw read of a short window is bounded the same (one instant query per name)
    rc, _, err = audit(capsys, prometheus.url, tmp_path / "a.db", *history.window(raw=True), *history.match, *config)
    assert rc == 1
    line = error_line(err)
    assert "answered more than 5 series for DCGM_" in line and "(query; prometheus.max_series_per_answer)" in line
    assert summaries(tmp_path / "a.db") == 0


def test_the_bound_per_cycle_names_the_selector_that_passed_it(
    prometheus, history: History, tmp_path: Path, capsys
) -> None:
    config = settings_file(tmp_path, max_series_per_cycle=25)  # ten GPUs x three names: 30
    rc, _, err = audit(capsys, prometheus.url, tmp_path / "a.db", *history.window(), *history.match, *config)
    assert rc == 1
    line = error_line(err)
    assert "answered more than 25 series in one read, 10 of them for DCGM_" in line
    assert f'{{case="{history.case}"}} (query_range; prometheus.max_series_per_cycle)' in line
    assert summaries(tmp_path / "a.db") == 0


def test_a_read_within_its_bounds_is_unchanged(prometheus, history: History, tmp_path: Path, capsys) -> None:
    rc, out, err = audit(capsys, prometheus.url, tmp_path / "a.db", *history.window(), *history.match)
    assert rc == 0, err
    config = settings_file(tmp_path, max_series_per_cycle=30, max_series_per_answer=10, max_read_memory_mb=1)
    rc, bounded, err = audit(capsys, prometheus.url, tmp_path / "b.db", *history.window(), *history.match, *config)
    assert rc == 0, err
    assert len(jobs_of(out)) == 10
    assert jobs_of(bounded) == jobs_of(out)


def test_memory_per_range_is_checked_before_the_answers_are_held(
    prometheus, history: History, tmp_path: Path, capsys
) -> None:
    """30 days of 5-minute buckets: 8,640 per series, 276 kB of statistics each; 30 series are
    8 MB, past a bound of 1 MiB. The read stops at the answer that passes it."""
    config = settings_file(tmp_path, max_read_memory_mb=1)
    window = ["--start", "now-30d", "--end", "now"]
    rc, _, err = audit(capsys, prometheus.url, tmp_path / "a.db", *window, *history.match, *config)
    assert rc == 1
    line = error_line(err)
    assert line.startswith("gpu-auditor: failed: the read would hold more than 1 MiB of statistics (")
    assert "of them for DCGM_" in line and "prometheus.max_read_memory_mb" in line and "shorter range" in line
    assert summaries(tmp_path / "a.db") == 0


def test_a_body_larger_than_the_memory_bound_is_refused_whatever_its_series(
    prometheus, history: History, tmp_path: Path, capsys
) -> None:
    """Ten series padded to 2 MiB (JSON white space; a gzip bomb decompresses the same way)."""

    def padded(query: str, doc: dict) -> bytes:
        return json.dumps(doc).encode()[:-1] + b" " * (2 << 20) + b"}"

    proxy = AnswerProxy(prometheus.url, rewrite=padded)
    config = settings_file(tmp_path, max_read_memory_mb=1)
    try:
        rc, _, err = audit(capsys, proxy.url, tmp_path / "a.db", *history.window(), *history.match, *config)
    finally:
        proxy.close()
    assert rc == 1
    line = error_line(err)
    assert line.startswith(f"gpu-auditor: failed: Prometheus at {proxy.url} answered query_range for DCGM_")
    assert line.endswith(" with more than 1 MiB (prometheus.max_read_memory_mb); the answer was dropped")
    assert summaries(tmp_path / "a.db") == 0


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("max_series_per_answer", 0, "prometheus.max_series_per_answer: Input should be greater than or equal to 1"),
        ("max_series_per_cycle", -5, "prometheus.max_series_per_cycle: Input should be greater than or equal to 1"),
        ("max_read_memory_mb", "lots", "prometheus.max_read_memory_mb: Input should be a valid integer"),
        ("answer_deadline", "soon", "prometheus.answer_deadline: cannot read duration 'soon'"),
    ],
)
def test_a_bad_bound_is_bad_input(key: str, value: object, says: str, tmp_path: Path, capsys) -> None:
    config = settings_file(tmp_path, **{key: value})
    capsys.readouterr()
    assert main(["explain", "ns/Pod/p", *config]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-auditor: error: {config[1]}: {says}") and len(err.strip().splitlines()) == 1
