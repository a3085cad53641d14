"""Benchmark: one audit of N jobs (8 GPUs each) against a real Prometheus, batched vs per-job.

Issue 3's targets: queries per audit independent of N; for the 5-minute window at N = 1,000 the
batched audit >= 10x faster than one query per job; for the 2 h window the auditor's own CPU
<= 25 % of the wall time; peak RSS <= 300 MB at N = 1,000.

History is written straight into a TSDB block by ``bench/tsdbgen`` (Prometheus's own TSDB package,
built from the Go module proxy and cached), then a private Prometheus (the same Debian binary and
flags as the test bed's) is started on it. Each measurement runs in a fresh subprocess so that
peak RSS and CPU time belong to that audit alone. Queries are counted by Prometheus itself
(``prometheus_http_requests_total`` for the query endpoints, before and after).

Usage: ``.venv/bin/python bench/audit_bench.py [--jobs 100,1000] [--out bench/results]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, PrivatePrometheus, log, write_history

GPUS = 8
INTERVAL_S = 30
HISTORY = timedelta(hours=2)
NAMES = (
    "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE|DCGM_FI_PROF_SM_ACTIVE|DCGM_FI_PROF_SM_OCCUPANCY|"
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE|DCGM_FI_PROF_DRAM_ACTIVE|DCGM_FI_DEV_POWER_USAGE|DCGM_FI_DEV_FB_USED|"
    "DCGM_FI_DEV_SM_CLOCK"
)


def measure(mode: str, url: str, namespace: str, jobs: int, start: float, end: float) -> dict:
    """Run one audit in a fresh interpreter and return its own wall, CPU and peak RSS."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, url, namespace, str(jobs), str(start), str(end)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} audit failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(mode: str, url: str, namespace: str, jobs: int, start: float, end: float) -> None:
    """The measured side: a batched audit through the product, or one query per job."""
    window_start = datetime.fromtimestamp(start, timezone.utc)
    window_end = datetime.fromtimestamp(end, timezone.utc)
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "batched":
        from auditor.core.model import Window
        from auditor.correlate import NoKubeResolver
        from auditor.engine import run_audit
        from auditor.sources.prometheus import PrometheusSource

        result = run_audit(
            PrometheusSource(url),
            NoKubeResolver(),
            None,
            Window(window_start, window_end),
            now=window_end,
        )
        found = len([s for s in result.summaries if s.namespace == namespace])
    else:
        # One query per job for all its metrics, as per-job tools do: the job's raw samples over
        # the window, reduced client-side to the same sum/count/min/max the batched audit keeps.
        session = requests.Session()
        rng = f"{int(end - start)}s"
        found = 0
        for j in range(jobs):
            pod = f"job-{j:05d}-0"
            query = f'{{__name__=~"{NAMES}", namespace="{namespace}", pod="{pod}"}}[{rng}]'
            r = session.get(f"{url}/api/v1/query", params={"query": query, "time": end}, timeout=60)
            r.raise_for_status()
            stats = {}
            for series in r.json()["data"]["result"]:
                values = [float(v) for _, v in series["values"]]
                key = (series["metric"]["__name__"], series["metric"].get("UUID"))
                stats[key] = (sum(values), len(values), min(values), max(values))
            found += bool(stats)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak_kb / 1024, "jobs_found": found}))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, url, ns, jobs, start, end = sys.argv[2:8]
        child(mode, url, ns, int(jobs), float(start), float(end))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="100,1000", help="comma-separated job counts")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="where to write results")
    args = ap.parse_args()
    rows = []
    for n in [int(x) for x in args.jobs.split(",")]:
        work = Path(tempfile.mkdtemp(prefix=f"gpa-bench-{n}-"))
        data = work / "data"
        data.mkdir()
        end = int(time.time()) // 300 * 300 - 300  # aligned, safely in the past
        log(f"N={n}: writing {n * GPUS} GPUs x {HISTORY} at {INTERVAL_S}s into a TSDB block")
        t = time.perf_counter()
        write_history(
            data,
            jobs=n,
            gpus=GPUS,
            end=end,
            seconds=int(HISTORY.total_seconds()),
            interval=INTERVAL_S,
            namespace="bench",
        )
        log(f"N={n}: block written in {time.perf_counter() - t:.1f} s; starting Prometheus")
        prom = PrivatePrometheus(data)
        try:
            for label, seconds in (("5m", 300), ("2h", int(HISTORY.total_seconds()))):
                start = end - seconds
                for mode in ("batched", "per-job"):
                    before = prom.query_requests()
                    res = measure(mode, prom.url, "bench", n, start, end)
                    res["queries"] = prom.query_requests() - before
                    res.update({"jobs": n, "window": label, "mode": mode})
                    log(f"N={n} window={label} {mode}: {res}")
                    rows.append(res)
        finally:
            prom.stop()
            shutil.rmtree(work, ignore_errors=True)
    write_results(Path(args.out), rows)
    return 0


def write_results(out: Path, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    machine = f"{platform.node()} ({os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()})"
    (out / f"audit-{day}.json").write_text(json.dumps({"date": day, "machine": machine, "rows": rows}, indent=2))
    lines = [
        f"# Audit benchmark, {day}",
        "",
        f"Machine: {machine}. History: {GPUS} GPUs per job, {HISTORY} at {INTERVAL_S} s, 9 DCGM metrics.",
        "",
        "| jobs | window | mode | queries | wall s | auditor CPU s | CPU/wall | peak RSS MB |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['jobs']} | {r['window']} | {r['mode']} | {r['queries']} | {r['wall_s']:.2f} | "
            f"{r['cpu_s']:.2f} | {r['cpu_s'] / r['wall_s']:.0%} | {r['peak_rss_mb']:.0f} |"
        )
    (out / f"audit-{day}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
